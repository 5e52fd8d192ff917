"""Every example at Llama-3-8B scale on the GPU (B * S = 16384 tokens), against the
float64 reference (run per batch element on the GPU to bound its memory) and, for
Llama-3 at S = 16384, against SDPA with the same RoPE applied in float64.

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
from attnfuse.testing import assert_close, make_inputs

pytestmark = pytest.mark.gpu

# Packed batches (cu_seqlens) have their own GPU tests, whose reference runs per sequence:
# tests/gpu/test_varlen_gpu.py.
EXAMPLES = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*.attn") if "cu_seqlens" not in p.read_text())
STRATEGIES = ("fused", "hybrid", "separate")


def _pipeline(strategy: str) -> str:
    return f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,mask-tiling,lower-to-tile"


CASES = [
    (path, strategy)
    for path in EXAMPLES
    for strategy in STRATEGIES
    if strategy == "fused" or "attn.rope" in path.read_text() or "attn.qk_norm" in path.read_text()
]


@pytest.mark.parametrize(("path", "strategy"), CASES, ids=lambda c: getattr(c, "stem", c))
def test_example_at_llama3_scale(path: Path, strategy: str) -> None:
    text = path.read_text()
    fn = attnfuse.compile(text, pipeline=_pipeline(strategy))
    function = find_functions(parse_module_with_locations(make_context(), text, str(path))[0])[0]
    batch, seq = 8, 2048
    args = make_inputs(function, batch, seq, seq, device="cuda", seed=1)
    out = fn(*args, return_lse=True)[0]
    torch.cuda.synchronize()
    # The reference runs per batch element to bound its float64 memory; dropout draws
    # depend on the batch index, so a dropout program runs whole.
    chunks = [(0, batch)] if "attn.dropout" in text else [(b, b + 1) for b in range(batch)]
    for lo, hi in chunks:
        sliced = [
            a[lo:hi] if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == batch else a
            for a in args
        ]
        want = reference.run(text, *sliced)
        want = want[0] if isinstance(want, tuple) else want
        assert_close(out[lo:hi], want)
        del want
        torch.cuda.empty_cache()


def test_llama3_16k_matches_sdpa() -> None:
    from attnfuse.reference.rope import RopeParams, apply_rope

    text = (Path(__file__).parents[2] / "examples" / "llama3.attn").read_text()
    fn = attnfuse.compile(text)
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(1, 32, 16384, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(1, 8, 16384, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(1, 8, 16384, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    out = fn(q, k, v)
    params = RopeParams(rotary_dim=128, theta=500000.0)
    positions = torch.arange(16384, device="cuda")
    qr = apply_rope(q.double(), params, positions).float()
    kr = apply_rope(k.double(), params, positions).float()
    want = torch.nn.functional.scaled_dot_product_attention(
        qr, kr, v.float(), is_causal=True, enable_gqa=True
    )
    assert_close(out, want.double(), torch.bfloat16)
