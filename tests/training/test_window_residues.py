"""Sliding windows and diagonal offsets at tile-boundary residues, forward and gradients.

With 16 x 16 tiles, a window side of 1, 15, 17 or 31 keys (1 or 15 mod 16) puts the band's
edge one key inside or outside a tile boundary, and `Skv - Sq` of 15, 17 or 21 moves the
bottom-right diagonal off the tile grid: an off-by-one in a band bound (tile skipping,
loop bounds, the in-tile mask, the backward's KV-block range) changes which keys a row
sees, which these outputs and gradients detect (Sq = 29, Skv = 50 and the reverse).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from programs import Builder, check
from test_gradients_blocks import grad_check

# Top-left bands with fewer queries than keys are the point of some cases here; the
# runtime's warning about them (tests/runtime/test_plans.py) is expected.
pytestmark = pytest.mark.filterwarnings("ignore:.*aligned top-left with:UserWarning")

WINDOWS: dict[str, dict[str, int]] = {
    "left1": {"left": 1},
    "left15": {"left": 15},
    "right1": {"right": 1},
    "right15": {"right": 15},
    "left15_right1": {"left": 15, "right": 1},
    "left17_right15": {"left": 17, "right": 15},
    "left31_right0": {"left": 31, "right": 0},
}
SHAPES = [(29, 50), (50, 29)]


def _window(window: dict[str, int], align: str, causal: bool = False) -> Builder:
    b = Builder(hq=2, hkv=1, d=32)
    if causal:
        b.mask("causal", align=align)
    return b.mask("sliding_window", align=align, **window)


@pytest.mark.parametrize("sq,skv", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("name", list(WINDOWS))
def test_window_forward(name: str, align: str, sq: int, skv: int) -> None:
    check(_window(WINDOWS[name], align).build(lse=True), q_len=sq, kv_len=skv)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("name", ["left1", "left15", "right15", "left17_right15"])
def test_window_gradients(name: str, align: str) -> None:
    grad_check(_window(WINDOWS[name], align).build(), q_len=29, kv_len=50)


@pytest.mark.parametrize("name", ["right1", "left15_right1"])
def test_window_gradients_q_longer(name: str) -> None:
    grad_check(_window(WINDOWS[name], "bottom_right").build(), q_len=50, kv_len=29)


@pytest.mark.parametrize("skv", [44, 46, 50])  # Skv - Sq = 15, 17, 21
def test_diagonal_offset_causal_window(skv: int) -> None:
    """Bottom-right causal plus a 15-key window: the diagonal at offset 15, 17 or 21."""
    p = _window({"left": 15}, "bottom_right", causal=True).build(sinks=True)
    check(p, q_len=29, kv_len=skv, check_lse=True)
    grad_check(p, q_len=29, kv_len=skv)


@pytest.mark.parametrize("skv", [44, 46])
def test_diagonal_offset_causal(skv: int) -> None:
    p = Builder(hq=2, hkv=1, d=32).mask("causal", align="bottom_right").build()
    check(p, q_len=29, kv_len=skv, check_lse=True)
    grad_check(p, q_len=29, kv_len=skv)


# One compiled program, the bottom-right diagonal swept over every residue mod 16: the
# band's edges cross the tile grid at every offset, so a band bound off by one in the tile
# plan (first or last visited tile, first or last full tile, the backward's q range)
# changes some row's visible keys.
SWEEP = range(29, 29 + 16)


@pytest.mark.parametrize("name", ["left15", "right15", "left17_right15"])
def test_window_forward_diagonal_sweep(name: str) -> None:
    p = _window(WINDOWS[name], "bottom_right").build(lse=True)
    for skv in SWEEP:
        check(p, q_len=29, kv_len=skv, seed=skv)


def test_window_gradients_diagonal_sweep() -> None:
    p = _window(WINDOWS["left15_right1"], "bottom_right").build()
    for skv in SWEEP:
        grad_check(p, q_len=29, kv_len=skv, seed=skv)
