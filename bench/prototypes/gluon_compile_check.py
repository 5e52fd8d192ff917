"""Compile the Gluon FA3 forward prototypes (gluon_fa3_forward.py) for Hopper (sm_90a)
WITHOUT a GPU and print their resources:

    python bench/prototypes/gluon_compile_check.py [simple|ws|ws_coop ...] [--stages N] [--dump DIR]

For each kernel: registers and spill bytes (ptxas -v on the PTX, as
attnfuse.backends.gluon.sm90.gluon_resources), shared memory (metadata.shared), and whether
the PTX holds wgmma (`wgmma.mma_async`), TMA loads/stores (`cp.async.bulk.tensor`),
mbarrier waits and, for the warp-specialized kernel, `setmaxnreg`. Exit status 1 if a
kernel spills, needs more than 232448 bytes of shared memory, or lacks wgmma / TMA.

How (Triton 3.6): a @gluon.jit function compiles through
`triton.experimental.gluon._runtime.GluonASTSource(fn, signature, constexprs, attrs)`
(the Gluon subclass of ASTSource: language GLUON, its IR starts at TTGIR) passed to
`triton.compile(src, target=GPUTarget("cuda", 90, 32), options={...})`. The signature of
a Gluon TensorDescriptor argument is the string the JIT itself derives
(`triton.runtime.jit.mangle_type(desc)`), e.g.
`tensordesc<bf16[64, 128],NVMMASharedLayout(swizzle_byte_width=128, ...)>`; it works on
CPU tensors, so the arguments are built by gluon_fa3_forward.make_args on small CPU
tensors.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

import gluon_fa3_forward as fa3
from attnfuse.backends.gluon.sm90 import gluon_resources

SMEM_LIMIT = 232448


def compile_variant(variant: str, stages: int | None = None) -> Any:
    """triton.compile the kernel of `variant` for sm_90 with the JIT's own argument types
    (pointers and S specialized as 16-divisible, as a launch with S % 128 == 0 does)."""
    q = torch.empty(1, 32, 128, 128, dtype=torch.bfloat16)
    k = torch.empty(1, 8, 128, 128, dtype=torch.bfloat16)
    args, kwargs, _grid, _o, _lse = fa3.make_args(q, k, k, variant, stages)
    kernel = fa3.KERNELS[variant][0]
    names = kernel.arg_names
    signature: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    values = dict(zip(names, args))
    for i, name in enumerate(names):
        if name in values:
            arg = values[name]
            signature[name] = mangle_type(arg)
            if isinstance(arg, torch.Tensor) or name == "S":
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:  # constexpr parameters: STAGES, num_warps
            signature[name] = "constexpr"
            constexprs[(i,)] = kwargs[name]
    options = {"num_warps": kwargs["num_warps"]}
    if "maxnreg" in kwargs:
        options["maxnreg"] = kwargs["maxnreg"]
    src = GluonASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def report(compiled: Any) -> dict[str, Any]:
    """The library's resource report (`gluon_resources`) plus the mbarrier waits."""
    info = gluon_resources(compiled)
    info["mbarrier_wait"] = len(re.findall(r"mbarrier\.try_wait", compiled.asm["ptx"]))
    return info


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=list(fa3.KERNELS))
    ap.add_argument("--stages", type=int, default=None)
    ap.add_argument("--dump", default=None, help="write <kernel>.{ttgir,ptx} there")
    a = ap.parse_args()
    ok = True
    for variant in a.variants:
        t0 = time.time()
        compiled = compile_variant(variant, a.stages)
        info = report(compiled)
        info["compile_s"] = round(time.time() - t0, 1)
        print(variant, info, flush=True)
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            for ext in ("ttgir", "ptx"):
                Path(a.dump, f"{variant}.{ext}").write_text(compiled.asm[ext])
        if info["spill_bytes"] or info["shared"] > SMEM_LIMIT or not info["wgmma"] or not info["tma_load"]:
            print(f"  FAIL: {variant}", flush=True)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
