"""Q and K with RoPEs of different style or rotary_dim, under every rope-fusion strategy.

The kernel rotates Q and K in one column layout, so `rope-fusion{strategy=fused}` moves
K's transforms to a pre-kernel for such programs (Q's when K's are pinned to the kernel)
instead of letting lower-to-tile / lower-backward fail (docs/passes.md). Forward outputs
and gradients are compared with the float64 reference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from xdsl.utils.exceptions import DiagnosticException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from programs import STRATEGIES, Builder, check, compile_program
from test_gradients_blocks import grad_check

from attnfuse.pass_manager import PassManager, make_context
from attnfuse.reference import parse_program

MISMATCHES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "style": ({"style": "interleaved"}, {}),
    "rotary_dim": ({"rotary_dim": 16}, {"rotary_dim": 24}),
    "both": ({"style": "interleaved", "rotary_dim": 8}, {"rotary_dim": 32}),
}


def _mismatched(name: str, **kw: Any) -> Builder:
    q_opts, k_opts = MISMATCHES[name]
    b = Builder(hq=2, hkv=1, d=32, **kw)
    return b.rope("q", **q_opts).rope("k", **k_opts)


def _placements(text: str, pipeline: str) -> list[str]:
    module = parse_program(text)
    PassManager(pipeline).run(module, make_context())
    return [op.str_option("placement") for op in module.walk() if op.name in ("attn.rope", "attn.qk_norm")]


def test_fused_moves_k_to_prekernel() -> None:
    p = _mismatched("style").qk_norm("k", weight="f32").mask("causal").build()
    # q's rope; k's rope then k's norm (program order): k's side goes to the pre-kernel.
    assert _placements(p.text, "rope-fusion{strategy=fused}") == ["kernel", "prekernel", "prekernel"]


def test_fused_same_layout_stays_fused() -> None:
    p = Builder(hq=2, hkv=1, d=32).rope(rotary_dim=16).mask("causal").build()
    assert _placements(p.text, "rope-fusion{strategy=fused}") == ["kernel", "kernel"]


def test_k_pinned_to_kernel_moves_q() -> None:
    p = _mismatched("rotary_dim").mask("causal").build()
    text = p.text.replace("rotary_dim = 24}", 'rotary_dim = 24, placement = "kernel"}')
    assert _placements(text, "rope-fusion{strategy=fused}") == ["prekernel", "kernel"]
    check_text = type(p)(text, p.name, p.args)
    check(check_text, strategy="fused", q_len=29, kv_len=45)
    grad_check(check_text, strategy="fused", q_len=29, kv_len=45)


def test_both_pinned_is_a_clear_error() -> None:
    p = _mismatched("style").mask("causal").build()
    text = p.text.replace("}", ', placement = "kernel"}', 1)
    text = text.replace(" : tensor<?x1x?x32xf32>\n  %s", ' {placement = "kernel"} : tensor<?x1x?x32xf32>\n  %s', 1)
    assert text.count('placement = "kernel"') == 2, text
    with pytest.raises(DiagnosticException, match="must share style and rotary_dim"):
        compile_program(text, "fused")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", list(MISMATCHES))
def test_forward(name: str, strategy: str) -> None:
    p = _mismatched(name).mask("causal", align="bottom_right").build(lse=True)
    check(p, strategy=strategy, q_len=29, kv_len=45)


@pytest.mark.parametrize("name", list(MISMATCHES))
def test_gradients_fused(name: str) -> None:
    b = _mismatched(name, dtype="f16").qk_norm("q", weight="f32")
    grad_check(b.mask("causal").build(sinks=True), strategy="fused", q_len=29, kv_len=45)
