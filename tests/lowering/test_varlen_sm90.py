"""The kernels of a packed batch compile for sm_90 (no GPU needed) within a Hopper SM's
shared memory and without spilling registers.

examples/varlen.attn (Llama-3-8B heads, bf16) under the default pipeline (K rotated in a
pre-kernel) and with `strategy=fused` (256 x 64 tiles, K rotated in the forward): the
forward, the schedules, the pre-kernels, dQ and dK/dV and the transpose pre-kernels,
compiled as the JIT specializes them for contiguous tensors.

The one exception is dK/dV: at this head dim its default config (64 x 64 blocks, 4 warps,
dK and dV accumulators of 64 x 128 fp32) already spills in the unpacked kernel
(examples/llama3.attn, 552 bytes); the packed kernel, with a few more live scalars
(sequence starts and lengths), may spill at most 256 bytes more.
"""

from __future__ import annotations

import re

import pytest

from attnfuse import examples
from attnfuse.backends.triton.sm90 import compile_kernel_for_sm90, ptx_target, ptxas_usage
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.tile import KernelOp
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import default_pipeline

SM90_SHARED_LIMIT = 232448
"""Bytes of shared memory per block on sm_90 (what Triton's OutOfResources check uses)."""


def _kernels(strategy: str, example: str = "varlen") -> dict[str, KernelOp]:
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, examples.path(example).read_text(), example)
    PassManager(default_pipeline({"rope-fusion": f"strategy={strategy}"})).run(module, ctx, locations=locations)
    return {op.sym_name.data: op for op in module.walk() if isinstance(op, KernelOp)}


CASES = [
    ("hybrid", "varlen_fwd"),
    ("hybrid", "varlen_k_prologue"),
    ("hybrid", "varlen_schedule_q128"),
    ("hybrid", "varlen_bwd_dq"),
    ("hybrid", "varlen_bwd_dkdv"),
    ("hybrid", "varlen_bwd_q_prologue"),
    ("fused", "varlen_fwd"),
]


@pytest.fixture(scope="module")
def kernels() -> dict[str, dict[str, KernelOp]]:
    return {strategy: _kernels(strategy) for strategy in {s for s, _ in CASES}}


def _spill_bytes(kernel: KernelOp) -> int:
    return ptxas_usage(compile_kernel_for_sm90(kernel, specialize=True))["spill_bytes"]


@pytest.mark.parametrize(("strategy", "name"), CASES, ids=lambda c: str(c))
def test_packed_kernel_fits_sm90(kernels: dict[str, dict[str, KernelOp]], strategy: str, name: str) -> None:
    compiled = compile_kernel_for_sm90(kernels[strategy][name], specialize=True)
    assert ptx_target(compiled).startswith(".target sm_90")
    usage = ptxas_usage(compiled)
    if name.endswith("_dkdv"):
        unpacked = _spill_bytes(_kernels(strategy, "llama3")["llama3_bwd_dkdv"])
        assert usage["spill_bytes"] <= unpacked + 256, f"{name}: {usage}, unpacked: {unpacked} bytes spilled"
    else:
        assert usage["spill_bytes"] == 0, f"{name}: {usage}"
    assert 0 < usage["regs"] <= 255
    assert compiled.metadata.shared <= SM90_SHARED_LIMIT, f"{name}: {compiled.metadata.shared} bytes of shared memory"


def _kind(name: str) -> str:
    """A kernel name without the backward marker, side and block size."""
    return re.sub(r"_(q|k)(_|\d)", r"_x\2", name.replace("_bwd", "")).rstrip("0123456789")


def test_every_packed_kernel_is_listed(kernels: dict[str, dict[str, KernelOp]]) -> None:
    """The cases above cover each kind of kernel the default pipeline builds but the RoPE
    tables and the delta preprocess (per-position and per-token: the same as unpacked)."""
    built = {_kind(name) for name in kernels["hybrid"]}
    assert built - {_kind(name) for _, name in CASES} == {"varlen_rope_table", "varlen_preprocess"}
