"""Compile emitted Gluon kernels for Hopper (sm_90a) without a GPU, and report resources.

`triton.compile(GluonASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda",
90, 32))` with the argument types a launch on contiguous tensors gives: descriptors typed
as the JIT types a `TensorDescriptor` of the block (`triton.runtime.jit.mangle_type`),
pointers 16-byte aligned, the last-dim strides 1 (the JIT makes them constexpr), other
strides multiples of 16, and the kernel's unspecialized scalars plain `i32`.
"""

from __future__ import annotations

import re
from typing import Any

from attnfuse.backends.triton.metadata import KernelMetadata
from attnfuse.backends.triton.sm90 import ptxas_usage

SHARED_MEMORY_LIMIT = 232448
"""Bytes of shared memory a CTA may use on sm_90 (what Triton reports as the limit)."""

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _descriptor_type(signature: str, block: tuple[int, ...]) -> str:
    """The JIT's type string of a descriptor argument (built on a CPU tensor)."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    element = re.match(r"tensordesc<(\w+)\[", signature)
    assert element is not None, signature
    name = _DTYPES[element.group(1)]
    tensor = torch.empty(block[0] * 2, *block[1:], dtype=getattr(torch, name))
    layout = gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, name))
    return mangle_type(TensorDescriptor.from_tensor(tensor, list(block), layout))


def compile_gluon_for_sm90(source: str, meta: KernelMetadata) -> Any:
    """`triton.compile` kernel `meta.name` of `source` for sm_90a (see the module doc)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from attnfuse.runtime.loader import load_kernels

    fn = load_kernels(source, interpret=False)[meta.name]
    signature: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    last_strides = _last_strides(meta)
    for i, name in enumerate(meta.arg_names):
        kind = meta.signature[name]
        if name in meta.tma:
            signature[name] = _descriptor_type(kind, meta.tma[name])
        elif name in last_strides:
            signature[name] = "constexpr"
            constexprs[(i,)] = 1
        else:
            signature[name] = kind
            if kind.startswith("*") or (kind == "i32" and name not in meta.do_not_specialize):
                attrs[(i,)] = [["tt.divisibility", 16]]
    options: dict[str, Any] = {"num_warps": meta.num_warps}
    if meta.maxnreg is not None:
        options["maxnreg"] = meta.maxnreg
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _last_strides(meta: KernelMetadata) -> set[str]:
    """The last stride argument after each pointer (`X_stride{n}` of the largest n)."""
    out: set[str] = set()
    for name in meta.arg_names:
        if meta.signature[name].startswith("*"):
            strides = [n for n in meta.arg_names if re.fullmatch(re.escape(name) + r"_stride\d+", n)]
            if strides:
                out.add(strides[-1])
    return out


def _mma_local_loads(sass: str) -> int:
    lines = sass.splitlines()
    starts = [0] + [i for i, line in enumerate(lines) if "USETMAXREG.TRY_ALLOC" in line] + [len(lines)]
    count = 0
    for a, b in zip(starts, starts[1:]):
        mma = [i for i in range(a, b) if "HGMMA" in lines[i]]
        if mma:
            count += sum(1 for i in range(mma[0], mma[-1]) if re.search(r"\bLDL\b", lines[i]))
    return count


def gluon_resources(compiled: Any) -> dict[str, Any]:
    """Registers, spills, shared memory and the Hopper instructions of a compiled kernel.
    `local_loads` counts the SASS loads from local memory (a spill that is never read
    back costs one store); `mma_local_loads` those between the first and the last wgmma
    of a partition (partitions start at a `setmaxnreg` increase): reloads inside the
    tensor-core loop, unlike those of per-item scalars around it."""
    from triton.tools.disasm import get_sass

    ptx = compiled.asm["ptx"]
    usage = ptxas_usage(compiled)
    sass = get_sass(compiled.asm["cubin"])
    return {
        "local_loads": len(re.findall(r"\bLDL\b", sass)),
        "mma_local_loads": _mma_local_loads(sass),
        "local_stores": len(re.findall(r"\bSTL\b", sass)),
        "kernel": compiled.metadata.name,
        "num_warps": compiled.metadata.num_warps,
        "regs": usage["regs"],
        "spill_bytes": usage["spill_bytes"],
        "shared": compiled.metadata.shared,
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "tma_load": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)),
        "tma_store": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "tma_reduce": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor", ptx)),
        "setmaxnreg": sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
    }





def compile_module_for_sm90(module: Any) -> dict[str, dict[str, Any]]:
    """Compile every `tile_hopper.kernel` of a lowered module for sm_90a: name -> resources
    (`gluon_resources`). Run it in a process that has not interpreted kernels."""
    from attnfuse.backends.gluon.emitter import emit_gluon
    from attnfuse.backends.gluon.metadata import gluon_kernel_metadata
    from attnfuse.backends.triton.emitter import emit_module
    from attnfuse.dialects.tile_hopper import KernelOp

    source = emit_module(module) + emit_gluon(module)
    kernels = [op for op in module.walk() if isinstance(op, KernelOp)]
    return {k.sym_name.data: gluon_resources(compile_gluon_for_sm90(source, gluon_kernel_metadata(k)))
            for k in kernels}

__all__ = ["SHARED_MEMORY_LIMIT", "compile_gluon_for_sm90", "compile_module_for_sm90", "gluon_resources"]
