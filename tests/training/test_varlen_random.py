"""Random packed programs, forward and backward, against the float64 reference.

Each seed draws a packed program (`varlen_programs.Case`: heads with GQA/MQA, head dim,
f16 or f32, RoPE or none, causal of either alignment, a sliding window or none, extra
blocks among soft-cap, ALiBi, sinks and QK-norm), sequence lengths with empty and
length-1 sequences and, half the time, other lengths for the keys, tile sizes of 16 or 32
for the forward and the backward, and a rope-fusion strategy; then compares the output,
the lse and every gradient with the reference (`attnfuse.testing` tolerances).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from varlen_programs import DTYPES, Case  # noqa: E402

import attnfuse  # noqa: E402
from attnfuse import reference  # noqa: E402
from attnfuse.testing import GRAD_TOLERANCE, assert_close  # noqa: E402


GRAD_SCALE_FLOOR = 1e-2
"""Gradients are compared relative to max(max |reference|, this), as the differential
fuzzer does (a one-key window makes some gradients exactly zero)."""


def _lengths(rng: random.Random, count: int) -> tuple[int, ...]:
    return tuple(rng.choice([0, 1, 1, 7, 15, 16, 17, 33, 40]) for _ in range(count))


def random_case(seed: int) -> tuple[Case, str]:
    """A random packed program and the pipeline to compile it with."""
    rng = random.Random(seed)
    hkv = rng.choice([1, 2])
    count = rng.choice([1, 2, 3, 4])
    lengths_q = _lengths(rng, count)
    if sum(lengths_q) == 0:
        lengths_q = (5, *lengths_q[1:])
    lengths_k = None if rng.random() < 0.5 else tuple(max(n, 1) + rng.choice([0, 3, 20]) for n in lengths_q)
    case = Case(
        lengths_q, lengths_k, hq=hkv * rng.choice([1, 2, 3]), hkv=hkv, d=rng.choice([16, 32, 48]),
        dtype=rng.choice(["f16", "f32"]), theta=rng.choice([None, 10000.0, 500000.0]),
        window=rng.choice([None, None, 0, 5, 16, 17]), align=rng.choice([None, "bottom_right"]),
        extra=tuple(e for e in ("softcap", "alibi", "sinks", "qk_norm") if rng.random() < 0.25),
    )
    m, n, bm, bn = (rng.choice([16, 32]) for _ in range(4))
    strategy = rng.choice(["fused", "hybrid", "separate"])
    pipeline = (f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,"
                f"mask-tiling{{block-m={m} block-n={n}}},lower-backward{{block-m={bm} block-n={bn}}},lower-to-tile")
    return case, pipeline


@pytest.mark.parametrize("seed", range(8))
def test_random_packed_program(seed: int) -> None:
    case, pipeline = random_case(seed)
    text = case.program().source
    fn = attnfuse.compile(text, pipeline=pipeline)
    args = case.inputs(seed)
    leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    out, lse = fn(*leaves)
    g = torch.Generator().manual_seed(seed)
    d_out = torch.randn(out.shape, generator=g).to(out.dtype)
    d_lse = torch.randn(lse.shape, generator=g)
    refs = [a.double().requires_grad_() if a.is_floating_point() else a for a in args]
    want, want_lse = reference.run(text, *refs)
    dtype = DTYPES[case.dtype]
    assert_close(out, want, dtype)
    assert_close(lse, want_lse, dtype)
    d_lse = torch.where(torch.isfinite(want_lse), d_lse, 0.0)  # rows without keys: lse -inf
    (out.float() * d_out.float()).sum().add((lse * d_lse).sum()).backward()
    ((want * d_out.double()).sum() + (torch.where(torch.isfinite(want_lse), want_lse, 0.0) * d_lse.double()).sum()).backward()
    for i, (leaf, ref) in enumerate(zip(leaves, refs)):
        if leaf.is_floating_point():
            scale = max(float(ref.grad.abs().max()), GRAD_SCALE_FLOOR)
            err = float((leaf.grad.double() - ref.grad).abs().max()) / scale
            assert err <= GRAD_TOLERANCE[dtype], (
                f"seed {seed} argument {i}: relative gradient error {err:.2e}\n{pipeline}\n{case}\n{text}")
