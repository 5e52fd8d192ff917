"""Packed variable-length batches, backward: gradients of q, k, v (and of learnable
operands) through `loss.backward()` against the float64 reference's autograd.

The dQ and dK/dV kernels walk (sequence, block) slots as the forward does; Q/K pre-kernels
and their transposes walk 64-row blocks of each sequence. Inputs are fresh random
values; lengths are not multiples of the 16-row blocks, with length-1 sequences. Cases
PyTorch can write (`torch_varlen`) are bounded by PyTorch's own gradient error in the
same dtype; the others by `attnfuse.testing.GRAD_TOLERANCE`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from varlen_programs import Case, pipeline, torch_varlen, within_torch_error  # noqa: E402

import attnfuse  # noqa: E402
from attnfuse import reference  # noqa: E402
from attnfuse.testing import assert_grad_close  # noqa: E402

CASES = {
    "rope-causal-gqa-f16": (Case((37, 1, 16, 21), dtype="f16"), "hybrid"),
    "rope-causal-gqa-f32-fused": (Case((37, 1, 21)), "fused"),
    "window-mqa-f16": (Case((40, 1, 19), hkv=1, window=9, dtype="f16"), "hybrid"),
    "cross-bottom-right-f32": (Case((5, 1, 17, 3), (21, 1, 30, 0), align="bottom_right"), "separate"),
}


def _grads(case: Case, strategy: str, seed: int) -> tuple[list[Any], list[Any], list[Any], torch.Tensor]:
    """(leaves, reference leaves, args, d_out) after one backward through each."""
    text = case.program().source
    fn = attnfuse.compile(text, pipeline=pipeline(strategy, backward=True))
    args = case.inputs(seed)
    leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    out, _ = fn(*leaves)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(out.dtype)
    out.backward(d_out)
    refs = [a.double().requires_grad_() if a.is_floating_point() else a for a in args]
    reference.run(text, *refs)[0].backward(d_out.double())
    return leaves, refs, args, d_out


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_within_torch_error(name: str) -> None:
    case, strategy = CASES[name]
    leaves, refs, args, d_out = _grads(case, strategy, seed=len(name))
    theirs = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    torch_varlen(case, theirs).backward(d_out)
    for i, what in enumerate("qkv"):
        assert leaves[i].grad.dtype == args[i].dtype
        within_torch_error(leaves[i].grad, theirs[i].grad, refs[i].grad, f"{name} d{what}")


@pytest.mark.parametrize("strategy", ["hybrid", "separate"])
def test_learnable_operands(strategy: str) -> None:
    """Sinks and Q/K-norm weights: their gradients are summed from per-slot partials
    (one row per schedule slot, padding slots included)."""
    case = Case((37, 1, 22), window=11, extra=("sinks", "qk_norm", "softcap", "alibi"))
    leaves, refs, _, _ = _grads(case, strategy, seed=4)
    names = ["q", "k", "v", "cu_seqlens", "wq", "wk", "sinks"]
    for leaf, ref, name in zip(leaves, refs, names):
        if leaf.is_floating_point():
            assert_grad_close(leaf.grad, ref.grad, torch.float32, f"d{name}")


def test_cu_seqlens_are_not_differentiable() -> None:
    """Only float arguments get gradients; int32 cu_seqlens cannot require grad."""
    case = Case((9, 4))
    fn = attnfuse.compile(case.program().source, pipeline=pipeline(backward=True))
    assert set(fn._grad_of) == {0, 1, 2}  # noqa: SLF001
    with pytest.raises(RuntimeError, match="floating point"):
        case.inputs()[3].requires_grad_()
