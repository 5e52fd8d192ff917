"""Every default tile config fits a Hopper SM: the forward, dQ and dK/dV kernels of the
default pipeline, compiled for sm_90 as the JIT specializes them (contiguous tensors,
16-aligned sizes), need at most the shared memory an H100/H200 SM has (232448 bytes).

Head dims cover powers of two and padded sizes (80 -> 128, 160 -> 256); `hybrid` (the
default) and `fused` (K rotated in the kernel: two more K tiles of shared memory);
f16 allocates as bf16, so bf16 and f32 are compiled. The forward's stage count comes from
`pipeline_stages`, whose formula must match what Triton allocates (checked exactly for the
forward).
"""

from __future__ import annotations

import pytest
from xdsl.dialects.builtin import ModuleOp

from attnfuse.backends.triton.sm90 import compile_kernel_for_sm90
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.tile import KernelOp
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import default_pipeline
from attnfuse.passes.lower_to_tile import SHARED_MEMORY_BUDGET

SM90_SHARED_LIMIT = 232448
"""Bytes of shared memory per block on sm_90 (what Triton's OutOfResources check uses)."""


def program(head_dim: int, dtype: str) -> str:
    q, k = f"tensor<?x4x?x{head_dim}x{dtype}>", f"tensor<?x2x?x{head_dim}x{dtype}>"
    return f"""func.func @f(%q: {q}, %k: {k}, %v: {k}) -> {q} {{
  %qr = attn.rope %q {{theta = 10000.0}} : {q}
  %kr = attn.rope %k {{theta = 10000.0}} : {k}
  %s = attn.scores %qr, %kr : {q}, {k} -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, {k} -> {q}
  func.return %o : {q}
}}"""


def lowered(head_dim: int, dtype: str, strategy: str, backward: bool) -> ModuleOp:
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, program(head_dim, dtype), "shared.attn")
    pipeline = default_pipeline({"rope-fusion": f"strategy={strategy}"})
    if not backward:
        pipeline = pipeline.replace("lower-backward,", "")
    PassManager(pipeline).run(module, ctx, locations=locations)
    return module


CASES = [
    *((d, "bf16", s, True) for d in (16, 128, 160, 256) for s in ("hybrid", "fused")),
    # f32 dots compile slowly: the default forward only (tf32x3 dots), at three widths
    *((d, "f32", "hybrid", False) for d in (64, 128, 256)),
]


@pytest.mark.parametrize(("head_dim", "dtype", "strategy", "backward"), CASES,
                         ids=lambda c: str(c))
def test_default_configs_fit_sm90(head_dim: int, dtype: str, strategy: str, backward: bool) -> None:
    module = lowered(head_dim, dtype, strategy, backward)
    wanted = ("_fwd", "_bwd_dq", "_bwd_dkdv") if backward else ("_fwd",)
    kernels = [op for op in module.walk() if isinstance(op, KernelOp)
               and op.sym_name.data.endswith(wanted)]
    assert len(kernels) == len(wanted)
    for kernel in kernels:
        compiled = compile_kernel_for_sm90(kernel, specialize=True)
        shared = compiled.metadata.shared
        name = kernel.sym_name.data
        assert shared <= SM90_SHARED_LIMIT, f"{name}: {shared} bytes of shared memory"
        if name.endswith("_fwd") and compiled.metadata.num_stages > 1:
            # the forward's budget formula is Triton's allocation (a larger one would pick
            # more stages than fit; a smaller one would leave speed behind)
            assert shared <= SHARED_MEMORY_BUDGET


def test_llama3_shape_gets_three_stages_of_128_keys() -> None:
    """The measured-fastest Llama-3 forward config is what the defaults pick."""
    module = lowered(128, "bf16", "hybrid", False)
    fwd = next(op for op in module.walk() if isinstance(op, KernelOp) and op.sym_name.data == "f_fwd")
    compiled = compile_kernel_for_sm90(fwd, specialize=True)
    assert (compiled.metadata.num_warps, compiled.metadata.num_stages) == (8, 3)
    assert compiled.metadata.shared == 2 * (128 * 128 + 3 * 128 * 256)
