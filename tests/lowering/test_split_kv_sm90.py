"""The split-KV kernels compile for Hopper (sm_90) without spills and within shared memory.

The split and combine kernels of the default pipeline for real decode shapes, compiled
as the JIT specializes them (contiguous tensors, 16-aligned sizes), checked with ptxas:
no spill stores, at most the 232448 bytes of shared memory a block may use on sm_90,
and at most half an SM's (the split kernel is sized for two programs per SM, the
persistent kernel runs two per SM), except for the wide kernel, whose calls' programs fit
one wave, one program per SM.
"""

from __future__ import annotations

import pytest

from attnfuse.backends.triton.sm90 import compile_kernel_for_sm90, ptxas_usage
from attnfuse.dialects.tile import KernelOp
from attnfuse.lowering.tile_fit import SHARED_MEMORY_BUDGET
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import default_pipeline
from attnfuse.reference import parse_program

SM90_SHARED_LIMIT = 232448


def program(hq: int, hkv: int, d: int, dtype: str, *, window: int | None = None, sinks: bool = False,
            rope: bool = False) -> str:
    q, k = f"tensor<?x{hq}x?x{d}x{dtype}>", f"tensor<?x{hkv}x?x{d}x{dtype}>"
    s = f"!attn.scores<?x{hq}x?x?xf32>"
    args = f"%q: {q}, %k: {k}, %v: {k}" + (f", %sinks: tensor<{hq}xf32>" if sinks else "")
    lines = [f"%s = attn.scores {'%qr' if rope else '%q'}, %k : {q}, {k} -> {s}",
             f'%m = attn.mask causal %s {{align = "bottom_right"}} : {s}']
    if rope:
        lines.insert(0, f"%qr = attn.rope %q {{theta = 500000.0}} : {q}")
    if window is not None:
        lines.append(f'%w = attn.mask sliding_window %m {{align = "bottom_right", left = {window}}} : {s}')
    last = "%w" if window is not None else "%m"
    sink = f" sinks %sinks : {s}, tensor<{hq}xf32>" if sinks else f" : {s}"
    lines.append(f"%p = attn.softmax {last}{sink} -> !attn.probs<?x{hq}x?x?xf32>")
    lines.append(f"%o = attn.weighted_sum %p, %v : !attn.probs<?x{hq}x?x?xf32>, {k} -> {q}")
    body = "\n  ".join(lines)
    return f"func.func @f({args}) -> {q} {{\n  {body}\n  func.return %o : {q}\n}}"


CASES = {
    "llama3_8b": program(32, 8, 128, "bf16", rope=True),
    "llama3_8b_rope_at_cache_end": program(32, 8, 128, "bf16", rope=True).replace(
        "{theta = 500000.0}", '{theta = 500000.0, align = "bottom_right"}'),
    "gpt_oss": program(64, 8, 64, "bf16", window=127, sinks=True),
    "mha_d256": program(16, 16, 256, "bf16"),
    "mqa_f32": program(16, 2, 128, "f32"),
    "wide_gqa": program(32, 8, 256, "bf16"),
    "group8_d128": program(32, 4, 128, "f16", sinks=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_split_kernels_compile_for_sm90(name: str) -> None:
    module = parse_program(CASES[name])
    PassManager(default_pipeline(without=["lower-backward"])).run(module, make_context())
    kernels = {op.sym_name.data: op for op in module.walk() if isinstance(op, KernelOp)}
    for kernel_name in ("f_split_kv", "f_split_kv_small", "f_split_kv_wide", "f_split_kv_persistent",
                        "f_split_kv_combine"):
        if kernel_name not in kernels:  # a group of more than 16 heads, or a 16-row full tile: one tier;
            continue  # the wide kernel: 16-bit inputs, head dims up to 128
        compiled = compile_kernel_for_sm90(kernels[kernel_name], specialize=True)
        usage = ptxas_usage(compiled)
        shared = compiled.metadata.shared
        assert usage["spill_bytes"] == 0, f"{name} {kernel_name}: {usage}"
        assert shared <= SM90_SHARED_LIMIT, f"{name} {kernel_name}: {shared} bytes of shared memory"
        if kernel_name not in ("f_split_kv_combine", "f_split_kv_wide"):
            assert shared <= SHARED_MEMORY_BUDGET // 2, f"{name}: {shared} bytes, more than half an SM"
    if name == "llama3_8b":  # the wide kernel's three stages of 128-key K and V tiles
        wide = compile_kernel_for_sm90(kernels["f_split_kv_wide"], specialize=True)
        assert wide.metadata.shared > SHARED_MEMORY_BUDGET // 2, wide.metadata.shared


def test_merging_split_kernels_compile_for_sm90() -> None:
    """`split-kv{merge=true}` for Llama-3-8B: the 16-row kernels with the merge of up to 16
    splits (a `[64, 128]` fp32 tile of partial outputs) still compile without spills."""
    module = parse_program(CASES["llama3_8b"])
    pipeline = default_pipeline(without=["lower-backward"]).replace("split-kv", "split-kv{merge=true}")
    PassManager(pipeline).run(module, make_context())
    kernels = {op.sym_name.data: op for op in module.walk() if isinstance(op, KernelOp)}
    for kernel_name in ("f_split_kv_small", "f_split_kv_wide"):
        compiled = compile_kernel_for_sm90(kernels[kernel_name], specialize=True)
        assert ptxas_usage(compiled)["spill_bytes"] == 0, kernel_name
        assert "atom.global.gpu.acq_rel.add" in compiled.asm["ptx"], kernel_name  # the ticket, device scope
