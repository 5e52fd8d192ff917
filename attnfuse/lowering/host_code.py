"""`HostCode`: appends host-dialect ops (sizes, buffers, launches, reductions)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

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

LAYOUT_ORDERS: dict[str, tuple[int, int, int, int]] = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}
"""Memory layouts of a `[B, H, S, D]` buffer the host code allocates (`lower-to-tile`'s
`out-layout`, `lower-backward`'s `grad-layout`): the memory order of its dims,
outermost first."""


class HostCode:
    """Appends host ops before the first op of an attention function."""

    def __init__(self, insertion_point: InsertPoint) -> None:
        self.builder = Builder(insertion_point)
        self.tables: dict[tuple[float, ...], SSAValue] = {}
        self._sms: SSAValue | None = None
        self._guard: tuple[SSAValue, bool] | None = None

    @contextmanager
    def guarded(self, cond: SSAValue, *, unless: bool = False) -> Iterator[None]:
        """The buffers, conversions, reductions and launches emitted inside exist only
        where `cond` holds (`unless`: where it does not); join the two paths' results
        with `select`. Guards do not nest."""
        assert self._guard is None, "host guards do not nest"
        self._guard = (cond, unless)
        try:
            yield
        finally:
            self._guard = None

    @contextmanager
    def unguarded(self) -> Iterator[None]:
        """Inside a guard, emit what every path may use (a RoPE table built on first use,
        which the other path reads too) as if no guard were on."""
        guard, self._guard = self._guard, None
        try:
            yield
        finally:
            self._guard = guard

    def _guard_parts(self) -> tuple[list[SSAValue], dict[str, Attribute]]:
        """The guard's condition operand and `unless` property, if a guard is on."""
        if self._guard is None:
            return [], {}
        cond, unless = self._guard
        return [cond], {"unless": UnitAttr()} if unless else {}

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
              restored: bool = False, order: Sequence[int] | None = None) -> SSAValue:
        """A `ty` buffer; `sizes` maps dims to their run-time sizes, of which those
        that `ty` leaves dynamic become operands (a static batch or length needs none);
        `restored`: a zero buffer that every launch leaves zero (`host.alloc`);
        `order`: the dims' memory order, outermost first (default row-major)."""
        dynamic = [sizes[i] for i, d in enumerate(ty.get_shape()) if d < 0]
        props: dict[str, Attribute | None] = {"zero": UnitAttr() if zero else None,
                                              "restored": UnitAttr() if restored else None}
        if order is not None and list(order) != list(range(len(order))):
            props["order"] = DenseArrayBase.from_list(i64, list(order))
        cond, guard = self._guard_parts()
        op = AllocOp.build(operands=[dynamic, cond], result_types=[ty], properties={**props, **guard})
        return self.emit(op, name)

    def reduce_sum(self, x: SSAValue, dims: Sequence[int], result: Attribute, name: str, *, keepdim: bool = False) -> SSAValue:
        props: dict[str, Attribute] = {"dims": DenseArrayBase.from_list(i64, list(dims))}
        if keepdim:
            props["keepdim"] = UnitAttr()
        cond, guard = self._guard_parts()
        return self.emit(ReduceSumOp.build(operands=[x, cond], result_types=[result], properties={**props, **guard}),
                         name)

    def convert(self, x: SSAValue, result: Attribute, name: str, *, order: Sequence[int] | None = None) -> SSAValue:
        """`x` as `result`'s element type; `order`: the result's memory order (as `alloc`)."""
        ordered = order is not None and list(order) != list(range(len(order)))
        if x.type == result and not ordered:
            return x
        cond, guard = self._guard_parts()
        props: dict[str, Attribute | None] = dict(guard)
        if ordered:
            assert order is not None
            props["order"] = DenseArrayBase.from_list(i64, list(order))
        return self.emit(ConvertOp.build(operands=[x, cond], result_types=[result], properties=props), name)

    def select(self, cond: SSAValue, a: SSAValue, b: SSAValue, name: str) -> SSAValue:
        """`a` where `cond` holds, else `b` (tensors of two guarded paths, or scalars)."""
        return self.emit(arith.SelectOp(cond, a, b), name)

    def launch(self, kernel: str, grid: Sequence[SSAValue], args: Sequence[SSAValue], *,
               when: SSAValue | None = None, unless: bool = False) -> None:
        """Launch `kernel`; with `when`, only if it holds (or, `unless`, does not); inside
        `guarded`, on the guard's path."""
        if self._guard is not None:
            assert when is None or self._guard == (when, unless), "a launch inside a guard takes the guard's condition"
            when, unless = self._guard
        self.emit(LaunchOp.build(
            operands=[grid[0], grid[1], grid[2], list(args), [] if when is None else [when]],
            properties={"kernel": SymbolRefAttr(kernel), **({"unless": UnitAttr()} if unless else {})},
        ))
