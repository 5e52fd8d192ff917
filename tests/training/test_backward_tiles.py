"""Tile skipping in the backward: the dQ and dK/dV kernels visit exactly the non-empty
(q block, kv block) tiles.

Programs are compiled with `lower-backward{count-tiles=true}`; `fn.count_backward_tiles`
returns the tiles the dQ and dK/dV kernels visited together. Both walk every non-empty
tile once per query head (dK/dV loops over the query heads of its GQA group), so the
expected count is twice `expected_tiles` of the mask (a boolean keep[b, h, q, kv] built
here with torch). Data-dependent masks reach the dK/dV kernel through the transposed
block map; `dkdv-block-map=false` (the ablation) walks the whole band instead. Every
case also checks the gradients against the float64 reference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from programs import Builder, Program
from test_tile_counts import Keep, expected_tiles, grid

import attnfuse
from attnfuse import reference
from attnfuse.testing import assert_grad_close

HQ, HKV, D = 2, 1, 16
BLOCK = 16


def pipeline(*options: str) -> str:
    extra = " ".join(("count-tiles=true", *options))
    return (
        "attn-canonicalize,rope-fusion{strategy=separate},online-softmax,"
        f"mask-tiling{{block-m={BLOCK} block-n={BLOCK}}},"
        f"lower-backward{{block-m={BLOCK} block-n={BLOCK} {extra}}},lower-to-tile"
    )


def count_and_check(p: Program, keep_fn: Keep, sq: int, skv: int, *options: str, seed: int = 0) -> tuple[int, int]:
    """(visited, 2 x non-empty tiles); the gradients are checked against the reference."""
    fn = attnfuse.compile(p.text, pipeline=pipeline(*options))
    args = p.inputs(2, sq, skv, seed)
    b, h, q, kv = grid(2, HQ, sq, skv)
    want = 2 * expected_tiles(keep_fn(args, b, h, q, kv).expand(2, HQ, sq, skv), BLOCK, BLOCK)
    got = fn.count_backward_tiles(*args)

    leaves = [a.detach().clone().requires_grad_(True) if i < 3 else a for i, a in enumerate(args)]
    refs = [a.detach().double().requires_grad_(True) if i < 3 else a for i, a in enumerate(args)]
    g = torch.randn(2, HQ, sq, D, generator=torch.Generator().manual_seed(seed + 7))
    fn(*leaves).backward(g)
    reference.run(p.text, *refs).backward(g.double())
    for name, leaf, ref in zip("qkv", leaves[:3], refs[:3]):
        assert_grad_close(leaf.grad, ref.grad, torch.float32, f"d{name}")
    return got, want


def builder() -> Builder:
    return Builder(hq=HQ, hkv=HKV, d=D, dtype="f32")


def document_causal(docs: int) -> tuple[Program, Keep]:
    bld = builder()
    ids = bld.doc_ids(docs=docs)
    p = bld.mask("causal").mask("document", ids).build()

    def keep(a: Any, b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
        d = a[3].long()
        return (d[:, None, :, None] == d[:, None, None, :]) & (kv <= q)

    return p, keep


@pytest.mark.parametrize("docs", [1, 4])
@pytest.mark.parametrize("sq", [45, 64])
def test_document_causal(docs: int, sq: int) -> None:
    p, keep = document_causal(docs)
    got, want = count_and_check(p, keep, sq, sq, seed=docs)
    assert got == want


def test_document_ablation_walks_the_band() -> None:
    """`dkdv-block-map=false`: the dK/dV kernel visits every q block of the causal band."""
    p, keep = document_causal(4)
    got, want = count_and_check(p, keep, 64, 64, "dkdv-block-map=false", seed=4)
    band = expected_tiles(torch.ones(64, 64, dtype=torch.bool).tril().view(1, 1, 64, 64), BLOCK, BLOCK)
    assert got == want // 2 + 2 * HQ * band  # dQ exact, dK/dV the band of both batch rows


def test_custom_per_head() -> None:
    """A predicate that reads the head: one transposed map per query head."""
    body = """
        %c$ = arith.constant 20 : index
        %o$ = arith.muli %h$, %c$ : index
        %w$ = arith.subi %q$, %o$ : index
        %keep$ = arith.cmpi sle, %kv$, %w$ : index
        attn.yield %keep$ : i1
    """
    got, want = count_and_check(builder().custom_mask(body).build(), lambda a, b, h, q, kv: kv <= q - 20 * h, 45, 45)
    assert got == want


def test_document_two_operands_rectangular() -> None:
    bld = builder()
    qids = bld.doc_ids("qdoc", seq="q", docs=2)
    kids = bld.doc_ids("kdoc", seq="kv", docs=2)
    p = bld.mask("document", qids, kids).build()
    got, want = count_and_check(
        p, lambda a, b, h, q, kv: a[3].long()[:, None, :, None] == a[4].long()[:, None, None, :], 29, 45, seed=1)
    assert got == want


def test_causal_band() -> None:
    """Planned masks: both kernels walk the band, exactly the non-empty tiles."""
    got, want = count_and_check(builder().mask("causal").build(), lambda a, b, h, q, kv: kv <= q, 45, 45)
    assert got == want
