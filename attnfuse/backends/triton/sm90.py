"""Compile emitted kernels for Hopper (sm_90) without a GPU.

`compile_kernel_for_sm90` compiles one kernel in-process: `triton.compile` with
`GPUTarget("cuda", 90, 32)` (no GPU needed). `compile_all` runs that in a fresh Python
process, so that test suites can compile the kernels of several programs in parallel on
several cores:

```
python -m attnfuse.backends.triton.sm90 kernels.json   # {"source": ..., "kernels": [...]}
```
prints `{"<kernel>": ".target sm_90a", ...}` as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from typing import Any

from attnfuse.backends.triton.emitter import emit_module, kernel_metadata
from attnfuse.dialects.tile import KernelOp

SM90_PTX_TARGET = ".target sm_90"
"""Prefix of the PTX target line for Hopper (Triton emits `sm_90a`)."""


def compile_for_sm90(
    source: str,
    kernel_name: str,
    signature: dict[str, str],
    constexprs: dict[tuple[int, ...], Any] | None = None,
    *,
    num_warps: int = 4,
    num_stages: int = 3,
    attrs: dict[tuple[int, ...], Any] | None = None,
) -> Any:
    """
    Compile one kernel of `source` for Hopper (sm_90) without a GPU:
    `triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda",
    90, 32))`. `signature` maps every argument name to its Triton type (`*bf16`,
    `i32`, `fp32`, ..., or `constexpr`). Returns the `CompiledKernel`; its
    `asm["ptx"]` holds the PTX, `asm["cubin"]` the ptxas output and `metadata.shared`
    the shared memory it needs.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnfuse.runtime.loader import load_kernels

    fn = load_kernels(source, interpret=False)[kernel_name]
    ast = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(
        ast,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def compile_kernel_for_sm90(kernel: KernelOp, *, specialize: bool = False) -> Any:
    """Emit `kernel` and compile it for sm_90 with its own signature and options.

    `specialize` compiles it as the JIT does for contiguous tensors with 16-aligned
    sizes (pointers and specialized integers divisible by 16, each tensor's last stride
    the constant 1): the form whose loads are vectorized and software-pipelined, so its
    registers and shared memory are those of a real launch.

    The kernel is compiled under the fixed name `kernel`: Triton's compile cache keys on
    the function's name and source, so kernels that differ only in name (one program's
    forward and another's with the same blocks) compile once per cache."""
    meta = kernel_metadata(kernel)
    signature = dict(meta.signature)
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    if specialize:
        last_stride = {f"{arg}_stride{rank - 1}" for arg, rank in _tensor_ranks(signature).items()}
        for i, (arg, ty) in enumerate(signature.items()):
            if arg in last_stride:
                constexprs[(i,)] = 1
                signature[arg] = "constexpr"
            elif ty.startswith("*") or (ty in ("i32", "i64") and arg not in meta.do_not_specialize):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return compile_for_sm90(
        source_named_kernel(kernel),
        "kernel",
        signature,
        constexprs,
        num_warps=meta.num_warps,
        num_stages=meta.num_stages,
        attrs=attrs,
    )


def source_named_kernel(kernel: KernelOp) -> str:
    """The Triton source of `kernel` with its function renamed `kernel`: kernels that
    differ only in name have the same one."""
    return emit_module(kernel).replace(f"def {kernel.sym_name.data}(", "def kernel(", 1)


def _tensor_ranks(signature: dict[str, str]) -> dict[str, int]:
    """Tensor argument name -> rank, from the `<name>_stride<i>` arguments after it."""
    ranks: dict[str, int] = {}
    for arg in signature:
        base, sep, index = arg.rpartition("_stride")
        if sep and index.isdigit() and base in signature:
            ranks[base] = max(ranks.get(base, 0), int(index) + 1)
    return ranks


def ptxas_usage(compiled: Any) -> dict[str, int]:
    """Registers and spill-store bytes of a compiled kernel, from Triton's own `ptxas -v`
    on its PTX (the CompiledKernel only learns them when loaded on a GPU)."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        done = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(ptx) + ".o"],
                              capture_output=True, text=True, check=True)
    text = done.stderr + done.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores", text)
    return {"regs": int(regs.group(1)) if regs else -1, "spill_bytes": int(spills.group(1)) if spills else 0}


def spills_in_loops(compiled: Any) -> int:
    """Spill loads and stores (SASS `LDL` / `STL`) inside a loop of a compiled kernel's
    machine code (between a backward branch and its target, from `cuobjdump -sass` on its
    cubin): the spills that cost on every iteration. ptxas may park a value from before a
    kernel's loops to after them, one store and one load per program."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    cuobjdump = Path(get_ptxas(90).path).with_name("cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    spills: list[int] = []
    loops: list[tuple[int, int]] = []
    for line in sass.splitlines():
        at = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if at is None:
            continue
        pc, text = int(at.group(1), 16), at.group(2)
        if re.search(r"\b(LDL|STL)\b", text):
            spills.append(pc)
        branch = re.search(r"\bBRA\s+0x([0-9a-f]+)", text)  # cuobjdump gives branch targets as addresses
        if branch and int(branch.group(1), 16) <= pc:
            loops.append((int(branch.group(1), 16), pc))
    return sum(any(lo <= pc <= hi for lo, hi in loops) for pc in spills)


def ptx_target(compiled: Any) -> str:
    """The `.target` line of a compiled kernel's PTX (e.g. `.target sm_90a`)."""
    for line in compiled.asm["ptx"].splitlines():
        if line.startswith(".target"):
            return line.strip()
    raise ValueError("no .target line in the PTX")


def compile_all(kernels: Iterable[KernelOp], timeout: float = 600) -> dict[str, str]:
    """Compile every kernel for sm_90 in a subprocess; kernel name -> PTX `.target` line."""
    kernels = list(kernels)
    payload = {
        "source": emit_module(kernels),
        "kernels": [
            {
                "name": m.name,
                "signature": m.signature,
                "num_warps": m.num_warps,
                "num_stages": m.num_stages,
            }
            for m in (kernel_metadata(k) for k in kernels)
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
        path = f.name
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "attnfuse.backends.triton.sm90", path],
            capture_output=True, text=True, env=env, timeout=timeout, check=False,
        )
    finally:
        os.unlink(path)
    if done.returncode != 0:
        raise RuntimeError(f"sm_90 compilation failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _main(path: str) -> dict[str, Any]:
    with open(path) as f:
        payload = json.load(f)
    targets: dict[str, Any] = {}
    for kernel in payload["kernels"]:
        compiled = compile_for_sm90(
            payload["source"],
            kernel["name"],
            kernel["signature"],
            num_warps=kernel["num_warps"],
            num_stages=kernel["num_stages"],
        )
        targets[kernel["name"]] = ptx_target(compiled)
    return targets


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1])))
