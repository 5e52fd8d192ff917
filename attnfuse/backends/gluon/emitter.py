"""
`tile_hopper` -> Gluon Python source.

A `tile_hopper.func` becomes a `@gluon.jit` helper, translated op by op with the Triton
emitter's handlers (`attnfuse.backends.triton.emitter`) and Gluon's spelling of the
same builtins (`gl.where`, `gl.exp2`, `gl.load`, ...). Ops that need a layout in
Gluon (`arange`, `full`, splats) get `gl.AutoLayout()`: Gluon infers their layouts from
the layouts of the arguments the caller passes (an S tile in the wgmma accumulator
layout, row indices sliced from it, ...). Reductions use `gl.max`/`gl.min`/`gl.sum`.

A `tile_hopper.kernel` is printed as its template: the helper functions it defines,
then the kernel, whose `def` line the emitter writes from the op's arguments. Like the
Triton emitter, this knows Gluon, not attention.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from xdsl.dialects import arith
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation

from attnfuse.backends.gluon.metadata import gluon_kernel_metadata
from attnfuse.backends.triton import op_handlers  # noqa: F401  (registers the op handlers)
from attnfuse.backends.triton.source import _HANDLERS, TritonEmitter, _literal, _shape_text, _splat_value
from attnfuse.backends.triton.metadata import identifier, tl_dtype
from attnfuse.dialects import tile
from attnfuse.dialects import tile_hopper as th
from attnfuse.dialects.tile_types import element_type_of, shape_of

PREAMBLE = """\

# Gluon kernels (Hopper, sm_90a)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)
import triton.language as tl
"""

AUTO = "layout=gl.AutoLayout()"
_TL = re.compile(r"\btl\.(?!PropagateNan)")

_Handler = Callable[["GluonEmitter", Any], None]
_GLUON_HANDLERS: dict[type[Operation], _Handler] = {}


def _emits(*op_types: type[Operation]) -> Callable[[_Handler], _Handler]:
    def register(handler: _Handler) -> _Handler:
        for op_type in op_types:
            _GLUON_HANDLERS[op_type] = handler
        return handler

    return register


class GluonEmitter(TritonEmitter):
    """Emits the `@gluon.jit` helper of one `tile_hopper.func`."""

    native_bf16 = True

    def __init__(self, function: th.FuncOp):
        super().__init__(function)  # type: ignore[arg-type]
        self.function = function
        self.taken |= {"gl", "gluon", "mbarrier", "tma", "fence_async_shared", "warpgroup_mma", "warpgroup_mma_wait"}

    def line(self, text: str) -> None:
        super().line(_TL.sub("gl.", text))

    def emit(self) -> str:
        arg_names = [identifier(a.name_hint, f"arg{i}") for i, a in enumerate(self.function.args)]
        self.taken |= set(arg_names)
        for arg, name in zip(self.function.args, arg_names):
            self.names[arg] = name
        self._choose_inlined_constants()
        self.block(self.function.body.block.ops)
        header = ["@gluon.jit", f"def {self.function.sym_name.data}({', '.join(arg_names)}):"]
        return "\n".join(header + self.lines) + "\n"

    def block(self, ops: Iterable[Operation]) -> None:
        start = len(self.lines)
        for op in ops:
            handler = _GLUON_HANDLERS.get(type(op)) or _HANDLERS.get(type(op))
            if handler is None or type(op) in _UNSUPPORTED:
                raise NotImplementedError(f"the Gluon emitter does not support {op.name}")
            handler(self, op)
        if len(self.lines) == start:
            self.line("pass")


_UNSUPPORTED = (tile.DotOp, tile.RandOp, tile.ReturnOp, tile.ProgramIdOp, tile.NumProgramsOp)
"""Tile ops a device function cannot hold (dots and program ids belong to templates)."""


@_emits(arith.ConstantOp)
def _constant(e: GluonEmitter, op: arith.ConstantOp) -> None:
    if op.result in e.inlined:
        return
    value = _splat_value(op)
    if value is None:
        raise NotImplementedError("only scalar and splat constants can be emitted")
    t = op.result.type
    literal = _literal(value, element_type_of(t))
    e.assign(op, f"gl.full({_shape_text(shape_of(t))}, {literal}, {tl_dtype(t)}, {AUTO})")


@_emits(tile.ArangeOp)
def _arange(e: GluonEmitter, op: tile.ArangeOp) -> None:
    e.assign(op, f"gl.arange({op.start.value.data}, {op.end.value.data}, {AUTO})")


@_emits(tile.SplatOp)
def _splat(e: GluonEmitter, op: tile.SplatOp) -> None:
    if op.result in e.aliases:
        return
    t = op.result.type
    e.assign(op, f"gl.full({_shape_text(shape_of(t))}, {e.expr(op.value)}, {tl_dtype(t)}, {AUTO})")


@_emits(tile.BroadcastOp)
def _broadcast(e: GluonEmitter, op: tile.BroadcastOp) -> None:
    if op.result in e.aliases:
        return
    e.assign(op, f"{e.expr(op.input)}.broadcast_to({_shape_text(shape_of(op.result.type))})")


@_emits(tile.TransOp)
def _trans(e: GluonEmitter, op: tile.TransOp) -> None:
    e.assign(op, f"gl.permute({e.expr(op.input)}, (1, 0))")


@_emits(tile.ReduceOp)
def _reduce(e: GluonEmitter, op: tile.ReduceOp) -> None:
    fn = {"max": "gl.max", "min": "gl.min", "sum": "gl.sum"}[op.kind.data.value]
    e.assign(op, f"{fn}({e.expr(op.input)}, axis={op.axis.value.data})")


@_emits(th.ReturnOp)
def _return(e: GluonEmitter, op: th.ReturnOp) -> None:
    values = [e.expr(v) for v in op.values]
    e.line("return " + ", ".join(values))


def emit_function(function: th.FuncOp) -> str:
    """The `@gluon.jit` helper of a device function."""
    return GluonEmitter(function).emit()


def emit_kernel(kernel: th.KernelOp) -> str:
    """The template of a Gluon kernel with its `def` line written from its arguments."""
    meta = gluon_kernel_metadata(kernel)
    head, body = kernel.template.data.split("def __kernel__():\n", 1)
    decorator = "@gluon.jit"
    if meta.do_not_specialize:
        decorator += f"(do_not_specialize={list(meta.do_not_specialize)!r})"
    return "\n".join([head.rstrip("\n"), "", "", meta.comment(), decorator,
                      f"def {meta.name}({', '.join(meta.arg_names)}):", body.rstrip("\n")]) + "\n"


def emit_gluon(module: ModuleOp | Iterable[Operation]) -> str:
    """The Gluon part of a module's source: empty when it has no `tile_hopper` ops."""
    ops = list(module.walk()) if isinstance(module, ModuleOp) else list(module)
    functions = [op for op in ops if isinstance(op, th.FuncOp)]
    kernels = [op for op in ops if isinstance(op, th.KernelOp)]
    if not kernels:
        return ""
    parts = [emit_function(f) for f in functions] + [emit_kernel(k) for k in kernels]
    return PREAMBLE + "".join("\n\n" + p for p in parts)


__all__ = ["GluonEmitter", "emit_function", "emit_gluon", "emit_kernel"]
