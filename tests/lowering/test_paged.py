"""Paged KV caches (`attn.scores ... block_table kv_lens`) through the Triton interpreter.

Decode (Sq = 1, 4, 16: the split-KV kernels, several splits) and prefill (Sq = 20, 37:
the forward kernel) against K/V page pools with shuffled, non-contiguous block tables,
lengths that are not multiples of the page size (5, 37, 70 keys in pages of 8; pages of
1 and 16 too), every building block that works for contiguous decode. Each output is
compared with the float64 reference (which gathers the pages into contiguous K/V) within
PyTorch's own error in the same dtype (`paged_programs.torch_output`), f16 and f32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from paged_programs import BR, PagedProgram, assert_matches_reference, inputs, paged
from split_kv_check import launches, relative_error

import attnfuse
from attnfuse import reference
from attnfuse.analysis.split_kv import SMALL_ROWS, WIDE_MIN_BLOCKS, default_rows
from attnfuse.lowering.split_host import SHORT_SPLIT_BLOCKS
from attnfuse.program import ProgramError, analyze

BLOCK = 16
LENS = (5, 37, 70)


def pipeline(split: bool = True, strategy: str = "fused", splits: int = 0, block_n: int = BLOCK) -> str:
    """The test pipeline; `block_n`: the split kernels' KV block (64: the plan's default,
    which gives 16-bit programs the wide and the persistent kernel)."""
    return (f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,"
            f"mask-tiling{{block-m={BLOCK} block-n={BLOCK}}},"
            + (f"split-kv{{block-n={block_n}{f' splits={splits}' if splits else ''}}}," if split else "")
            + "lower-backward,lower-to-tile")


_COMPILED: dict[tuple[str, str], attnfuse.api.AttentionFunction] = {}


def compiled(text: str, pipe: str) -> attnfuse.api.AttentionFunction:
    if (text, pipe) not in _COMPILED:
        _COMPILED[(text, pipe)] = attnfuse.compile(text, pipeline=pipe)
    return _COMPILED[(text, pipe)]


def check(program: PagedProgram, q_len: int, lens: Sequence[int] = LENS, *, dtype: torch.dtype = torch.float16,
          seed: int = 0, strategy: str = "fused", split: bool = True, splits: int = 0) -> torch.Tensor:
    """Run the program on fresh inputs; the kernel that served the call, and the error
    bound. Split-KV serves calls whose `Sq * group` rows fit its tile, else the forward
    kernel. Among the split kernels, the short one takes calls whose rows fit 16 (or the
    one tile) with at most 8 KV blocks per split: every call of these small caches with
    `auto` splits; `splits` > 0 fixes the count (the caller makes the splits long)."""
    args = inputs(program, lens, q_len, seed=seed, dtype=dtype)
    fn = compiled(program.text, pipeline(split, strategy, splits))
    result = fn(*args)
    ran = launches(fn, args)
    group = program.heads // args[1].shape[1]
    rows = default_rows(analyze(next(iter(reference.parse_program(program.text).ops))))  # type: ignore[arg-type]
    splitting = split and q_len * group <= rows
    short_rows = SMALL_ROWS if group <= SMALL_ROWS else rows
    short = splitting and q_len * group <= short_rows and not splits
    small = splitting and not short and group <= SMALL_ROWS < rows and q_len * group <= SMALL_ROWS
    tiers = ("f_split_kv" in ran, "f_split_kv_small" in ran, "f_split_kv_short" in ran)
    assert tiers == (splitting and not small and not short, small, short), ran
    return assert_matches_reference(program, args, result)


ROPE = "{theta = 10000.0}"
SCORE_MOD = """attn.score_mod {x}, %tab : {s}, tensor<4xf32> {{
  ^bb0(%a: f32, %b: index, %h: index, %qi: index, %ki: index, %t: tensor<4xf32>):
    %w = tensor.extract %t[%h] : tensor<4xf32>
    %d = arith.subi %ki, %qi : index
    %di = arith.index_cast %d : index to i32
    %df = arith.sitofp %di : i32 to f32
    %c = arith.constant 0.03 : f32
    %m = arith.mulf %w, %df : f32
    %n = arith.mulf %m, %c : f32
    %y = arith.addf %a, %n : f32
    attn.yield %y : f32
  }}"""
HEAD_MASK = """attn.mask custom {x} : {s} {{
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %three = arith.constant 3 : index
    %kh = arith.addi %ki, %h : index
    %r = arith.remsi %kh, %three : index
    %z = arith.constant 0 : index
    %h0 = arith.cmpi eq, %h, %z : index
    %e = arith.cmpi ne, %r, %z : index
    %keep = arith.ori %h0, %e : i1
    attn.yield %keep : i1
  }}"""

BLOCKS: dict[str, Any] = {
    "no_mask": lambda: paged(),
    "causal": lambda: paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"]),
    "top_left_causal": lambda: paged(score_ops=["attn.mask causal {x} : {s}"]),
    "window": lambda: paged(score_ops=['attn.mask sliding_window {x} {{align = "bottom_right", left = 20, right = 0}} : {s}']),
    "window_sinks_lse": lambda: paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}",
                                                 'attn.mask sliding_window {x} {{align = "bottom_right", left = 30}} : {s}'],
                                      sinks=True, lse=True),
    "softcap": lambda: paged(score_ops=["attn.softcap {x} {{cap = 5.0}} : {s}", f"attn.mask causal {{x}} {BR} : {{s}}"]),
    "alibi": lambda: paged(score_ops=["attn.bias alibi {x} : {s}", f"attn.mask causal {{x}} {BR} : {{s}}"]),
    "alibi_slopes": lambda: paged(score_ops=["attn.bias alibi {x} slopes %slopes : {s}, tensor<4xf32>",
                                             f"attn.mask causal {{x}} {BR} : {{s}}"], captures=["slopes"]),
    "score_mod": lambda: paged(score_ops=[SCORE_MOD, f"attn.mask causal {{x}} {BR} : {{s}}"], captures=["tab"]),
    "custom_mask": lambda: paged(score_ops=[HEAD_MASK, f"attn.mask causal {{x}} {BR} : {{s}}"]),
    "prefix_static": lambda: paged(score_ops=["attn.mask prefix_lm {x} {{prefix = 9}} : {s}"]),
    "rope_q": lambda: paged(rope=ROPE, score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"]),
    "qk_norm_rope_q": lambda: paged(rope='{theta = 500000.0, style = "interleaved", rotary_dim = 16}', qk_norm=True,
                                    score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"]),
}


@pytest.mark.filterwarnings("ignore:.*aligned top-left")
@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("q_len", [1, 16, 37])
def test_building_block(block: str, q_len: int) -> None:
    """Decode (1, 16: split-KV) and prefill (37 queries x group 2 > the 32 packed rows of
    the split kernel: the forward kernel)."""
    check(BLOCKS[block](), q_len, seed=q_len)


@pytest.mark.parametrize("block", ["causal", "alibi_slopes", "rope_q", "custom_mask"])
@pytest.mark.parametrize("q_len", [1, 4, 16])
def test_long_splits_take_the_band_loops(block: str, q_len: int) -> None:
    """Splits of more than SHORT_SPLIT_BLOCKS blocks (two splits of a block table of 272
    keys: 9 blocks of 16 each) run the 16-row or the full split kernel (the band's
    loops, five stages). (A sliding window would keep the splits short: it visits the
    keys it reaches only.)"""
    lens, program = (150, 37, 259), BLOCKS[block]()
    capacity = (-(-max(lens) // program.page_size) + 1) * program.page_size  # inputs(): one spare column
    assert -(-capacity // BLOCK // 2) > SHORT_SPLIT_BLOCKS
    check(program, q_len, lens, seed=q_len, splits=2)


@pytest.mark.parametrize("block", ["causal", "rope_q", "alibi_slopes"])
@pytest.mark.parametrize("q_len", [1, 4])
def test_long_splits_take_the_wide_kernel(block: str, q_len: int) -> None:
    """With 64-key plan blocks (16-bit inputs, head dims up to 128), calls whose splits
    each walk at least WIDE_MIN_BLOCKS of them in one wave take the wide kernel: 128-key
    tiles gathered from pages of 8 keys. Two splits of a table of 640 keys (5 blocks of
    64 each; the second split ends in a partial 128-key tile); the shorter sequences
    leave its second split's loops empty."""
    program, lens = BLOCKS[block](), (600, 37, 259)
    pipe = pipeline(splits=2, block_n=64)
    fn = compiled(program.text, pipe)
    args = inputs(program, lens, q_len, seed=q_len)
    result = fn(*args)
    ran = launches(fn, args)
    assert set(ran) & {"f_split_kv_wide", "f_split_kv_short", "f_split_kv_small"} == {"f_split_kv_wide"}, ran
    assert ran["f_split_kv_wide"][0] == 2 and WIDE_MIN_BLOCKS == 4, ran
    assert_matches_reference(program, args, result)


PERSISTENT_BLOCKS: dict[str, Any] = {
    **{name: make for name, make in BLOCKS.items() if not name.startswith("window")},
    # windows that reach past the 4 blocks the persistent kernel needs, starting mid-sequence
    "window": lambda: paged(score_ops=['attn.mask sliding_window {x} {{align = "bottom_right", left = 500, right = 0}} : {s}']),
    "window_sinks_lse": lambda: paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}",
                                                 'attn.mask sliding_window {x} {{align = "bottom_right", left = 450}} : {s}'],
                                      sinks=True, lse=True),
}


@pytest.mark.filterwarnings("ignore:.*aligned top-left")
@pytest.mark.parametrize("block", list(PERSISTENT_BLOCKS))
def test_many_pairs_take_the_persistent_kernel(block: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call of one split with more (batch, KV head) pairs than two per SM (a device of
    2 SMs, reported so: 3 sequences x 2 KV heads) takes the persistent kernel: 4
    programs, two of them walking two pairs, each with its own sequence length (600, 37
    and 259 keys: their loops differ from pair to pair); every building block."""
    monkeypatch.setattr("attnfuse.runtime.host.sm_count", lambda device: 2)
    program, lens = PERSISTENT_BLOCKS[block](), (600, 37, 259)
    pipe = pipeline(block_n=64)
    # A function of its own: compiled programs and their launch plans are shared.
    name = f"two_sms_{block}"
    fn = compiled(program.text.replace("@f(", f"@{name}("), pipe)
    args = inputs(program, lens, 1, seed=3)
    result = fn(*args)
    ran = {kernel.removeprefix(name): grid for kernel, grid in launches(fn, args).items()}
    assert set(ran) & {"_split_kv_persistent", "_split_kv_wide", "_split_kv_small", "_split_kv"} == {
        "_split_kv_persistent"}, ran
    assert ran["_split_kv_persistent"][:2] == (4, 1), ran
    assert_matches_reference(program, args, result)


def test_persistent_kernel_with_empty_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty sequences among the pairs a persistent program walks (kv_lens 0, 600, 0,
    259 on a device of 2 SMs, reported so: 8 pairs over 4 programs): out 0 and lse -inf
    for the empty ones, the next pair starting from a fresh softmax state."""
    monkeypatch.setattr("attnfuse.runtime.host.sm_count", lambda device: 2)
    program, lens = paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"], lse=True), (0, 600, 0, 259)
    pipe = pipeline(block_n=64)
    fn = compiled(program.text.replace("@f(", "@empty_pairs("), pipe)
    args = inputs(program, lens, 1, seed=5)
    out, lse = fn(*args)
    assert launches(fn, args)["empty_pairs_split_kv_persistent"][:2] == (4, 1)
    for empty in (0, 2):
        assert (out[empty] == 0).all() and torch.isneginf(lse[empty]).all()
    assert_matches_reference(program, args, (out, lse))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("q_len", [1, 4, 20])
def test_shapes(q_len: int, hq: int, hkv: int, dtype: torch.dtype) -> None:
    """GQA groups 1, 2, 8 (MQA); V with another head dim; f16 and f32."""
    p = paged(hq, hkv, 32, 48, "f16" if dtype == torch.float16 else "f32",
              score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])
    p.heads = hq
    check(p, q_len, dtype=dtype)


@pytest.mark.parametrize("page", [1, 16, 24, 32])
def test_page_sizes(page: int) -> None:
    """One key per page, pages as large as a KV block (each tile reads one block-table
    entry), a page size that is not a power of two (tiles span page boundaries at
    varying offsets), and pages of two blocks (a tile starts mid-page)."""
    p = paged(page=page, score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])
    for q_len in (1, 20):
        check(p, q_len, (3, 50, 17))


@pytest.mark.parametrize("q_len", [1, 4])
def test_pools_beyond_i32_offsets_take_the_i64_kernel(q_len: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The split kernels but one address the pools with i32 offsets; a call whose pools
    those do not reach (`host.fits_i32` false: here reported so, a real one would hold
    2**31 elements) takes the full tile with i64 offsets, and is as correct."""
    calls: list[int] = []

    def fits_i32(tensors: Sequence[torch.Tensor]) -> bool:
        calls.append(len(tensors))
        return False

    monkeypatch.setattr("attnfuse.runtime.host.fits_i32", fits_i32)
    program = BLOCKS["window_sinks_lse"]()
    # A function of its own: compiled programs and their launch plans are shared.
    fn = attnfuse.compile(program.text.replace("@f(", f"@big_pools_{q_len}("), pipeline=pipeline())
    args = inputs(program, LENS, q_len, seed=q_len)
    result = fn(*args)
    ran = {name.removeprefix(f"big_pools_{q_len}"): grid for name, grid in launches(fn, args).items()}
    assert calls == [2], calls  # the two pools, once for the launch plan
    assert set(ran) & {"_split_kv", "_split_kv_i64", "_split_kv_short", "_split_kv_small"} == {"_split_kv_i64"}, ran
    assert_matches_reference(program, args, result)


def test_fits_i32_reads_the_span_of_each_view() -> None:
    """`host.fits_i32` is about the elements a view spans from its first, strides
    included, not its element count (meta tensors: no memory)."""
    from attnfuse.runtime.host import fits_i32

    def t(shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
        return torch.empty_strided(shape, stride, device="meta")

    pool = t((2**17 + 1, 8, 16, 128), (16384, 2048, 128, 1))
    assert fits_i32([pool[:-1]])  # 2**31 elements: the last one 2**31 - 1 past the first
    assert not fits_i32([pool])
    assert not fits_i32([t((2, 4), (2**31 - 3, 1))])  # 8 elements, the second row 2**31 - 3 past the first
    assert fits_i32([t((2, 4), (2**31 - 4, 1))])
    assert fits_i32([t((0, 4), (2**40, 1)), t((3,), (0,))])  # empty; broadcast


@pytest.mark.parametrize("strategy", ["hybrid", "separate"])
def test_rope_on_queries_in_a_prekernel(strategy: str) -> None:
    p = paged(rope=ROPE, score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])
    for q_len in (1, 20):
        check(p, q_len, strategy=strategy)


def test_without_split_kv() -> None:
    """The forward kernel alone (no `split-kv` pass) serves decode calls too."""
    p = paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"], sinks=True)
    check(p, 1, split=False)
    check(p, 4, split=False)


def test_empty_sequences_and_shorter_than_queries() -> None:
    """kv_lens 0 (output 0, lse -inf) and fewer keys than queries (bottom-right: the
    first rows see no key)."""
    p = paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"], lse=True)
    for q_len in (1, 4, 20):
        out = check(p, q_len, (0, 3, 29))
        assert (out[0] == 0).all()


def test_one_launch_plan_serves_growing_caches() -> None:
    """A decode loop whose cache grows by a key per step: the lengths are data, so every
    step runs the launch plan of the first (no new plan, no recompilation)."""
    p = paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])
    # Renamed: live compilations of the same program share their launch plans.
    fn = attnfuse.compile(p.text.replace("@f(", "@growing("), pipeline=pipeline())
    args = inputs(p, (8, 12, 4), 1)
    for step in range(4):
        args[4] = torch.tensor([5 + step, 9 + step, 1 + step], dtype=torch.int32)
        assert relative_error(fn(*args), reference.run(p.text, *args)) < 5e-3
    assert fn._host.plan_count() == 1  # noqa: SLF001


# ============================================================================ errors


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"k_rope": True}, "attn.rope on K of a paged KV cache"),
    ({"score_ops": ["attn.bias tensor {x}, %bias : {s}, tensor<?x4x?x?xf32>"]}, "attn.bias tensor"),
])
def test_unsupported_blocks_are_program_errors(kwargs: dict[str, Any], message: str) -> None:
    text = paged(**kwargs).text
    if "%bias" in text:
        text = text.replace("%lens: tensor<?xi32>", "%lens: tensor<?xi32>, %bias: tensor<?x4x?x?xf32>")
    with pytest.raises(ProgramError, match=message):
        attnfuse.compile(text, pipeline=pipeline())


def test_dropout_is_a_program_error() -> None:
    text = paged().text.replace("%lens: tensor<?xi32>", "%lens: tensor<?xi32>, %seed: i64")
    text = text.replace("%o = attn.weighted_sum %p,", "%pd = attn.dropout %p, %seed {p = 0.1} : "
                        "!attn.probs<?x4x?x?xf32>, i64\n  %o = attn.weighted_sum %pd,")
    with pytest.raises(ProgramError, match="attn.dropout is not supported with a paged KV cache"):
        attnfuse.compile(text)


def test_v_page_size_must_match() -> None:
    text = paged().text.replace("%vc: tensor<?x2x8x32xf16>", "%vc: tensor<?x2x4x32xf16>").replace(
        "!attn.probs<?x4x?x?xf32>, tensor<?x2x8x32xf16>", "!attn.probs<?x4x?x?xf32>, tensor<?x2x4x32xf16>")
    with pytest.raises(ProgramError, match="v page size 4 differs from k's 8"):
        attnfuse.compile(text)


def test_no_backward() -> None:
    """Inference only: lower-backward skips the program and says why on a gradient."""
    p = paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])
    fn = compiled(p.text, pipeline())
    args = inputs(p, LENS, 1)
    args[0].requires_grad_(True)
    with pytest.raises(RuntimeError, match="has no gradient: a paged KV cache"):
        fn(*args)
