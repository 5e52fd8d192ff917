"""The reference semantics of a packed batch: one attention per sequence.

A packed program on N concatenated sequences must equal the unpacked program run on each
sequence alone (batch 1, its own lengths), for every index-dependent op: RoPE positions,
causal masks of both alignments, windows, ALiBi, a custom predicate reading `b` (the
sequence), a score_mod, a static prefix-LM mask and sinks. The unpacked runs are the
reference's own, already checked op by op against independent torch code
(test_reference_ops.py); a cross-sequence score that a score_mod turns finite must still
be dropped.
"""

from __future__ import annotations

import pytest
import torch

import attnfuse
from attnfuse.builder import ProgramBuilder
from attnfuse.reference import ReferenceError, run

LENGTHS_Q = (6, 1, 9, 0, 4)
LENGTHS_K = (8, 3, 9, 2, 4)

BUILDERS = {
    "rope-causal": lambda a: a.rope(theta=100.0, offset=3).causal(),
    "bottom-right-window": lambda a: a.causal(align="bottom_right").sliding_window(left=2, align="bottom_right"),
    "alibi-softcap-sinks": lambda a: a.alibi().softcap(5.0).causal().sinks(),
    "mask-mod-reads-sequence": lambda a: a.mask_mod(lambda b, h, q, kv: kv <= q + b),
    "score-mod-everywhere": lambda a: a.score_mod(lambda s, b, h, q, kv: s * 0.0 + (q - kv) * 0.1 + b),
    "prefix-lm": lambda a: a.prefix_lm(2),
}


def _pair(name: str) -> tuple[str, str, bool]:
    base = attnfuse.attention(4, 8, kv_heads=2, dtype="f32", name="f")
    builder: ProgramBuilder = BUILDERS[name](base)
    return builder.packed().lse().build().source, builder.lse().build().source, "sinks" in name


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_packed_is_each_sequence_alone(name: str) -> None:
    packed, unpacked, sinks = _pair(name)
    g = torch.Generator().manual_seed(len(name))
    tq, tk = sum(LENGTHS_Q), sum(LENGTHS_K)
    q = torch.randn(1, 4, tq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, tk, 8, generator=g, dtype=torch.float64) for _ in range(2))
    extra = [torch.randn(4, generator=g, dtype=torch.float64)] if sinks else []
    cu_q = torch.tensor([0, *torch.tensor(LENGTHS_Q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(LENGTHS_K).cumsum(0).tolist()], dtype=torch.int32)
    out, lse = run(packed, q, k, v, cu_q, cu_k, *extra)
    for i in range(len(LENGTHS_Q)):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        if rq.start == rq.stop:
            continue
        alone_out, alone_lse = run(unpacked, q[:, :, rq], k[:, :, rk], v[:, :, rk], *extra)
        if "mask-mod" in name or "score-mod" in name:  # they read b: sequence i is batch element i
            padded = [torch.zeros(i + 1, *t.shape[1:], dtype=t.dtype) for t in (q[:, :, rq], k[:, :, rk], v[:, :, rk])]
            for t, part in zip(padded, (q[:, :, rq], k[:, :, rk], v[:, :, rk])):
                t[i] = part[0]
            alone_out, alone_lse = (x[i:i + 1] for x in run(unpacked, *padded, *extra))
        torch.testing.assert_close(out[:, :, rq], alone_out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, :, rq], alone_lse, rtol=1e-12, atol=1e-12)


def test_cross_sequence_scores_are_dropped() -> None:
    """A score_mod that sets every score to 0 still averages over the sequence's own keys."""
    text = attnfuse.attention(1, 4, dtype="f32").score_mod(lambda s, b, h, q, kv: s * 0.0).packed(
        shared=True).build().source
    v = torch.arange(5, dtype=torch.float64).view(1, 1, 5, 1).expand(1, 1, 5, 4)
    out = run(text, torch.ones(1, 1, 5, 4), torch.ones(1, 1, 5, 4), v, torch.tensor([0, 2, 5], dtype=torch.int32))
    assert out[0, 0, :, 0].tolist() == [0.5, 0.5, 3.0, 3.0, 3.0]


@pytest.mark.parametrize(("cu", "message"), [
    ([0, 3, 2, 5], "must rise from 0 to 5"),
    ([1, 3, 5], "must rise from 0 to 5"),
    ([0, 3, 4], "must rise from 0 to 5"),
])
def test_bad_cu_seqlens(cu: list[int], message: str) -> None:
    text = attnfuse.attention(1, 4, dtype="f32").causal().packed(shared=True).build().source
    x = torch.ones(1, 1, 5, 4)
    with pytest.raises(ReferenceError, match=message):
        run(text, x, x, x, torch.tensor(cu, dtype=torch.int32))
