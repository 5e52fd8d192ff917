"""Split-KV decoding (`split-kv`, `attnfuse/lowering/split_kv.py`) through the interpreter.

A few new queries (Sq = 1, 4, 16) against longer KV caches, bottom-right causal unless a
test says otherwise; the query heads of a GQA group (1, 4, 8) are packed into one tile.
Key counts are not multiples of the 16-key block nor of the split size (1, 37, 100 keys
make 1, 3 and 7 blocks: one, two and four splits). Every output is compared with the
float64 reference within PyTorch's own error in the same dtype, and the lse with the
reference's to fp32 precision (`split_kv_check.check_decode`); each test also checks that
the split kernel served the call (or, where a test says so, the usual forward kernel).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import torch
from programs import Builder, Program
from split_kv_check import check_decode, compile_split, launches, split_grid

import attnfuse
from attnfuse import reference
from attnfuse.backends.triton.metadata import KernelMetadata
from attnfuse.dialects.host import LaunchOp
from attnfuse.lowering.split_combine import merge_rows_limit
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.reference import parse_program
from attnfuse.analysis.split_kv import WIDE_MIN_BLOCKS
from attnfuse.lowering.split_host import (
    PERSISTENT_MAX_BLOCKS,
    PERSISTENT_MIN_PROGRAMS_PER_SM,
    PERSISTENT_PROGRAMS_PER_SM,
)
from attnfuse.runtime.host import INTERPRETER_SM_COUNT, call_signature
from attnfuse.testing import assert_grad_close

BR = {"align": "bottom_right"}
GROUPS = {1: (2, 2), 4: (8, 2), 8: (8, 1)}


def causal(hq: int = 8, hkv: int = 2, d: int = 32, dtype: str = "f16", **kw: Any) -> Builder:
    return Builder(hq=hq, hkv=hkv, d=d, dtype=dtype, **kw)


# ============================================================================ shapes


@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("q_len", [1, 4, 16])
def test_decode_shapes(q_len: int, group: int, dtype: str) -> None:
    """16 queries of every head of a group in one tile (`rows = 16 * group`; by default
    f32 tiles stop at 32 rows, which only registers on a GPU require). One batch entry:
    the interpreter runs a program per (batch entry, KV head, split), and the batch
    offsets of the split and combine kernels are checked at B = 2 by every other test."""
    hq, hkv = GROUPS[group]
    p = causal(hq, hkv, 64, dtype).mask("causal", **BR).build()
    for kv_len in (1, 37, 100):
        check_decode(p, 1, q_len, kv_len, seed=kv_len, options=f"rows={16 * group}")


def test_more_queries_than_a_tile_run_the_forward_kernel() -> None:
    """17 queries x 4 heads exceed the 64 packed rows: the usual kernel, same program."""
    p = causal().mask("causal", **BR).build()
    check_decode(p, 2, 17, 40, split=False)
    check_decode(p, 1, 16, 40)


def test_more_queries_than_keys() -> None:
    """Bottom-right with Sq > Skv: the first rows see no key (out 0, lse -inf)."""
    p = causal().mask("causal", **BR).build()
    _, lse = check_decode(p, 2, 6, 3)
    assert torch.isneginf(lse[:, :, :3]).all()


def test_different_value_head_dim() -> None:
    p = Builder(hq=4, hkv=2, d=32, dv=48, dtype="f16").mask("causal", **BR).build()
    check_decode(p, 2, 4, 70)


# ============================================================================ Q/K transforms


def _cache_positions(rank: int) -> Any:
    """Positions `Skv - Sq + i` of the new queries ([Sq] or [B, Sq])."""
    def gen(g: torch.Generator, b: int, sq: int, skv: int) -> torch.Tensor:
        pos = torch.arange(skv - sq, skv, dtype=torch.int32)
        return pos if rank == 1 else pos.repeat(b, 1)

    return gen


@pytest.mark.parametrize("strategy", ["fused", "hybrid", "separate"])
@pytest.mark.parametrize("rank", [1, 2])
def test_rope_on_new_queries_at_cache_offset(rank: int, strategy: str) -> None:
    """The cache holds rotated keys; the new queries are rotated at positions Skv - Sq + i."""
    b = causal()
    pos = b.arg("pos", "tensor<?xi32>" if rank == 1 else "tensor<?x?xi32>", _cache_positions(rank))
    p = b.rope("q", positions=pos, theta=10000.0).mask("causal", **BR).build()
    for q_len, kv_len in ((1, 45), (4, 37)):
        check_decode(p, 2, q_len, kv_len, strategy=strategy, exact_lse=False)


@pytest.mark.parametrize("strategy", ["fused", "hybrid"])
def test_rope_on_both_sides(strategy: str) -> None:
    """Q at the cache offset, K at its own positions; `fused` rotates each K tile in the
    split kernel, `hybrid` in a pre-kernel."""
    b = causal()
    qpos = b.arg("qpos", "tensor<?x?xi32>", _cache_positions(2))
    kpos = b.positions(1, name="kpos", seq="kv")
    b.rope("q", positions=qpos, style="interleaved").rope("k", positions=kpos, style="interleaved")
    p = b.mask("causal", **BR).build()
    check_decode(p, 2, 4, 45, strategy=strategy, exact_lse=False)


def test_rope_static_offset_and_qk_norm() -> None:
    """Qwen3-style QK-norm then RoPE on both sides, positions index + offset."""
    p = causal().qk_norm(weight="f32").rope(offset=7, theta=1000000.0).mask("causal", **BR).build()
    check_decode(p, 2, 4, 37, exact_lse=False)


def test_decode_calls_run_no_rope_table() -> None:
    """The split kernels evaluate the queries' cos/sin themselves: a decode call of a
    program rotating Q at given positions runs no table kernel, its prefill calls do
    (the forward kernel reads the table; a table without a positions operand is built
    once per launch plan instead, and one Q shares with K is read by the split kernel's
    K tiles: `test_rope_static_offset_and_qk_norm`)."""
    b = causal()
    pos = b.arg("pos", "tensor<?x?xi32>", _cache_positions(2))
    program = b.rope("q", positions=pos, theta=10000.0).mask("causal", **BR).build()
    fn = compile_split(program.text, "fused", "")
    for q_len, table in ((1, False), (4, False), (40, True)):
        args = program.inputs(2, q_len, 45, 0)
        fn(*args)
        ran = launches(fn, args)
        assert any("rope_table" in name for name in ran) == table, (q_len, ran)


# ============================================================================ score ops


def _score_mod_program() -> Program:
    """A per-head table times the distance: reads h, q_idx and kv_idx."""
    b = causal()
    tab = b.table("tab", 8)
    b.score_mod(
        """
        %w$ = tensor.extract %c0$[%h$] : tensor<8xf32>
        %d$ = arith.subi %kv$, %q$ : index
        %di$ = arith.index_cast %d$ : index to i32
        %df$ = arith.sitofp %di$ : i32 to f32
        %p$ = arith.mulf %w$, %df$ : f32
        %c$ = arith.constant 0.05 : f32
        %s$ = arith.mulf %p$, %c$ : f32
        %y$ = arith.addf %x$, %s$ : f32
        attn.yield %y$ : f32
    """,
        tab,
    )
    return b.mask("causal", **BR).build()


def _head_mask_program() -> Program:
    """A per-head lower bound on kv_idx: a runtime block map per head."""
    b = causal()
    lim = b.table("lim", 8, "i32")
    b.custom_mask(
        """
        %n$ = tensor.extract %c0$[%h$] : tensor<8xi32>
        %ni$ = arith.index_cast %n$ : i32 to index
        %keep$ = arith.cmpi sge, %kv$, %ni$ : index
        attn.yield %keep$ : i1
    """,
        lim,
    )
    return b.build()


def _document_program() -> Program:
    b = causal()
    qd, kd = b.doc_ids("qdoc", seq="q"), b.doc_ids("kdoc", seq="kv")
    return b.mask("document", qd, kd).build()


BLOCKS: dict[str, Any] = {
    "no_mask": lambda: causal().build(),
    "top_left_causal": lambda: causal().mask("causal").build(),
    "window": lambda: causal().mask("sliding_window", left=20, right=0, **BR).build(),
    "window_sinks": lambda: causal().mask("causal", **BR).mask("sliding_window", left=30, **BR).build(sinks=True),
    "sinks_lse": lambda: causal().mask("causal", **BR).build(sinks=True, lse=True),
    "softcap": lambda: causal().softcap(5.0).mask("causal", **BR).build(),
    "alibi": lambda: causal().alibi().mask("causal", **BR).build(),
    "alibi_slopes": lambda: causal().alibi(slopes=True).mask("causal", **BR).build(),
    "bias": lambda: causal().bias(("?", 8, "?", "?")).mask("causal", **BR).build(),
    "bias_broadcast": lambda: causal().bias((1, 8, 1, "?")).mask("causal", **BR).build(),
    "score_mod": _score_mod_program,
    "head_mask": _head_mask_program,
    "document": _document_program,
    "prefix_static": lambda: causal().mask("prefix_lm", prefix=20).build(),
    "prefix_operand": lambda: (lambda b: b.mask("prefix_lm", b.prefix_lengths()).build())(causal()),
}


@pytest.mark.filterwarnings("ignore:.*aligned top-left")
@pytest.mark.parametrize("block", list(BLOCKS))
def test_building_block(block: str) -> None:
    p = BLOCKS[block]()
    for q_len, kv_len in ((1, 53), (4, 70), (16, 37)):
        check_decode(p, 2, q_len, kv_len, seed=q_len)


def test_window_splits_the_band_not_the_cache() -> None:
    """A 24-key window over 300 keys: the host code sizes the split count from the 28
    keys the band reaches (two blocks: two splits), not from the 300 cached keys (19)."""
    p = causal().mask("sliding_window", left=23, right=0, **BR).build()
    args = p.inputs(1, 4, 300, 0)
    check_decode(p, 1, 4, 300, args=args)
    assert split_grid(compile_split(p.text), args)[0] == 2


def test_infinite_sink() -> None:
    """A +inf sink outweighs every score: out 0 and lse +inf for its head, never NaN,
    whichever split holds it; other heads exact."""
    p = causal().mask("causal", **BR).build(sinks=True, lse=True)
    args = p.inputs(2, 4, 70, 1)
    args[3] = torch.tensor([float("inf"), 0.3, -1.0, 2.0, 0.0, 1.0, float("inf"), -2.0])
    out, lse = compile_split(p.text)(*args)
    assert split_grid(compile_split(p.text), args)[0] > 1
    for h in (0, 6):
        assert (out[:, h] == 0).all() and torch.isposinf(lse[:, h]).all()
    check_decode(p, 2, 4, 70, args=args)


# ============================================================================ fallbacks


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: causal(dtype="f32").mask("causal", **BR).build(dropout=0.1), "dropout"),
        (lambda: Builder(hq=8, hkv=4, hv=2, d=32).mask("causal", **BR).build(), "V has 2 heads and K 4"),
    ],
    ids=["dropout", "v_heads"],
)
def test_fallback_says_why(make: Any, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    """A program the split kernel cannot serve keeps the usual forward kernel for every
    call, and the pass logs why."""
    p = make()
    with caplog.at_level(logging.INFO, logger="attnfuse.passes.split_kv"):
        module = parse_program(p.text)
        PassManager("rope-fusion,online-softmax,mask-tiling,split-kv,lower-to-tile").run(module, make_context())
    assert any(reason in r.getMessage() and "no split-KV" in r.getMessage() for r in caplog.records)
    assert "split_kv" not in str(module)
    if "dropout" not in reason:
        check_decode(p, 2, 4, 37, split=False)


def test_group_larger_than_the_tile_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    p = causal(hq=32, hkv=1).mask("causal", **BR).build()
    with caplog.at_level(logging.INFO, logger="attnfuse.passes.split_kv"):
        PassManager("online-softmax,mask-tiling,split-kv{rows=16}").run(parse_program(p.text), make_context())
    assert any("GQA group of 32 query heads does not fit a tile of 16 rows" in r.getMessage() for r in caplog.records)
    check_decode(p, 1, 1, 37, options="rows=16", split=False)


# ============================================================================ training


@pytest.mark.parametrize("merge", [True, False])
def test_backward_uses_the_exact_lse(merge: bool) -> None:
    """A small training step: the forward of 3 queries runs split (the lse comes from the
    split program that finishes last, or with `merge=false` from the combine kernel),
    the backward (unchanged, no split kernels) reproduces the reference gradients of q,
    k, v and the sinks."""
    p = Builder(hq=4, hkv=2, d=32).rope().alibi().mask("causal", **BR).build(sinks=True)
    pipe = (
        "attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling{block-m=16 block-n=16},"
        f"split-kv{{block-n=16 merge={str(merge).lower()}}},lower-backward{{block-m=16 block-n=16}},lower-to-tile"
    )
    fn = attnfuse.compile(p.text, pipeline=pipe)
    assert fn._backward is not None  # noqa: SLF001
    backward = [op.kernel.root_reference.data for op in fn._backward.ops if isinstance(op, LaunchOp)]  # noqa: SLF001
    assert "f_bwd_dq" in backward and not any("split" in name for name in backward), backward
    args = p.inputs(2, 3, 45, seed=1)
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    out = fn(*leaves)
    launched = launches(fn, args)
    assert launched["f_split_kv_small"][0] > 1 and ("f_split_kv_combine" in launched) != merge, launched
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    out.backward(g)
    refs = [a.detach().double().requires_grad_(True) for a in args]
    reference.run(p.text, *refs).backward(g.double())
    for leaf, ref, name in zip(leaves, refs, ("q", "k", "v", "sinks")):
        assert_grad_close(leaf.grad, ref.grad, torch.float32, name)


def test_backward_after_the_persistent_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step whose forward runs in the persistent kernel (a device of 2 SMs,
    reported so: 6 (batch, KV head) pairs over 4 programs, 300 keys, 3 queries; f16):
    its lse, stored per pair, drives the backward to the reference gradients."""
    monkeypatch.setattr("attnfuse.runtime.host.sm_count", lambda device: 2)
    p = Builder(hq=4, hkv=2, d=32, dtype="f16").rope().alibi().mask("causal", **BR).build(sinks=True)
    text = p.text.replace(f"@{p.name}(", "@persistent_step(")
    fn = attnfuse.compile(text, pipeline="attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling,"
                                         "split-kv{block-n=64},lower-backward,lower-to-tile")
    args = p.inputs(3, 3, 300, seed=2)
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    out = fn(*leaves)
    assert launches(fn, args)["persistent_step_split_kv_persistent"][:2] == (4, 1)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(out.dtype)
    out.backward(g)
    refs = [a.detach().double().requires_grad_(True) for a in args]
    reference.run(p.text, *refs).backward(g.double())
    for leaf, ref, name in zip(leaves, refs, ("q", "k", "v", "sinks")):
        assert_grad_close(leaf.grad, ref.grad, torch.float16, name)  # the f32 sinks' gradient too: from f16 tiles


# ============================================================================ the split count


def _specialization(meta: KernelMetadata, template: list[Any]) -> tuple[Any, ...]:
    """What Triton specializes a kernel on among its integer arguments: whether each
    one that is not `do_not_specialize` equals 1 or is a multiple of 16."""
    return tuple(
        (name, value == 1, value % 16 == 0)
        for name, value in zip(meta.arg_names, template)
        if isinstance(value, int) and name not in meta.do_not_specialize
    )


def test_split_count_follows_the_shape_not_the_kernel() -> None:
    """`auto` picks the split count per shape class from B, the KV heads, the keys and the
    SM count (132 in the interpreter: at most 132 programs of B x 4 KV heads, at least
    one block of 16 keys per split, no empty split); the split and combine kernels
    are the same objects with the same specialization for every count, so a GPU compiles
    them once. (16 query heads keep every stride a multiple of 16 whatever the batch.)"""
    p = causal(hq=16, hkv=4).mask("causal", **BR).build()
    fn = compile_split(p.text, options="merge=false")
    assert INTERPRETER_SM_COUNT == 132
    expected = {(1, 16): 1, (1, 100): 7, (1, 300): 19, (8, 100): 4, (40, 100): 1}
    seen: dict[tuple[int, int], int] = {}
    kernels, keys = set(), set()
    for (batch, kv_len), splits in expected.items():
        args = p.inputs(batch, 1, kv_len, 0)
        fn(*args)
        plan = fn._host.plan(call_signature(args))  # noqa: SLF001
        assert plan is not None
        for step in plan.steps:
            if hasattr(step, "meta") and step.meta.name.startswith("f_split_kv"):
                kernels.add((step.meta.name, id(step.kernel)))
                keys.add((step.meta.name, _specialization(step.meta, step.template)))
                if step.meta.name in ("f_split_kv", "f_split_kv_small"):
                    seen[(batch, kv_len)] = step.grid[0]
    assert seen == expected
    # 4 packed rows: the 16-row kernel while the programs fit one wave, the full one at B = 40
    assert {name for name, _ in kernels} == {"f_split_kv_small", "f_split_kv", "f_split_kv_combine"}
    assert len(kernels) == len(keys) == 3, keys
    for name in ("B", "Sq", "Skv"):
        for kernel in ("f_split_kv", "f_split_kv_small"):
            assert name in fn._host.metadata[kernel].do_not_specialize  # noqa: SLF001
    assert "splits" in fn._host.metadata["f_split_kv_combine"].do_not_specialize  # noqa: SLF001


@pytest.mark.parametrize("q_len", [1, 4])
def test_long_splits_take_the_wide_kernel(q_len: int) -> None:
    """With the plan's default 64-key blocks (16-bit inputs, head dims up to 128), calls
    whose splits each walk at least `WIDE_MIN_BLOCKS` of them in one wave take the
    16-row kernel of 128-key blocks; shorter splits the small kernel. Two splits of 600
    keys (5 blocks each; the wide kernel's second split ends in a partial block) and of
    200 (2 blocks each)."""
    p = causal().mask("causal", **BR).build(sinks=True)
    options = "block-n=64 splits=2"
    fn = compile_split(p.text, options=options)
    for kv_len, tier in ((600, "wide"), (200, "small")):
        args = p.inputs(2, q_len, kv_len, kv_len + q_len)
        check_decode(p, 2, q_len, kv_len, args=args, options=options)
        ran = launches(fn, args)
        assert f"{p.name}_split_kv_{tier}" in ran and ran[f"{p.name}_split_kv_{tier}"][0] == 2, ran
    assert WIDE_MIN_BLOCKS == 4


def test_persistent_kernel_takes_calls_beyond_two_programs_per_sm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls of one split with more programs than `PERSISTENT_MIN_PROGRAMS_PER_SM` per SM
    take the persistent kernel: `PERSISTENT_PROGRAMS_PER_SM` programs per SM, each
    walking (batch, KV head) pairs; calls in between (more than one wave, at most two
    per SM) take the full tile. A device of 2 SMs (reported so): B = 3 x 2 KV heads, 6
    pairs in one split of 5 blocks walked by 4 programs (two of them take two pairs;
    one query, and four: 16 packed rows), and B = 5 (10 pairs, up to three per program, keys ending mid-block), against B =
    2, 4 programs. Pairs of more than `PERSISTENT_MAX_BLOCKS` blocks (B = 3, 1100 keys:
    18), calls with `split-kv{persistent=false}` and, with a fixed split count of 2,
    calls of several splits take the wide kernel beyond two programs per SM instead."""
    monkeypatch.setattr("attnfuse.runtime.host.sm_count", lambda device: 2)
    built = causal().mask("causal", **BR).build(sinks=True)
    # A function of its own: compiled programs and their launch plans are shared.
    p = dataclasses.replace(built, text=built.text.replace(f"@{built.name}(", "@two_sms("), name="two_sms")
    assert (PERSISTENT_MIN_PROGRAMS_PER_SM, PERSISTENT_PROGRAMS_PER_SM, PERSISTENT_MAX_BLOCKS) == (2, 2, 16)
    tiers = {"two_sms_split_kv_persistent", "two_sms_split_kv_wide", "two_sms_split_kv_small", "two_sms_split_kv"}
    for batch, kv_len, q_len, options, tier, grid in (
            (3, 300, 1, "block-n=64", "two_sms_split_kv_persistent", (4, 1)),
            (3, 300, 4, "block-n=64", "two_sms_split_kv_persistent", (4, 1)),  # 16 packed rows
            (5, 290, 1, "block-n=64", "two_sms_split_kv_persistent", (4, 1)),
            (2, 300, 1, "block-n=64", "two_sms_split_kv", (1, 4)),
            (3, 1100, 1, "block-n=64", "two_sms_split_kv_wide", (1, 6)),
            (3, 300, 1, "block-n=64 persistent=false", "two_sms_split_kv_wide", (1, 6)),
            (3, 600, 1, "block-n=64 splits=2", "two_sms_split_kv_wide", (2, 6))):
        args = p.inputs(batch, q_len, kv_len, kv_len + q_len)
        check_decode(p, batch, q_len, kv_len, args=args, options=options)
        ran = launches(compile_split(p.text, options=options), args)
        assert set(ran) & tiers == {tier}, ran
        assert ran[tier][:2] == grid, ran


PERSISTENT_BLOCKS: dict[str, Any] = {
    **{name: make for name, make in BLOCKS.items() if not name.startswith("window")},
    # windows that reach past the 4 blocks the persistent kernel needs, starting mid-cache
    "window": lambda: causal().mask("sliding_window", left=200, right=0, **BR).build(),
    "window_sinks": lambda: causal().mask("causal", **BR).mask("sliding_window", left=250, **BR).build(sinks=True),
}


@pytest.mark.filterwarnings("ignore:.*aligned top-left")
@pytest.mark.parametrize("block", list(PERSISTENT_BLOCKS))
def test_building_block_in_the_persistent_kernel(block: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every building block in the persistent kernel, where a program walks several
    (batch, KV head) pairs: a device of 2 SMs (reported so), 3 sequences x 2 KV heads
    walked by 4 programs, 300 keys (5 blocks of 64), one query and four (16 packed
    rows). Block maps (a per-head mask, document ids) are read per pair."""
    monkeypatch.setattr("attnfuse.runtime.host.sm_count", lambda device: 2)
    built = PERSISTENT_BLOCKS[block]()
    name = f"persistent_{block}"  # a function of its own: plans are per compiled program
    p = dataclasses.replace(built, text=built.text.replace(f"@{built.name}(", f"@{name}("), name=name)
    fn = compile_split(p.text, options="block-n=64")
    for q_len in (1, 4):
        args = p.inputs(3, q_len, 300, seed=q_len)
        check_decode(p, 3, q_len, 300, args=args, options="block-n=64")
        ran = launches(fn, args)
        assert ran.get(f"{name}_split_kv_persistent", (0,))[:2] == (4, 1), ran


def test_fixed_split_count() -> None:
    """`split-kv{splits=3}`: three splits where the keys allow, one per block below."""
    p = causal().mask("causal", **BR).build()
    for kv_len, splits in ((100, 3), (20, 2)):
        args = p.inputs(2, 4, kv_len, 0)
        check_decode(p, 2, 4, kv_len, args=args, options="splits=3")
        assert split_grid(compile_split(p.text, options="splits=3"), args)[0] == splits


def test_more_splits_than_one_combine_step() -> None:
    """38 splits: the combine kernel merges them 16 at a time, rescaling what it has."""
    p = causal().mask("causal", **BR).build(sinks=True, lse=True)
    args = p.inputs(1, 4, 600, 2)
    check_decode(p, 1, 4, 600, args=args, options="splits=40")
    assert split_grid(compile_split(p.text, options="splits=40"), args)[0] == 38


@pytest.mark.parametrize(("splits", "merged"), [(16, True), (17, False)])
def test_last_program_merges_up_to_its_limit(splits: int, merged: bool) -> None:
    """`split-kv{merge=true}`: up to `merge_rows_limit` splits (16 for 4 heads of 128),
    the split program that stores its partial results last merges them all, and the
    combine kernel does not run; one more split and it does. Two calls on new inputs:
    the counters that decide which program is last are back to zero after each call."""
    p = causal(d=128).mask("causal", **BR).build(sinks=True, lse=True)
    assert merge_rows_limit(4, 128) == 16
    options = f"splits={splits} merge=true"
    fn = compile_split(p.text, options=options)
    for seed in (3, 4):  # one block of 16 keys per split
        args = p.inputs(2, 4, 16 * splits, seed)
        check_decode(p, 2, 4, 16 * splits, args=args, options=options)
        ran = launches(fn, args)
        assert ran["f_split_kv_small"][0] == splits and ("f_split_kv_combine" in ran) != merged, ran
