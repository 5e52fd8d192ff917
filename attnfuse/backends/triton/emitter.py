"""
Tile IR -> Triton Python source.

A plain walk over a `tile.kernel` (`source.TritonEmitter`): one handler per op
(`op_handlers`, registered in `source._HANDLERS` with `@_emits(...)`), each writing one
line of Python. It knows Triton, not attention; this module holds the entry points. Rules that keep the output valid Triton:

- SSA values become Python names from their name hints (`%offs_m` -> `offs_m`),
  made unique per kernel, so a name is only ever reassigned on purpose (loop-
  carried values), never by accident (Triton would treat it as loop-carried).
- `arith.constant`s are inlined as literals only where Triton's weak typing keeps
  the IR type (an operand of an elementwise op whose other operand is a value,
  `other=`, `tl.full`, loop bounds, pointer offsets); otherwise they are
  materialized with an explicit dtype (`tl.full((), 0.0, tl.float32)`).
- Integer kernel arguments are cast to their declared type on entry, because the
  Triton JIT types integer arguments from their runtime value (and turns 1 into a
  constexpr).
- `scf.for` becomes `for iv in range(lb, ub, step):` (`tl.range(..., flatten=True)`
  when marked `tile.flatten`) with the carried values
  assigned before the loop and reassigned (as a tuple) at the yield; `scf.if`
  becomes if/else assigning the results in both branches.
- Transcendentals on f16/bf16 are computed in f32 (Triton's `tl.exp` & co. only
  take f32/f64) and rounded back; `math.tanh` becomes `1 - 2 / (exp(2x) + 1)`.
"""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects.builtin import ModuleOp

from attnfuse.backends.triton import op_handlers  # noqa: F401  (registers the op handlers)
from attnfuse.backends.triton.metadata import (
    KernelMetadata,
    attr_to_python,
    kernel_arg_names,
    kernel_metadata,
    signature_type,
    tl_dtype,
)
from attnfuse.backends.triton.source import HELPERS, PREAMBLE, TritonEmitter
from attnfuse.dialects import tile


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


def _emit_kernel(kernel: tile.KernelOp) -> tuple[str, set[str]]:
    emitter = TritonEmitter(kernel)
    text = kernel_metadata(kernel).comment() + "\n" + emitter.emit()
    return text, emitter.helpers


def emit_kernel(kernel: tile.KernelOp) -> str:
    """The `@triton.jit` function of one kernel, preceded by its metadata comment
    (helpers it calls, such as `_philox_rand`, come from `emit_module`)."""
    return _emit_kernel(kernel)[0]


def kernels_of(
    module: ModuleOp | tile.KernelOp | Iterable[tile.KernelOp],
) -> list[tile.KernelOp]:
    if isinstance(module, tile.KernelOp):
        return [module]
    if isinstance(module, ModuleOp):
        return [op for op in module.walk() if isinstance(op, tile.KernelOp)]
    return list(module)


def emit_module(module: ModuleOp | tile.KernelOp | Iterable[tile.KernelOp]) -> str:
    """A complete Python module: preamble, helpers, then every `tile.kernel`."""
    parts = [_emit_kernel(k) for k in kernels_of(module)]
    helpers = [HELPERS[name] for name in sorted(set().union(*(h for _, h in parts)))]
    return PREAMBLE + "".join("\n\n" + t for t in [*helpers, *(k for k, _ in parts)])


__all__ = [
    "HELPERS",
    "KernelMetadata",
    "TritonEmitter",
    "attr_to_python",
    "emit_kernel",
    "emit_module",
    "kernel_arg_names",
    "kernel_metadata",
    "kernels_of",
    "signature_type",
    "tl_dtype",
]
