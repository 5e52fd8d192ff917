"""Registers, spills and shared memory of a program's kernels compiled for sm_90 (no GPU).

Compiles every kernel the way the JIT specializes it for contiguous [B, H, S, D] tensors
with 16-aligned sizes: the last stride of each tensor is the constant 1, pointers and
the other integer arguments are divisible by 16. Run it before spending GPU time:

    python bench/sm90_resources.py examples/llama3.attn --pipeline '...'
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from attnfuse.backends.triton.emitter import emit_module, kernel_metadata
from attnfuse.dialects.tile import KernelOp


def specialized_compile(kernels: list[KernelOp], name: str) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnfuse.backends.triton.loader import load_kernels

    source = emit_module(kernels)
    meta = next(kernel_metadata(k) for k in kernels if kernel_metadata(k).name == name)
    fn = load_kernels(source, interpret=False)[name]
    signature = dict(meta.signature)
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    names = list(signature)
    ranks: dict[str, int] = {}
    for arg in names:
        if "_stride" in arg:
            base, index = arg.rsplit("_stride", 1)
            ranks[base] = max(ranks.get(base, 0), int(index) + 1)
    for i, arg in enumerate(names):
        if "_stride" in arg:
            base, index = arg.rsplit("_stride", 1)
            if int(index) == ranks[base] - 1:
                constexprs[(i,)] = 1
                signature[arg] = "constexpr"
                continue
        if signature[arg].startswith("*") or signature[arg] in ("i32", "i64"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    ast = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(ast, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": meta.num_warps, "num_stages": meta.num_stages})


def report(program: str, pipeline: str) -> dict[str, dict[str, Any]]:
    from attnfuse.pass_manager import PassManager, make_context
    from attnfuse.diagnostics import parse_module_with_locations

    ctx = make_context()
    text = open(program).read() if program.endswith(".attn") else program
    module, locations = parse_module_with_locations(ctx, text, program)
    PassManager(pipeline).run(module, ctx, locations=locations)
    kernels = [op for op in module.walk() if isinstance(op, KernelOp)]
    out: dict[str, dict[str, Any]] = {}
    for k in kernels:
        name = k.sym_name.data
        compiled = specialized_compile(kernels, name)
        md = compiled.metadata
        out[name] = {**ptxas_usage(compiled.asm["ptx"]), "shared": md.shared,
                     "num_warps": md.num_warps, "num_stages": md.num_stages}
    return out


def ptxas_usage(ptx: str) -> dict[str, int]:
    """Registers and spill bytes, from `ptxas -v` on the kernel's PTX (Triton's own ptxas)."""
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        done = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", path, "-o", os.path.join(tmp, "k.o")],
                              capture_output=True, text=True, check=True)
    text = done.stderr + done.stdout
    regs = re.search(r"Used (\d+) registers", text)
    stores = re.search(r"(\d+) bytes spill stores", text)
    return {"regs": int(regs.group(1)) if regs else -1, "spill_bytes": int(stores.group(1)) if stores else 0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("program")
    parser.add_argument("--pipeline", required=True)
    args = parser.parse_args()
    print(json.dumps(report(args.program, args.pipeline), indent=1))


if __name__ == "__main__":
    main()
