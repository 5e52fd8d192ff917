"""Gradients of every example at Llama-3-8B scale on the GPU (B=8, S=2048, 16384 tokens)
against the float64 reference's autograd (run per batch element to bound memory).

Run on the GPU machine: `python -m pytest tests/gpu -q` (skipped without CUDA).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnfuse
from attnfuse import reference
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.pass_manager import make_context
from attnfuse.program import find_functions
from attnfuse.testing import assert_grad_close, make_inputs

pytestmark = pytest.mark.gpu

# Packed batches (cu_seqlens) have their own GPU tests, whose reference runs per sequence:
# tests/gpu/test_varlen_gpu.py.
EXAMPLES = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*.attn") if "cu_seqlens" not in p.read_text())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_gradients_at_llama3_scale(path: Path) -> None:
    text = path.read_text()
    fn = attnfuse.compile(text)
    function = find_functions(parse_module_with_locations(make_context(), text, str(path))[0])[0]
    batch, seq = 8, 2048
    args = make_inputs(function, batch, seq, seq, device="cuda", seed=2)
    leaves = [a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in args]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    g = torch.randn_like(out)
    out.backward(g)
    dtype = out.dtype
    chunks = [(0, batch)] if "attn.dropout" in text else [(0, 1), (batch - 1, batch)]
    for lo, hi in chunks:
        ref_args = [
            (a[lo:hi] if a.dim() >= 2 and a.shape[0] == batch else a).detach().double().requires_grad_(True)
            if isinstance(a, torch.Tensor) and a.is_floating_point() else
            (a[lo:hi] if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == batch else a)
            for a in args
        ]
        want = reference.run(text, *ref_args)
        want = want[0] if isinstance(want, tuple) else want
        want.backward(g[lo:hi].double())
        for i, (leaf, ref) in enumerate(zip(leaves, ref_args)):
            if not isinstance(leaf, torch.Tensor) or not leaf.is_floating_point():
                continue
            batched = leaf.dim() >= 2 and leaf.shape[0] == batch
            got = leaf.grad[lo:hi] if batched and leaf.grad is not None else leaf.grad
            if not batched and len(chunks) > 1:
                continue  # a shared operand's gradient sums over the whole batch
            assert_grad_close(got, ref.grad, dtype, f"{path.stem} d{function.args[i].name_hint}")
        del want
        torch.cuda.empty_cache()
