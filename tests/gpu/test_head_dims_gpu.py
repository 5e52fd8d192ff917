"""Every head dim 16-256 in f32, f16 and bf16 runs on the GPU with the default pipeline
(issue 7: "f32/f16/bf16 at head dims 16-256 run on the H200"), forward and gradients,
against the float64 reference.

A GQA program with RoPE on both sides and a causal mask (the Llama shape with a chosen
width and element type: `test_shared_memory.program`, whose kernels the CPU compiles for
sm_90); Sq = 301, Skv = 301 so no block size divides the length. Widths
that are not powers of two (80, 96, 160, 192) are padded inside the kernels; f32 and
head dims 160-256 are the configs that once ran out of shared memory on the H200.

Run on the GPU machine: `python -m pytest tests/gpu/test_head_dims_gpu.py -q`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from test_shared_memory import program  # noqa: E402  (the program its sm_90 compiles check)

import attnfuse  # noqa: E402
from attnfuse import reference  # noqa: E402
from attnfuse.testing import assert_close, assert_grad_close  # noqa: E402

pytestmark = pytest.mark.gpu

HEAD_DIMS = (16, 32, 64, 80, 96, 128, 160, 192, 256)
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_head_dim_forward_and_gradients(head_dim: int, dtype: str) -> None:
    text = program(head_dim, dtype)
    torch_dtype = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(head_dim * 7 + len(dtype))
    shapes = {"q": (2, 4, 301, head_dim), "k": (2, 2, 301, head_dim), "v": (2, 2, 301, head_dim)}
    leaves = {n: torch.randn(s, generator=g, device="cuda", dtype=torch_dtype).requires_grad_(True)
              for n, s in shapes.items()}
    out = attnfuse.compile(text)(*leaves.values())
    grad = torch.randn(out.shape, generator=g, device="cuda", dtype=torch_dtype)
    out.backward(grad)
    ref = {n: t.detach().double().requires_grad_(True) for n, t in leaves.items()}
    want = reference.run(text, *ref.values())
    assert_close(out.detach(), want.detach(), torch_dtype)
    want.backward(grad.double())
    for name, leaf in leaves.items():
        assert_grad_close(leaf.grad, ref[name].grad, torch_dtype, f"D={head_dim} {dtype} d{name}")
