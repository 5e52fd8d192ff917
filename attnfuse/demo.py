"""The AttnFuse demo: one attention program from text to a checked kernel run.

```sh
python -m attnfuse.demo                          # Llama-3 attention (examples/llama3.attn)
python -m attnfuse.demo --program gemma2         # another example, by name or by path
python -m attnfuse.demo --strategy fused --full-ir
python -m attnfuse.demo --batch 2 --seq 128
```

It does the README's main job, step by step:

1. parse the program and print it;
2. run the default pipeline (`attnfuse.passes.DEFAULT_PIPELINE`) through the pass
   manager, printing the IR after every pass; after `lower-to-tile` the host function is
   printed whole and each `tile.kernel` abbreviated (`--full-ir` prints them whole);
3. print the Triton source of the forward kernel;
4. compile the program with `attnfuse.compile` and run it: on a CUDA GPU at B=1, S=2048,
   otherwise through the Triton interpreter on the CPU at B=1, S=64 (all heads);
5. compare the output with the float64 reference (`attnfuse.reference.run`) under the
   tolerance of the output dtype (`attnfuse.testing`) and print PASS or FAIL.

The exit status is 0 on PASS, 1 on FAIL.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import attnfuse  # first: selects the Triton interpreter on machines without CUDA

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.printer import Printer

from attnfuse import examples
from attnfuse.backends.gluon.emitter import emit_gluon
from attnfuse.backends.triton.emitter import emit_module, kernel_metadata
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.tile import KernelOp
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import default_pipeline
from attnfuse.passes.rope_fusion import STRATEGIES, choose_strategy
from attnfuse.program import find_functions
from attnfuse.reference import parse_program
from attnfuse.reference import run as reference_run
from attnfuse.testing import TOLERANCE, assert_close, make_inputs, max_error

KERNEL_PREVIEW_LINES = 40
"""Lines of each tile.kernel printed after lower-to-tile (without --full-ir)."""


def header(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def op_text(op: Operation) -> str:
    buf = io.StringIO()
    Printer(stream=buf).print_op(op)
    return buf.getvalue().rstrip("\n")


def resolve_program(name: str | None) -> Path:
    """A path, or the name of a shipped example (`llama3`, `gemma2.attn`, ...)."""
    if name is None:
        return examples.path("llama3")
    path = Path(name)
    if path.is_file():
        return path
    return examples.path(name)


def pipeline_for(strategy: str) -> str:
    """The default pipeline with rope-fusion's strategy set to `strategy`."""
    return default_pipeline({"rope-fusion": f"strategy={strategy}"})


def print_module(module: ModuleOp, full_ir: bool) -> None:
    """Print a module op by op; abbreviate tile.kernels unless `full_ir`."""
    print("builtin.module {")
    for op in module.ops:
        lines = op_text(op).splitlines()
        if isinstance(op, KernelOp) and not full_ir and len(lines) > KERNEL_PREVIEW_LINES + 1:
            shown = lines[:KERNEL_PREVIEW_LINES]
            hidden = len(lines) - KERNEL_PREVIEW_LINES - 1
            shown.append(f"  // ... {hidden} more lines ({len(lines)} in all; --full-ir prints them)")
            shown.append(lines[-1])
            lines = shown
        for line in lines:
            print("  " + line)
    print("}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnfuse.demo",
        description="Compile an attention program step by step, run it and check it against the reference.",
    )
    parser.add_argument("--program", help="a .attn file or the name of an example (default: llama3)")
    parser.add_argument("--strategy", default="auto", choices=STRATEGIES,
                        help="rope-fusion strategy (default: auto)")
    parser.add_argument("--batch", type=int, help="batch size (default: 1)")
    parser.add_argument("--seq", type=int, help="sequence length (default: 2048 on CUDA, 64 on the CPU)")
    parser.add_argument("--full-ir", action="store_true", help="print the tile kernels in full")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    batch = args.batch or 1
    seq = args.seq or (2048 if cuda else 64)
    started = time.perf_counter()

    # 1. The program.
    path = resolve_program(args.program)
    text = path.read_text()
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, text, str(path))
    header(f"program: {path}")
    print(module)

    # 2. The pipeline, with the IR after each pass.
    pipeline = pipeline_for(args.strategy)
    header(f"pipeline: {pipeline}")
    print(f"rope-fusion strategy: {args.strategy}", end="")
    if args.strategy == "auto":
        print(f" (resolves to {choose_strategy('auto', None)})", end="")
    print()

    def after(p: ModulePass, mod: ModuleOp) -> None:
        header(f"IR after {p.name}")
        print_module(mod, args.full_ir)

    t0 = time.perf_counter()
    PassManager(pipeline, print_ir_after=after).run(module, ctx, locations=locations)
    pipeline_s = time.perf_counter() - t0
    kernels = [op for op in module.ops if isinstance(op, KernelOp)]
    print(f"\n{len(kernels)} kernel(s):")
    for kernel in kernels:
        meta = kernel_metadata(kernel)
        role = " (forward)" if meta.launch.get("role") == "forward" else ""
        print(f"  @{meta.name}{role}: num_warps={meta.num_warps}, num_stages={meta.num_stages}, "
              f"{len(op_text(kernel).splitlines())} lines of tile IR")

    # 3. The Triton source of the forward kernel.
    forward = next((k for k in kernels if kernel_metadata(k).launch.get("role") == "forward"), kernels[-1])
    header(f"Triton source of @{forward.sym_name.data}")
    print(emit_module(forward))

    # 4. Compile and run.
    header(f"run on {device}" + ("" if cuda else " (Triton interpreter)"))
    t0 = time.perf_counter()
    fn = attnfuse.compile(text, pipeline=pipeline)
    compile_s = time.perf_counter() - t0
    every = [op for op in module.walk() if isinstance(op, KernelOp)]
    if fn.triton_source != emit_module(every) + emit_gluon(module):  # what compile emits (api._lower)
        print("warning: attnfuse.compile produced different Triton source than printed above")
    function = find_functions(parse_program(text, str(path)))[0]
    inputs = make_inputs(function, batch, seq, seq, device=device)
    shapes = ", ".join(
        f"{p.name}{list(a.shape) if isinstance(a, torch.Tensor) else ''}"
        f"{' ' + str(a.dtype).removeprefix('torch.') if isinstance(a, torch.Tensor) else '=' + str(a)}"
        for p, a in zip(fn.parameters, inputs)
    )
    print(f"inputs: {shapes}")
    t0 = time.perf_counter()
    result = fn(*inputs)
    if cuda:
        torch.cuda.synchronize()
    run_s = time.perf_counter() - t0
    out = result[0] if isinstance(result, tuple) else result
    print(f"output: {list(out.shape)} {str(out.dtype).removeprefix('torch.')}")
    print(f"pipeline {pipeline_s:.2f} s, attnfuse.compile {compile_s:.2f} s, first call {run_s:.2f} s")

    # 5. Check against the float64 reference.
    header("check against the float64 reference (attnfuse.reference.run)")
    t0 = time.perf_counter()
    expected = reference_run(text, *inputs)
    ref = expected[0] if isinstance(expected, tuple) else expected
    ref_s = time.perf_counter() - t0
    atol, rtol = TOLERANCE[out.dtype]
    error = max_error(out, ref)
    print(f"reference {ref_s:.2f} s")
    print(f"max |out - ref| = {error:.3e}")
    print(f"tolerance: |out - ref| <= {atol} + {rtol} * |ref| ({str(out.dtype).removeprefix('torch.')})")
    try:
        assert_close(out, ref)
    except AssertionError as e:
        print(f"FAIL: {e}")
        return 1
    print(f"PASS (total {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
