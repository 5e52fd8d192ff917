"""Packed variable-length batches, forward: kernels against the float64 reference.

Every case runs in the Triton interpreter with 16 x 16 tiles, on fresh random inputs,
with sequence lengths that are not multiples of the block (37, 21), a block exactly
(16), length 1, and in places an empty sequence. Programs that PyTorch can write the
same way (`torch_varlen`) are bounded by PyTorch's own error in the dtype; the others
(soft-cap, ALiBi, sinks, QK-norm) by the dtype tolerances of `attnfuse.testing`. Also:
each sequence of a packed call equals the unpacked program run on that sequence alone,
and the packed kernels visit no tile outside a sequence.
"""

from __future__ import annotations

import pytest
import torch
from varlen_programs import Case, pipeline, torch_varlen, within_torch_error

import attnfuse
from attnfuse import reference
from attnfuse.testing import assert_close

LLAMA = Case((37, 1, 16, 21), hq=4, hkv=2)

CASES = {
    "rope-causal-gqa-f16": Case((37, 1, 16, 21), dtype="f16"),
    "rope-causal-gqa-f32": LLAMA,
    "window-f16": Case((37, 5, 29), dtype="f16", window=6, theta=None),
    "mqa-rope-window": Case((40, 1, 19), hkv=1, window=9),
    "cross-bottom-right": Case((5, 1, 17, 3), (21, 1, 30, 0), align="bottom_right", dtype="f16"),
    "cross-top-left-longer-q": Case((19, 4), (7, 33), theta=None),
}


def _run(case: Case, strategy: str = "hybrid", seed: int = 0) -> tuple[list[object], torch.Tensor, torch.Tensor]:
    text = case.program().source
    fn = attnfuse.compile(text, pipeline=pipeline(strategy))
    args = case.inputs(seed)
    out, lse = fn(*args)
    want, want_lse = reference.run(text, *args)
    assert out.shape == want.shape and out.dtype == args[0].dtype
    assert_close(lse, want_lse, args[0].dtype)
    return args, out, want


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_within_torch_error(name: str) -> None:
    case = CASES[name]
    args, out, want = _run(case, seed=len(name))
    within_torch_error(out, torch_varlen(case, args), want, name)


@pytest.mark.parametrize("strategy", ["fused", "separate"])
def test_rope_placements(strategy: str) -> None:
    """RoPE positions restart in every sequence wherever the rotation runs: in the
    attention kernel (fused) or in pre-kernels that walk the sequences in 64-row blocks."""
    case = Case((70, 1, 3, 66), dtype="f16")
    args, out, want = _run(case, strategy, seed=3)
    within_torch_error(out, torch_varlen(case, args), want, strategy)


@pytest.mark.parametrize("extra", [("softcap", "alibi"), ("sinks", "qk_norm")], ids="-".join)
def test_score_ops_index_within_sequences(extra: tuple[str, ...]) -> None:
    """ALiBi distances and soft-capping per sequence; sinks and Q/K-norm weights."""
    _, out, want = _run(Case((37, 1, 22), window=11, extra=extra), seed=5)
    assert_close(out, want)


def test_each_sequence_is_the_unpacked_program() -> None:
    """A packed call equals the unpacked program on each sequence alone."""
    case = Case((37, 1, 16), dtype="f32")
    args, out, _ = _run(case, seed=9)
    unpacked = attnfuse.compile(case.program(packed=False).source, pipeline=pipeline())
    q, k, v, cu = args
    for i in range(3):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        alone, _ = unpacked(q[:, :, rows], k[:, :, rows], v[:, :, rows])
        torch.testing.assert_close(out[:, :, rows], alone, rtol=1e-6, atol=1e-6)


def test_tiles_stay_within_sequences() -> None:
    """Full attention (no mask) over sequences of 20 and 13 tokens: 16-row blocks give
    2 + 1 q blocks, each visiting its own sequence's KV blocks only (2 and 1), so
    2 * 2 + 1 * 1 = 5 tiles per head, where one padded [1, 33] row would visit 3 x 3."""
    text = attnfuse.attention(2, 16, dtype="f32").packed(shared=True).build().source
    fn = attnfuse.compile(text, pipeline=pipeline("fused").replace("lower-to-tile", "lower-to-tile{count-tiles=true}"))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 33, 16, generator=g) for _ in range(3))
    assert fn.count_tiles(q, k, v, torch.tensor([0, 20, 33], dtype=torch.int32)) == 2 * 5


def test_lengths_change_without_recompiling() -> None:
    """One compiled program serves any number of sequences and any lengths: the schedule
    comes from cu_seqlens at run time, one launch plan per shape class."""
    case = Case((9, 30), dtype="f32")
    fn = attnfuse.compile(case.program().source, pipeline=pipeline())
    for lengths in [(9, 30), (1,), (17, 0, 2, 40)]:
        args = Case(lengths).inputs(len(lengths))
        out, _ = fn(*args)
        assert_close(out, reference.run(case.program().source, *args)[0])
    assert fn._host.plan_count() == 3  # noqa: SLF001


def test_custom_mask_and_score_mod_read_the_sequence() -> None:
    """`b` of a mask_mod / score_mod is the sequence; a predicate the compiler cannot bound
    (a runtime block map when unpacked) runs on every tile of its sequence instead."""
    text = (attnfuse.attention(2, 16, dtype="f32").mask_mod(lambda b, h, q, kv: (kv <= q + b) & ((q + kv) % 3 != 1))
            .score_mod(lambda s, b, h, q, kv: s + 0.25 * b - 0.01 * (q - kv)).packed().lse().build().source)
    fn = attnfuse.compile(text, pipeline=pipeline("fused"))
    args = Case((21, 3, 1, 18), (5, 40, 1, 17), hq=2, hkv=2, d=16).inputs(2)
    out, lse = fn(*args)
    want, want_lse = reference.run(text, *args)
    assert_close(out, want)
    assert_close(lse, want_lse, torch.float32)
