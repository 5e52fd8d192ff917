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
    constexprs: dict[str, Any] | None = None,
    *,
    num_warps: int = 4,
    num_stages: int = 3,
) -> Any:
    """
    Compile one kernel of `source` for Hopper (sm_90) without a GPU:
    `triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda",
    90, 32))`. `signature` maps every argument name to its Triton type (`*bf16`,
    `i32`, `fp32`, ..., or `constexpr`). Returns the `CompiledKernel`; its
    `asm["ptx"]` holds the PTX and `asm["cubin"]` the ptxas output.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnfuse.runtime.loader import load_kernels

    fn = load_kernels(source, interpret=False)[kernel_name]
    ast = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(
        ast,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def compile_kernel_for_sm90(kernel: KernelOp) -> Any:
    """Emit `kernel` and compile it for sm_90 with its own signature and options."""
    meta = kernel_metadata(kernel)
    return compile_for_sm90(
        emit_module(kernel),
        meta.name,
        meta.signature,
        num_warps=meta.num_warps,
        num_stages=meta.num_stages,
    )


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
