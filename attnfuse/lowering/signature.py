"""Kernel signatures: which host values a kernel reads, and as which kernel arguments.

A generator declares what it needs (`tensor`, `scalar`), then `start` creates the
`tile.kernel` and binds every declaration to its kernel arguments. The host values, in
declaration order, are the operands of the matching `host.launch`: a tensor becomes a
pointer plus one i32 stride per dim (see the host dialect).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import DictionaryAttr, TensorType, i32, i64
from xdsl.ir import Attribute, SSAValue

from attnfuse.dialects.tile_builder import TileBuilder, Value
from attnfuse.dialects.tile_types import PtrType


@dataclass
class TensorArg:
    """A tensor read or written by a kernel: its pointer and element strides."""

    name: str
    host: SSAValue
    rank: int
    ptr: SSAValue | None = None
    strides: list[SSAValue] = field(default_factory=list)
    row_start: SSAValue | None = None
    """The first row (dim 2) a program reads: its sequence's start in a packed batch."""

    def base(self, b: TileBuilder, *indices: Value) -> SSAValue:
        """`ptr` advanced by `sum(index_i * stride_i)` over the leading dims (and to
        `row_start`), in i64."""
        assert self.ptr is not None, "kernel not started"
        offset: Value = 0
        for index, stride in zip(indices, self.strides):
            offset = b.add(offset, b.mul(b.to_i64(index), b.to_i64(stride)))
        if self.row_start is not None:
            offset = b.add(offset, b.mul(b.to_i64(self.row_start), b.to_i64(self.strides[2])))
        if isinstance(offset, int):
            return self.ptr
        return b.ptr_add(self.ptr, offset, name=f"{self.name}_base")

    def offsets(self, b: TileBuilder, *indices: Value, first_dim: int = 0) -> SSAValue | int:
        """`sum(index_i * stride_{first_dim + i})` in i32 (tile offsets)."""
        total: Value = 0
        for index, stride in zip(indices, self.strides[first_dim:]):
            total = b.add(total, b.mul(index, stride))
        return total  # type: ignore[return-value]


@dataclass
class ScalarArg:
    name: str
    host: SSAValue
    type: Attribute
    value: SSAValue | None = None


class KernelSignature:
    """Collects the arguments of one kernel (see the module docstring)."""

    def __init__(self, remap: dict[SSAValue, SSAValue] | None = None) -> None:
        self.args: list[TensorArg | ScalarArg] = []
        self._by_host: dict[tuple[int, str], TensorArg | ScalarArg] = {}
        self.remap = remap or {}
        """Host values to use instead of the program's own (a backward function's args)."""

    def tensor(self, name: str, host: SSAValue) -> TensorArg:
        host = self.remap.get(host, host)
        key = (id(host), "tensor")
        if key in self._by_host:
            found = self._by_host[key]
            assert isinstance(found, TensorArg)
            return found
        assert isinstance(host.type, TensorType), host.type
        arg = TensorArg(name, host, len(host.type.get_shape()))
        self.args.append(arg)
        self._by_host[key] = arg
        return arg

    def scalar(self, name: str, host: SSAValue) -> ScalarArg:
        host = self.remap.get(host, host)
        key = (id(host), "scalar")
        if key in self._by_host:
            found = self._by_host[key]
            assert isinstance(found, ScalarArg)
            return found
        arg = ScalarArg(name, host, host.type)
        self.args.append(arg)
        self._by_host[key] = arg
        return arg

    def host_operands(self) -> list[SSAValue]:
        return [a.host for a in self.args]

    def start(
        self, kernel_name: str, *, num_warps: int, num_stages: int, launch: dict[str, Attribute],
        f32_dot: str = "ieee",
    ) -> TileBuilder:
        """A builder of the kernel with this signature's arguments; its f32 dots take the
        precision `f32_dot`."""
        decls: list[tuple[str, Attribute]] = []
        for arg in self.args:
            if isinstance(arg, TensorArg):
                assert isinstance(arg.host.type, TensorType)
                decls.append((arg.name, PtrType(arg.host.type.element_type)))
                decls += [(f"{arg.name}_stride{i}", i32) for i in range(arg.rank)]
            else:
                decls.append((arg.name, arg.type if arg.type in (i32, i64) else arg.type))
        b = TileBuilder.kernel(
            kernel_name,
            decls,
            num_warps=num_warps,
            num_stages=num_stages,
            launch=DictionaryAttr(launch),
        )
        b.f32_dot = f32_dot
        values = iter(b.args)
        for arg in self.args:
            if isinstance(arg, TensorArg):
                arg.ptr = next(values)
                arg.strides = [next(values) for _ in range(arg.rank)]
            else:
                arg.value = next(values)
        return b


def scalar_values(args: Sequence[ScalarArg]) -> list[SSAValue]:
    out: list[SSAValue] = []
    for a in args:
        assert a.value is not None
        out.append(a.value)
    return out
