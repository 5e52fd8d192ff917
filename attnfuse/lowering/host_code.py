"""`HostCode`: appends host-dialect ops (sizes, buffers, launches, reductions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xdsl.builder import Builder
from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    IntegerAttr,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
    f32,
    i32,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.rewriter import InsertPoint

from attnfuse.dialects.host import AllocOp, ConvertOp, LaunchOp, ReduceSumOp, SmCountOp


class HostCode:
    """Appends host ops before the first op of an attention function."""

    def __init__(self, insertion_point: InsertPoint) -> None:
        self.builder = Builder(insertion_point)
        self.tables: dict[tuple[float, ...], SSAValue] = {}
        self._sms: SSAValue | None = None

    def emit(self, op: Operation, name: str | None = None) -> SSAValue:
        self.builder.insert(op)
        if op.results and name:
            op.results[0].name_hint = name
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def const(self, value: int, name: str | None = None) -> SSAValue:
        return self.emit(arith.ConstantOp(IntegerAttr(value, i32)), name)

    def table(self, values: Sequence[float]) -> SSAValue:
        key = tuple(values)
        if key not in self.tables:
            ty = TensorType(f32, [len(values)])
            attr = DenseIntOrFPElementsAttr.from_list(ty, list(values))
            self.tables[key] = self.emit(arith.ConstantOp(attr), "table")
        return self.tables[key]

    def sm_count(self) -> SSAValue:
        """The device's SM count (`host.sm_count`), queried once per function."""
        if self._sms is None:
            self._sms = self.emit(SmCountOp(), "sms")
        return self._sms

    def cdiv(self, a: SSAValue, block: int, name: str) -> SSAValue:
        return self.emit(arith.CeilDivSIOp(a, self.const(block)), name)

    def mul(self, a: SSAValue, factor: int, name: str) -> SSAValue:
        return self.emit(arith.MuliOp(a, self.const(factor)), name)

    def alloc(self, ty: TensorType, sizes: Mapping[int, SSAValue], name: str, *, zero: bool = False,
              order: Sequence[int] | None = None) -> SSAValue:
        """A `ty` buffer; `sizes` maps dims to their run-time sizes, of which those
        that `ty` leaves dynamic become operands (a static batch or length needs none);
        `order`: the dims' memory order, outermost first (default row-major)."""
        dynamic = [sizes[i] for i, d in enumerate(ty.get_shape()) if d < 0]
        props: dict[str, Attribute | None] = {"zero": UnitAttr() if zero else None}
        if order is not None and list(order) != list(range(len(order))):
            props["order"] = DenseArrayBase.from_list(i64, list(order))
        op = AllocOp.build(operands=[dynamic], result_types=[ty], properties=props)
        return self.emit(op, name)

    def reduce_sum(self, x: SSAValue, dims: Sequence[int], result: Attribute, name: str, *, keepdim: bool = False) -> SSAValue:
        props: dict[str, Attribute] = {"dims": DenseArrayBase.from_list(i64, list(dims))}
        if keepdim:
            props["keepdim"] = UnitAttr()
        return self.emit(ReduceSumOp.build(operands=[x], result_types=[result], properties=props), name)

    def convert(self, x: SSAValue, result: Attribute, name: str) -> SSAValue:
        if x.type == result:
            return x
        return self.emit(ConvertOp.build(operands=[x], result_types=[result]), name)

    def launch(self, kernel: str, grid: Sequence[SSAValue], args: Sequence[SSAValue], *,
               when: SSAValue | None = None, unless: bool = False) -> None:
        """Launch `kernel`; with `when`, only if it holds (or, `unless`, does not)."""
        self.emit(LaunchOp.build(
            operands=[grid[0], grid[1], grid[2], list(args), [] if when is None else [when]],
            properties={"kernel": SymbolRefAttr(kernel), **({"unless": UnitAttr()} if unless else {})},
        ))
