"""Run lowered programs: execute the host code of a function, launching Triton kernels.

The host code (see the `host` dialect) is turned once into a list of Python steps; a
call then only evaluates sizes, allocates outputs and launches. Tensors reach kernels as
a pointer plus per-dim strides, so any strided view works without a copy; a size-1 dim
gets stride 0, which is how broadcast operands (a `[1, H, S, S]` bias) are read.
On CPU tensors the kernels run under the Triton interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerAttr,
    IntegerType,
    TensorType,
)
from xdsl.ir import Attribute, Operation, SSAValue

from attnfuse.backends.triton.emitter import KernelMetadata
from attnfuse.backends.triton.loader import load_kernels
from attnfuse.dialects.host import AllocOp, ConvertOp, DimOp, LaunchOp, ReduceSumOp


def torch_dtype(element_type: Attribute) -> torch.dtype:
    if isinstance(element_type, BFloat16Type):
        return torch.bfloat16
    if isinstance(element_type, Float16Type):
        return torch.float16
    if isinstance(element_type, Float32Type):
        return torch.float32
    if isinstance(element_type, Float64Type):
        return torch.float64
    if isinstance(element_type, IntegerType):
        return {1: torch.bool, 8: torch.int8, 32: torch.int32, 64: torch.int64}[element_type.width.data]
    raise TypeError(f"no torch dtype for {element_type}")


Env = dict[SSAValue, Any]
Step = Callable[[Env, "LaunchContext"], None]


@dataclass
class LaunchContext:
    device: torch.device
    interpret: bool
    kernels: dict[str, Any]
    tables: dict[tuple[int, str], torch.Tensor]


_INT_OPS: dict[type[Operation], Callable[[int, int], int]] = {
    arith.AddiOp: lambda a, b: a + b,
    arith.SubiOp: lambda a, b: a - b,
    arith.MuliOp: lambda a, b: a * b,
    arith.CeilDivSIOp: lambda a, b: -(-a // b),
    arith.DivSIOp: lambda a, b: int(a / b),
    arith.MaxSIOp: max,
    arith.MinSIOp: min,
}


def _kernel_args(values: Sequence[Any]) -> list[Any]:
    flat: list[Any] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            flat.append(value)
            flat.extend(0 if size == 1 else stride for size, stride in zip(value.shape, value.stride()))
        else:
            flat.append(value)
    return flat


def _require_interpreter() -> None:
    import triton.language.standard as standard
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(standard.max, InterpretedFunction):
        raise RuntimeError(
            "CPU tensors run through the Triton interpreter, which Triton selects when it is "
            "imported: set TRITON_INTERPRET=1 before importing triton (importing attnfuse "
            "first does it on machines without CUDA), or pass CUDA tensors"
        )


class HostProgram:
    """The compiled host code of one lowered attention function."""

    def __init__(self, function: func.FuncOp, source: str, metadata: dict[str, KernelMetadata]) -> None:
        self.function = function
        self.source = source
        self.metadata = metadata
        self.steps: list[Step] = [self._step(op) for op in function.body.block.ops]
        self._tables: dict[tuple[int, str], torch.Tensor] = {}

    def _step(self, op: Operation) -> Step:
        if isinstance(op, DimOp):
            index = op.index.value.data
            return lambda env, _: env.__setitem__(op.result, int(env[op.source].shape[index]))
        if isinstance(op, arith.ConstantOp):
            value = op.value
            if isinstance(value, IntegerAttr):
                number = value.value.data
                return lambda env, _: env.__setitem__(op.result, number)
            assert isinstance(value, DenseIntOrFPElementsAttr)
            data = [float(x) for x in value.get_values()]
            key_id = id(op)

            def table(env: Env, ctx: LaunchContext) -> None:
                key = (key_id, str(ctx.device))
                if key not in ctx.tables:
                    ctx.tables[key] = torch.tensor(data, dtype=torch.float32, device=ctx.device)
                env[op.result] = ctx.tables[key]

            return table
        if type(op) in _INT_OPS:
            fn = _INT_OPS[type(op)]
            return lambda env, _: env.__setitem__(op.results[0], fn(env[op.operands[0]], env[op.operands[1]]))
        if isinstance(op, AllocOp):
            ty = op.result.type
            assert isinstance(ty, TensorType)
            dtype = torch_dtype(ty.element_type)
            static = list(ty.get_shape())
            zero = op.zero is not None

            def alloc(env: Env, ctx: LaunchContext) -> None:
                sizes = iter(env[s] for s in op.sizes)
                shape = [next(sizes) if d < 0 else d for d in static]
                make = torch.zeros if zero else torch.empty
                env[op.result] = make(shape, dtype=dtype, device=ctx.device)

            return alloc
        if isinstance(op, LaunchOp):
            name = op.kernel.root_reference.data
            meta = self.metadata[name]

            def launch(env: Env, ctx: LaunchContext) -> None:
                grid = (env[op.grid_x], env[op.grid_y], env[op.grid_z])
                if 0 in grid:
                    return
                args = _kernel_args([env[a] for a in op.args])
                kernel = ctx.kernels[name]
                kernel[grid](*args, num_warps=meta.num_warps, num_stages=meta.num_stages)

            return launch
        if isinstance(op, ReduceSumOp):
            dims = tuple(op.dims.get_values())
            keepdim = op.keepdim is not None
            return lambda env, _: env.__setitem__(
                op.result, env[op.input].sum(dim=dims, keepdim=keepdim, dtype=torch.float32)
            )
        if isinstance(op, ConvertOp):
            ty = op.result.type
            assert isinstance(ty, TensorType)
            dtype = torch_dtype(ty.element_type)
            return lambda env, _: env.__setitem__(op.result, env[op.input].to(dtype))
        if isinstance(op, func.ReturnOp):
            return lambda env, _: env.__setitem__(op, [env[v] for v in op.arguments])
        raise TypeError(f"the runtime cannot execute host op {op.name}")

    def run(self, args: Sequence[Any], device: torch.device) -> list[Any]:
        interpret = device.type == "cpu"
        if interpret:
            _require_interpreter()
        ctx = LaunchContext(device, interpret, load_kernels(self.source, interpret), self._tables)
        env: Env = dict(zip(self.function.args, args))
        for step in self.steps:
            step(env, ctx)
        ret = self.function.body.block.last_op
        return env[ret]  # type: ignore[index]
