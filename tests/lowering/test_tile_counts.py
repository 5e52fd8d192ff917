"""Tile skipping: the forward kernel visits exactly the non-empty (q block, kv block) tiles.

Programs are compiled with `lower-to-tile{count-tiles=true}`; `fn.count_tiles(*args)`
returns how many KV tiles all programs visited together. The test computes the expected
number from the mask's definition (a boolean keep[b, h, q, kv] built here with torch, not
by the compiler or the reference): the tiles of block-m x block-n (16 x 16) holding at
least one kept in-bounds element, summed over batch, heads and q blocks. Static masks
(causal, windows, prefix-lm, affine custom predicates) are planned at compile time; data-
dependent ones (document ids, other predicates) through the runtime block map, which must
give the same exact count. The numbers are checked against the reference as well.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from programs import BLOCK, Builder, Program, compile_program

from attnfuse import reference
from attnfuse.testing import assert_close

HQ, HKV, D = 2, 1, 16


Keep = Callable[
    [list[Any], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
"""(args, b, h, q, kv) -> bool tensor broadcast to [B, H, Sq, Skv]."""


def expected_tiles(
    keep: torch.Tensor, block_m: int = BLOCK, block_n: int = BLOCK
) -> int:
    """Number of (b, h, q block, kv block) tiles of `keep` ([B, H, Sq, Skv]) with a kept element."""
    b, h, sq, skv = keep.shape
    nq, nk = -(-sq // block_m), -(-skv // block_n)
    padded = torch.zeros(b, h, nq * block_m, nk * block_n, dtype=torch.bool)
    padded[:, :, :sq, :skv] = keep
    tiles = padded.view(b, h, nq, block_m, nk, block_n).any(dim=5).any(dim=3)
    return int(tiles.sum())


def grid(b: int, h: int, sq: int, skv: int) -> tuple[torch.Tensor, ...]:
    return (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(sq).view(1, 1, sq, 1),
        torch.arange(skv).view(1, 1, 1, skv),
    )


def run_count(
    p: Program,
    keep_fn: Keep,
    sq: int,
    skv: int,
    *,
    batch: int = 2,
    seed: int = 0,
    block_m: int = BLOCK,
    block_n: int = BLOCK,
) -> None:
    args = p.inputs(batch, sq, skv, seed)
    fn = compile_program(
        p.text, "fused", count_tiles=True, block_m=block_m, block_n=block_n
    )
    b, h, q, kv = grid(batch, HQ, sq, skv)
    keep = keep_fn(args, b, h, q, kv).expand(batch, HQ, sq, skv)
    want = expected_tiles(keep, block_m, block_n)
    got = fn.count_tiles(*args)
    total = expected_tiles(torch.ones_like(keep), block_m, block_n)
    assert got == want, f"visited {got} tiles, {want} are non-empty (of {total})"
    out = fn(*args)
    assert_close(out, reference.run(p.text, *args))


def builder() -> Builder:
    return Builder(hq=HQ, hkv=HKV, d=D)


SHAPES = [(37, 37), (29, 45), (45, 29)]


@pytest.mark.parametrize("sq,skv", SHAPES)
def test_no_mask(sq: int, skv: int) -> None:
    run_count(
        builder().build(),
        lambda a, b, h, q, kv: torch.ones(1, 1, 1, 1, dtype=torch.bool),
        sq,
        skv,
    )


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("sq,skv", SHAPES)
def test_causal(sq: int, skv: int, align: str) -> None:
    shift = skv - sq if align == "bottom_right" else 0
    run_count(
        builder().mask("causal", align=align).build(),
        lambda a, b, h, q, kv: kv <= q + shift,
        sq,
        skv,
    )


WINDOWS: dict[str, tuple[int | None, int | None]] = {
    "left": (5, None),
    "left_narrow": (2, None),
    "right": (None, 7),
    "both": (20, 3),
    "diagonal": (0, 0),
}


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("sq,skv", SHAPES)
@pytest.mark.parametrize("window", list(WINDOWS))
def test_sliding_window(
    window: str, sq: int, skv: int, align: str, request: pytest.FixtureRequest
) -> None:
    if sq == skv and align == "bottom_right":
        pytest.skip("same as top_left when Sq == Skv")
    left, right = WINDOWS[window]
    shift = skv - sq if align == "bottom_right" else 0

    def keep(a: Any, b: Any, h: Any, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        k = torch.ones_like(q + kv, dtype=torch.bool)
        if left is not None:
            k = k & (kv >= q + shift - left)
        if right is not None:
            k = k & (kv <= q + shift + right)
        return k

    options = {k: v for k, v in (("left", left), ("right", right)) if v is not None}
    run_count(
        builder().mask("sliding_window", align=align, **options).build(), keep, sq, skv
    )


@pytest.mark.parametrize("sq,skv", [(45, 45), (29, 45)])
def test_causal_and_window(sq: int, skv: int) -> None:
    p = builder().mask("causal").mask("sliding_window", left=17).build()
    run_count(p, lambda a, b, h, q, kv: (kv <= q) & (kv >= q - 17), sq, skv)


@pytest.mark.parametrize("prefix", [0, 5, 20, 33, 100])
def test_prefix_lm_static(prefix: int) -> None:
    p = builder().mask("prefix_lm", prefix=prefix).build()
    run_count(p, lambda a, b, h, q, kv: (kv <= q) | (kv < prefix), 45, 45)


@pytest.mark.parametrize("sq,skv", [(45, 45), (29, 45)])
def test_prefix_lm_operand(sq: int, skv: int) -> None:
    bld = builder()
    plen = bld.prefix_lengths()
    p = bld.mask("prefix_lm", plen).build()
    run_count(
        p,
        lambda a, b, h, q, kv: (kv <= q) | (kv < a[3].long().view(-1, 1, 1, 1)),
        sq,
        skv,
        seed=4,
    )


@pytest.mark.parametrize("docs", [1, 3, 8])
def test_document(docs: int) -> None:
    bld = builder()
    ids = bld.doc_ids(docs=docs)
    p = bld.mask("document", ids).build()

    def keep(a: Any, b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
        d = a[3].long()
        return d[:, None, :, None] == d[:, None, None, :]

    run_count(p, keep, 45, 45, seed=docs)


def test_document_two_operands() -> None:
    bld = builder()
    qids = bld.doc_ids("qdoc", seq="q", docs=2)
    kids = bld.doc_ids("kdoc", seq="kv", docs=2)
    p = bld.mask("document", qids, kids).build()

    def keep(a: Any, b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
        return a[3].long()[:, None, :, None] == a[4].long()[:, None, None, :]

    run_count(p, keep, 29, 45, seed=1)


def test_document_causal() -> None:
    bld = builder()
    ids = bld.doc_ids(docs=3)
    p = bld.mask("causal").mask("document", ids).build()

    def keep(a: Any, b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
        d = a[3].long()
        return (d[:, None, :, None] == d[:, None, None, :]) & (kv <= q)

    run_count(p, keep, 45, 45, seed=2)


def test_custom_affine() -> None:
    """`q - kv <= 5 and kv <= q`: analysed into a band at compile time."""
    body = """
        %d$ = arith.subi %q$, %kv$ : index
        %c5$ = arith.constant 5 : index
        %a$ = arith.cmpi sle, %d$, %c5$ : index
        %b2$ = arith.cmpi sge, %q$, %kv$ : index
        %keep$ = arith.andi %a$, %b2$ : i1
        attn.yield %keep$ : i1
    """
    run_count(
        builder().custom_mask(body).build(),
        lambda a, b, h, q, kv: (q - kv <= 5) & (kv <= q),
        45,
        45,
    )


def test_custom_per_head() -> None:
    """`kv <= q - 20 * h`: non-affine in the analysis (uses h), runtime block map per head."""
    body = """
        %c$ = arith.constant 20 : index
        %o$ = arith.muli %h$, %c$ : index
        %w$ = arith.subi %q$, %o$ : index
        %keep$ = arith.cmpi sle, %kv$, %w$ : index
        attn.yield %keep$ : i1
    """
    run_count(
        builder().custom_mask(body).build(),
        lambda a, b, h, q, kv: kv <= q - 20 * h,
        45,
        45,
    )


def test_custom_rows_only() -> None:
    """Whole q blocks without a kept key are not visited at all."""
    body = """
        %c20$ = arith.constant 20 : index
        %keep$ = arith.cmpi sge, %q$, %c20$ : index
        attn.yield %keep$ : i1
    """
    run_count(
        builder().custom_mask(body).build(),
        lambda a, b, h, q, kv: (q >= 20) & (kv >= 0),
        45,
        45,
    )


_PRED = {
    "slt": operator.lt,
    "sle": operator.le,
    "sgt": operator.gt,
    "sge": operator.ge,
    "eq": operator.eq,
}


@pytest.mark.parametrize("c", [-3, 4])
@pytest.mark.parametrize("form", ["kv-q", "q-kv", "q+c_vs_kv"])
@pytest.mark.parametrize("pred", list(_PRED))
def test_custom_band_forms(
    pred: str, form: str, c: int, request: pytest.FixtureRequest
) -> None:
    """Every comparison of kv - q with a constant, written three ways: an exact band
    (45 queries, 37 keys, so some q blocks' bands start past the last key)."""
    f = _PRED[pred]
    if form == "kv-q":
        lhs, rhs, pre = "%d$", "%c$", "%d$ = arith.subi %kv$, %q$ : index"
        keep: Keep = lambda a, b, h, q, kv: f(kv - q, c)
    elif form == "q-kv":
        lhs, rhs, pre = "%d$", "%c$", "%d$ = arith.subi %q$, %kv$ : index"
        keep = lambda a, b, h, q, kv: f(q - kv, c)
    else:
        lhs, rhs, pre = "%d$", "%kv$", "%d$ = arith.addi %q$, %c$ : index"
        keep = lambda a, b, h, q, kv: f(q + c, kv)
    body = f"""
        %c$ = arith.constant {c} : index
        {pre}
        %keep$ = arith.cmpi {pred}, {lhs}, {rhs} : index
        attn.yield %keep$ : i1
    """
    run_count(builder().custom_mask(body).build(), keep, 45, 37)


@pytest.mark.parametrize("block_m,block_n", [(32, 16), (16, 32)])
@pytest.mark.parametrize("mask", ["causal_br", "window", "prefix", "document"])
def test_block_sizes(mask: str, block_m: int, block_n: int) -> None:
    """block-m != block-n: the bounds of the walk, and the block map, per q block."""
    bld = builder()
    if mask == "causal_br":
        bld.mask("causal", align="bottom_right")
        keep: Keep = lambda a, b, h, q, kv: kv <= q + 8
    elif mask == "window":
        bld.mask("sliding_window", left=6, right=20)
        keep = lambda a, b, h, q, kv: (kv >= q - 6) & (kv <= q + 20)
    elif mask == "prefix":
        bld.mask("prefix_lm", prefix=19)
        keep = lambda a, b, h, q, kv: (kv <= q) | (kv < 19)
    else:
        ids = bld.doc_ids(docs=3)
        bld.mask("document", ids)
        keep = lambda a, b, h, q, kv: (
            a[3].long()[:, None, :, None] == a[3].long()[:, None, None, :]
        )
    run_count(
        bld.build(),
        keep,
        45 if mask == "document" else 37,
        45,
        block_m=block_m,
        block_n=block_n,
        seed=6,
    )


def test_mask_before_softcap_visits_all() -> None:
    """Masked logits become -cap after a softcap: no tile is empty, all are visited."""
    p = builder().mask("causal").softcap(3.0).build()
    run_count(
        p, lambda a, b, h, q, kv: torch.ones(1, 1, 1, 1, dtype=torch.bool), 37, 37
    )


def test_mask_after_softcap_skips() -> None:
    p = builder().softcap(3.0).mask("causal").build()
    run_count(p, lambda a, b, h, q, kv: kv <= q, 37, 37)


def test_count_needs_option() -> None:
    p = builder().build()
    fn = compile_program(p.text, "fused")
    with pytest.raises(ValueError, match="count-tiles"):
        fn.count_tiles(*p.inputs(1, 5, 5))


def test_expected_tiles_helper() -> None:
    keep = torch.zeros(1, 1, 37, 37, dtype=torch.bool)
    keep[0, 0, 0, 0] = True
    keep[0, 0, 36, 36] = True
    assert expected_tiles(keep) == 2
    assert expected_tiles(torch.ones(2, 3, 37, 37, dtype=torch.bool)) == 2 * 3 * 9
    causal = torch.ones(32, 32, dtype=torch.bool).tril().view(1, 1, 32, 32)
    assert expected_tiles(causal) == 3
