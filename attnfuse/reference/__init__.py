"""The executable reference semantics of attn programs (torch float64).

```python
from attnfuse.reference import run

out = run(program_text, q, k, v)                 # one result: a float64 tensor
out, lse = run(module, q, k, v, sinks, entry="gpt_oss")
values = run(program_text, q, k, v, return_all=True)  # {"q": ..., "qr": ..., "s": ...}
```

A program is a `func.func` whose arguments are passed positionally: tensors (torch, or
anything `torch.as_tensor` takes) for tensor arguments, Python ints or 0-d integer tensors
for integer scalars (seeds). Arguments are checked against the signature (count, rank,
static dims, float vs integer), float tensors are cast to float64 (differentiably),
integer tensors to int64 (i1 tensors to bool). Every GPU kernel is tested against this module.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from xdsl.context import Context
from xdsl.dialects import arith, builtin, func, math, tensor
from xdsl.dialects.builtin import IndexType, IntegerType, ModuleOp, TensorType
from xdsl.ir import Attribute
from xdsl.parser import Parser

from attnfuse.dialects.attn import Attn
from attnfuse.reference.interpreter import (
    ReferenceError,
    Value,
    alibi_slopes,
    interpret,
)

__all__ = ["ReferenceError", "alibi_slopes", "check_arguments", "parse_program", "run"]


def _context() -> Context:
    ctx = Context()
    for dialect in (builtin.Builtin, func.Func, arith.Arith, math.Math, tensor.Tensor, Attn):
        ctx.load_dialect(dialect)
    return ctx


def parse_program(text: str, filename: str = "<program>") -> ModuleOp:
    """Parse and verify attn program text (with source locations when available)."""
    ctx = _context()
    try:
        from attnfuse.diagnostics import parse_module_with_locations, verify_module
    except ImportError:
        module = Parser(ctx, text, filename).parse_module()
        module.verify()
        return module
    module, _ = parse_module_with_locations(ctx, text, filename)
    verify_module(module)
    return module


def _entry(program: ModuleOp | func.FuncOp | str, entry: str | None) -> func.FuncOp:
    if isinstance(program, str):
        program = parse_program(program)
    elif isinstance(program, ModuleOp):
        program.verify()
    if isinstance(program, func.FuncOp):
        return program
    funcs = [op for op in program.walk() if isinstance(op, func.FuncOp)]
    if entry is not None:
        funcs = [f for f in funcs if f.sym_name.data == entry]
    if not funcs:
        raise ReferenceError(f"no func.func{'' if entry is None else ' @' + entry} in the program")
    return funcs[0]


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def _check_argument(index: int, name: str, ty: Attribute, data: object) -> Value:
    where = f"argument {index} '{name}'"
    if isinstance(ty, TensorType):
        t = data if isinstance(data, torch.Tensor) else torch.as_tensor(data)
        shape = ty.get_shape()
        if t.dim() != len(shape) or any(w >= 0 and w != g for w, g in zip(shape, t.shape)):
            raise ReferenceError(
                f"{where}: expected shape {_shape_text(shape)}, got {tuple(t.shape)}"
            )
        if isinstance(ty.element_type, (IntegerType, IndexType)):
            if t.is_floating_point() or t.is_complex():
                raise ReferenceError(
                    f"{where}: expected an integer tensor ({ty.element_type}), got {t.dtype}"
                )
            if isinstance(ty.element_type, IntegerType) and ty.element_type.width.data == 1:
                return t.to(torch.bool)
            return t.to(torch.int64)
        if not t.is_floating_point():
            raise ReferenceError(
                f"{where}: expected a float tensor ({ty.element_type}), got {t.dtype}"
            )
        return t.to(torch.float64)
    if isinstance(ty, (IntegerType, IndexType)):
        if isinstance(data, torch.Tensor):
            if data.numel() != 1 or data.is_floating_point():
                raise ReferenceError(
                    f"{where}: expected an integer scalar ({ty}), got {data.dtype} {tuple(data.shape)}"
                )
            return int(data.item())
        if not isinstance(data, int) or isinstance(data, bool):
            raise ReferenceError(f"{where}: expected an int ({ty}), got {type(data).__name__}")
        return data
    if isinstance(data, torch.Tensor):
        return data.to(torch.float64)
    if not isinstance(data, (int, float)):
        raise ReferenceError(f"{where}: expected a float ({ty}), got {type(data).__name__}")
    return float(data)


def check_arguments(fn: func.FuncOp, args: Sequence[object]) -> list[Value]:
    """Check call arguments against `fn`'s signature; cast them to the reference dtypes."""
    inputs = fn.function_type.inputs.data
    if len(args) != len(inputs):
        raise ReferenceError(f"@{fn.sym_name.data} takes {len(inputs)} arguments, got {len(args)}")
    block_args = fn.body.block.args
    return [
        _check_argument(i, block_args[i].name_hint or f"#{i}", ty, data)
        for i, (ty, data) in enumerate(zip(inputs, args))
    ]


def run(
    program: ModuleOp | func.FuncOp | str,
    *args: object,
    entry: str | None = None,
    return_all: bool = False,
) -> object:
    """Run an attn program on concrete inputs with the reference semantics.

    `program` is a module (its first func.func, or the one named `entry`), a func.func,
    or program text. Returns the results: one float64 tensor, or a tuple for several.
    With `return_all`, returns instead a dict of every top-level SSA value by name
    (arguments and op results in program order, named by their `%name`; unnamed values as
    `%<n>`), after the casts (float64 / int64 / int).
    """
    fn = _entry(program, entry)
    results, frame = interpret(fn, check_arguments(fn, args))
    if return_all:
        named: dict[str, Value] = {}
        for n, (value, data) in enumerate(frame.values.items()):
            key = value.name_hint or f"%{n}"
            named[key if key not in named else f"{key}#{n}"] = data
        return named
    return results[0] if len(results) == 1 else tuple(results)
