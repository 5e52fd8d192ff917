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


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LOCAL_LOAD = re.compile(r"(@!?U?P\w+\s+)?LDL\b")
_LOCAL_STORE = re.compile(r"(@!?U?P\w+\s+)?STL\b")
_BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)\s*$")


def sass_instructions(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) of every SASS instruction of `cubin`, from `cuobjdump -sass`
    (Triton's `get_sass` stops at the first line it does not parse, which cut the
    producer partitions of our kernels)."""
    import os
    import subprocess
    import tempfile

    from triton.tools.disasm import path_to_cuobjdump

    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        text = subprocess.check_output([path_to_cuobjdump(), "-sass", path], text=True)
    finally:
        os.remove(path)
    return [(int(m.group(1), 16), m.group(2)) for m in _SASS_LINE.finditer(text)]


def hot_loop_local_loads(instructions: list[tuple[int, str]]) -> int:
    """Local-memory loads (spill reloads) inside the innermost loops that issue wgmma or
    wait on / arrive at mbarriers: the KV loops of the consumers and the producer's tile
    loop (a loop is a backward branch's range; libdevice's argument reduction loop, which
    reads its local array once per item, waits on no barrier)."""
    loops = []
    for address, text in instructions:
        branch = _BRANCH.search(text)
        if branch and int(branch.group(1), 16) <= address:
            loops.append((int(branch.group(1), 16), address))
    hot = [(lo, hi) for lo, hi in loops
           if any(lo <= a <= hi and ("HGMMA" in t or "SYNCS" in t) for a, t in instructions)]
    innermost = [(lo, hi) for lo, hi in hot
                 if not any((lo, hi) != (l2, h2) and lo <= l2 and h2 <= hi for l2, h2 in hot)]
    return sum(1 for a, t in instructions
               if _LOCAL_LOAD.match(t) and any(lo <= a <= hi for lo, hi in innermost))


def gluon_resources(compiled: Any) -> dict[str, Any]:
    """Registers, spills, shared memory and the Hopper instructions of a compiled kernel.
    `local_loads` counts the SASS loads from local memory (a spill that is never read
    back costs one store); `loop_local_loads` those inside the hot loops
    (`hot_loop_local_loads`), unlike reloads of per-item scalars around them."""
    ptx = compiled.asm["ptx"]
    usage = ptxas_usage(compiled)
    sass = sass_instructions(compiled.asm["cubin"])
    return {
        "local_loads": sum(1 for _, t in sass if _LOCAL_LOAD.match(t)),
        "loop_local_loads": hot_loop_local_loads(sass),
        "barriers": sum(1 for _, t in sass if t.startswith("BAR.SYNC")),
        "local_stores": sum(1 for _, t in sass if _LOCAL_STORE.match(t)),
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
