"""Registers, spills and shared memory of a program's kernels compiled for sm_90 (no GPU).

Every kernel is compiled as the JIT specializes it for contiguous tensors with 16-aligned
sizes (`compile_kernel_for_sm90(..., specialize=True)`); run it before spending GPU time:

    python bench/sm90_resources.py examples/llama3.attn --pipeline 'attn-canonicalize,...'
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from attnfuse.backends.triton.sm90 import compile_kernel_for_sm90, ptxas_usage
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.tile import KernelOp
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import DEFAULT_PIPELINE


def report(program: str, pipeline: str) -> dict[str, dict[str, Any]]:
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, Path(program).read_text(), program)
    PassManager(pipeline).run(module, ctx, locations=locations)
    out: dict[str, dict[str, Any]] = {}
    for kernel in (op for op in module.walk() if isinstance(op, KernelOp)):
        compiled = compile_kernel_for_sm90(kernel, specialize=True)
        md = compiled.metadata
        out[kernel.sym_name.data] = {**ptxas_usage(compiled), "shared": md.shared,
                                     "num_warps": md.num_warps, "num_stages": md.num_stages}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("program")
    parser.add_argument("--pipeline", default=DEFAULT_PIPELINE)
    args = parser.parse_args()
    print(json.dumps(report(args.program, args.pipeline), indent=1))


if __name__ == "__main__":
    main()
