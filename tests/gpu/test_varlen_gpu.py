"""Packed variable-length batches on the GPU at Llama-3-8B scale (examples/varlen.attn,
bf16, 32 / 8 heads, D = 128): 16384 tokens of lengths 256..4096 (plus lengths 1 and not
multiples of the blocks), forward against SDPA per sequence with RoPE applied in
float64, gradients against the float64 reference run one sequence at a time, one
compiled kernel across batches and lengths, and clear errors.

Run on the GPU machine: `python -m pytest tests/gpu -q` (skipped without CUDA).
"""

from __future__ import annotations

import random

import pytest
import torch

import attnfuse
from attnfuse.passes import default_pipeline
from attnfuse import examples, reference
from attnfuse.reference.rope import RopeParams, apply_rope
from attnfuse.testing import assert_close, assert_grad_close, cu_seqlens

pytestmark = pytest.mark.gpu


def _lengths(total: int, seed: int) -> list[int]:
    """Lengths summing to `total`: 1, 257, 4096 (when total allows), then random in 256..4096."""
    rng = random.Random(seed)
    lengths = [1, 4096, 257] if total >= 8192 else [1, 257]
    while sum(lengths) < total:
        lengths.append(min(rng.randint(256, 4096), total - sum(lengths)))
    return lengths


def _packed(lengths: list[int], seed: int, grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(1, 32, total, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, 8, total, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    return [q.requires_grad_(grad), k.requires_grad_(grad), v.requires_grad_(grad), cu_seqlens(lengths, "cuda")]


@pytest.mark.parametrize("strategy", ["auto", "fused", "separate"])
def test_forward_16k_matches_sdpa_per_sequence(strategy: str) -> None:
    pipeline = default_pipeline({"rope-fusion": f"strategy={strategy}"})
    fn = attnfuse.compile(examples.path("varlen"), pipeline=pipeline)
    lengths = _lengths(16384, seed=1)
    q, k, v, cu = _packed(lengths, seed=1)
    out = fn(q, k, v, cu, cu)
    params = RopeParams(rotary_dim=128, theta=500000.0)
    bounds = cu.tolist()
    for a, b in zip(bounds, bounds[1:]):
        positions = torch.arange(b - a, device="cuda")
        qr = apply_rope(q[:, :, a:b].double(), params, positions).float()
        kr = apply_rope(k[:, :, a:b].double(), params, positions).float()
        want = torch.nn.functional.scaled_dot_product_attention(
            qr, kr, v[:, :, a:b].float(), is_causal=True, enable_gqa=True)
        assert_close(out[:, :, a:b], want.double(), torch.bfloat16)


def test_gradients_against_the_reference_per_sequence() -> None:
    fn = attnfuse.compile(examples.path("varlen"))
    text = examples.path("varlen").read_text()
    lengths = [1, 2048, 777, 3000, 64]
    q, k, v, cu = _packed(lengths, seed=2, grad=True)
    out = fn(q, k, v, cu, cu)
    d_out = torch.randn_like(out)
    out.backward(d_out)
    bounds = cu.tolist()
    for a, b in zip(bounds, bounds[1:]):
        one = torch.tensor([0, b - a], dtype=torch.int32, device="cuda")
        refs = [t[:, :, a:b].detach().double().requires_grad_() for t in (q, k, v)]
        reference.run(text, *refs, one, one).backward(d_out[:, :, a:b].double())
        for leaf, ref, name in zip((q, k, v), refs, "qkv"):
            assert_grad_close(leaf.grad[:, :, a:b], ref.grad, torch.bfloat16, f"d{name}[{a}:{b}]")
        del refs
        torch.cuda.empty_cache()


def test_one_kernel_for_every_batch_and_length() -> None:
    """Calls with other sequence counts and lengths reuse the compiled forward kernel:
    one variant while the token count stays a multiple of 16, a second one at most for
    other counts (the lse's row stride then changes divisibility, as for unpacked calls)."""
    from attnfuse.runtime.loader import load_kernels

    # Renamed: other tests compile the example with other token counts into the same kernels.
    fn = attnfuse.compile(examples.path("varlen").read_text().replace("@varlen(", "@varlen_variants("))
    forward = load_kernels(fn.triton_source, interpret=False)["varlen_variants_fwd"]

    def variants() -> int:
        torch.cuda.synchronize()
        return len(forward.device_caches[torch.cuda.current_device()][0])

    for seed, total in ((3, 16384), (4, 4096), (5, 12288)):
        args = _packed(_lengths(total, seed), seed)
        fn(*args, args[3])
    assert variants() == 1
    for seed, total in ((6, 5000), (7, 12345)):
        args = _packed(_lengths(total, seed), seed)
        fn(*args, args[3])
    assert variants() <= 2


def test_cu_seqlens_on_the_wrong_device() -> None:
    fn = attnfuse.compile(examples.path("varlen"))
    q, k, v, cu = _packed([5, 300], seed=6)
    with pytest.raises(attnfuse.AttnfuseArgumentError, match=r"argument 4 'cu_seqlens_k': on cpu, but earlier"):
        fn(q, k, v, cu, cu.cpu())
    with pytest.raises(attnfuse.AttnfuseArgumentError, match="argument 3 'cu_seqlens_q': cu_seqlens must not decrease"):
        fn(q, k, v, torch.tensor([0, 300, 5], dtype=torch.int32, device="cuda"), cu)
