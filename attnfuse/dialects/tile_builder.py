"""
`TileBuilder`: write `tile.kernel`s from Python almost like Triton code.

```python
b = TileBuilder.kernel("add", [("x", PtrType(f32)), ("y", PtrType(f32)), ("n", i32)])
x, y, n = b.args
offs = b.add(b.mul(b.program_id(0), 64), b.arange(0, 64), name="offs")
mask = b.lt(offs, n)
b.store(y, offs, b.exp(b.load(x, offs, mask=mask, other=0.0)), mask=mask)
kernel = b.finish()
```

Every binary op takes SSA values or Python literals and follows NumPy rules:
literals become constants of the other operand's element type, integer (or float)
operands of different widths are widened to the wider type, and shapes broadcast
(scalars are splat, missing leading dims are added, size-1 dims are broadcast), each
step an explicit op in the IR. `add` on floats is `arith.addf`, on integers
`arith.addi`, and so on. Every value-producing method accepts `name=` to set the SSA
name hint (the emitted Triton uses it as the variable name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from xdsl.builder import Builder, InsertPoint
from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    TensorType,
    f32,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue

from attnfuse.dialects.tile import (
    ArangeOp,
    BroadcastOp,
    CmpOp,
    ConvertOp,
    DotOp,
    ExpandDimsOp,
    KernelOp,
    NumProgramsOp,
    ProgramIdOp,
    RandOp,
    ReduceKind,
    ReduceOp,
    ReshapeOp,
    ReturnOp,
    SplatOp,
    TransOp,
    WhereOp,
)
from attnfuse.dialects.tile_builder_control import ControlFlow, ForLoop, IfBranches
from attnfuse.dialects.tile_builder_math import MathOps
from attnfuse.dialects.tile_builder_memory import MemoryOps
from attnfuse.dialects.tile_types import (
    Literal,
    Value,
    broadcast_shapes,
    literal_type,
    bit_width,
    element_type_of,
    is_float_type,
    is_int_type,
    shape_of,
    tile_type,
)

_CMP_INT = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}
_CMP_FLOAT = {
    "lt": "olt",
    "le": "ole",
    "gt": "ogt",
    "ge": "oge",
    "eq": "oeq",
    "ne": "une",
}


class TileBuilder(MemoryOps, MathOps, ControlFlow):
    """Appends tile/arith/math/scf ops at an insertion point inside a `tile.kernel`."""

    def __init__(self, kernel: KernelOp, insertion_point: InsertPoint | None = None):
        self.kernel_op = kernel
        self._builders = [
            Builder(insertion_point or InsertPoint.at_end(kernel.body.block))
        ]
        self.f32_dot = "ieee"
        """The `precision` of the `tile.dot`s of f32 tiles this builder creates."""

    @classmethod
    def kernel(
        cls,
        name: str,
        args: Sequence[tuple[str, Attribute]],
        *,
        num_warps: int = 4,
        num_stages: int = 3,
        launch: DictionaryAttr | Mapping[str, Attribute] | None = None,
    ) -> TileBuilder:
        """Start a new kernel; `args` are (name, type) pairs."""
        op = KernelOp(
            name,
            [t for _, t in args],
            num_warps=num_warps,
            num_stages=num_stages,
            launch=launch,
        )
        for arg, (arg_name, _) in zip(op.args, args):
            arg.name_hint = SSAValue.extract_valid_name(arg_name)
        return cls(op)

    @property
    def args(self) -> tuple[SSAValue, ...]:
        return self.kernel_op.args

    def arg(self, name: str) -> SSAValue:
        """The kernel argument called `name`."""
        for a in self.kernel_op.args:
            if a.name_hint == name:
                return a
        raise KeyError(name)

    def finish(self) -> KernelOp:
        """Terminate the kernel with `tile.return`. It is not verified here: the pass
        manager verifies the whole module after each pass (verifying every kernel twice
        was a fifth of a compile); a kernel built outside a pass calls `verify()`."""
        if len(self._builders) != 1:
            raise ValueError("finish() called inside an open loop or branch")
        block = self.kernel_op.body.block
        if not isinstance(block.last_op, ReturnOp):
            self.insert(ReturnOp(), InsertPoint.at_end(block))
        return self.kernel_op

    # -- insertion ----------------------------------------------------------------

    def insert(
        self, op: Operation, insertion_point: InsertPoint | None = None
    ) -> Operation:
        return self._builders[-1].insert(op, insertion_point)

    @contextmanager
    def at(self, insertion_point: InsertPoint) -> Iterator[None]:
        """Temporarily insert at another point."""
        self._builders.append(Builder(insertion_point))
        try:
            yield
        finally:
            self._builders.pop()

    def _emit(self, op: Operation, name: str | None) -> SSAValue:
        self.insert(op)
        result = op.results[0]
        if name is not None:
            result.name_hint = SSAValue.extract_valid_name(name)
        return result

    def name(self, value: SSAValue, name: str) -> SSAValue:
        """Set the name hint of `value` and return it."""
        value.name_hint = SSAValue.extract_valid_name(name)
        return value

    # -- constants and coercion ---------------------------------------------------

    def constant(
        self, value: Literal, dtype: Attribute, *, name: str | None = None
    ) -> SSAValue:
        """A scalar constant of type `dtype`."""
        if is_float_type(dtype):
            attr: Attribute = FloatAttr(float(value), dtype)  # pyright: ignore
        elif is_int_type(dtype):
            attr = IntegerAttr(int(value), dtype)  # pyright: ignore
        else:
            raise TypeError(f"cannot make a constant of type {dtype}")
        return self._emit(arith.ConstantOp(attr), name)  # pyright: ignore

    def full(
        self,
        shape: Sequence[int],
        value: Literal,
        dtype: Attribute,
        *,
        name: str | None = None,
    ) -> SSAValue:
        """A tile (or scalar, for `shape == ()`) filled with `value`: a scalar constant
        and `tile.splat`. Not a splat `dense<...>` constant: xDSL 0.75 stores every
        element of one (32 KB for a 64x128 f32 tile) and unpacks them all to print it,
        and misparses a non-finite one (`dense<0xFF800000>`) back as an integer."""
        if len(shape) == 0:
            return self.constant(value, dtype, name=name)
        return self.splat(self.constant(value, dtype), shape, name=name)

    def zeros(
        self, shape: Sequence[int], dtype: Attribute, *, name: str | None = None
    ) -> SSAValue:
        return self.full(shape, 0, dtype, name=name)

    def coerce(self, value: Value, type: Attribute) -> SSAValue:
        """`value` as exactly `type`: literals become constants, shapes broadcast.
        Element types must already match."""
        if not isinstance(value, SSAValue):
            return self.full(shape_of(type), value, element_type_of(type))
        if element_type_of(value.type) != element_type_of(type):
            raise TypeError(f"expected {type}, got {value.type}; cast explicitly")
        return self.broadcast_to(value, shape_of(type))

    def _unify(self, *values: Value) -> list[SSAValue]:
        """Common element type (widening) and broadcast shape of `values`."""
        typed = [v for v in values if isinstance(v, SSAValue)]
        if typed:
            elem = element_type_of(typed[0].type)
            for v in typed[1:]:
                elem = self._promote(elem, element_type_of(v.type))
            shape = broadcast_shapes(*(shape_of(v.type) for v in typed))
        else:
            elem, shape = literal_type(values[0]), ()
            for v in values[1:]:
                elem = self._promote(elem, literal_type(v))  # pyright: ignore
        out: list[SSAValue] = []
        for v in values:
            if isinstance(v, SSAValue):
                out.append(self.broadcast_to(self.cast(v, elem), shape))
            else:
                if isinstance(v, float) and not is_float_type(elem):
                    raise TypeError(f"float literal {v} used with integer type {elem}")
                out.append(self.full(shape, v, elem))
        return out

    @staticmethod
    def _promote(a: Attribute, b: Attribute) -> Attribute:
        if a == b:
            return a
        if is_int_type(a) and is_int_type(b):
            return a if bit_width(a) >= bit_width(b) else b
        if is_float_type(a) and is_float_type(b):
            if bit_width(a) == bit_width(b):  # f16 with bf16
                return f32
            return a if bit_width(a) > bit_width(b) else b
        raise TypeError(f"cannot mix {a} and {b}; cast explicitly")

    # -- program ids and index tiles ---------------------------------------------

    def program_id(self, axis: int = 0, *, name: str | None = None) -> SSAValue:
        return self._emit(ProgramIdOp(axis), name)

    def num_programs(self, axis: int = 0, *, name: str | None = None) -> SSAValue:
        return self._emit(NumProgramsOp(axis), name)

    def arange(self, start: int, end: int, *, name: str | None = None) -> SSAValue:
        return self._emit(ArangeOp(start, end), name)

    # -- shapes ------------------------------------------------------------------

    def splat(
        self, x: SSAValue, shape: Sequence[int], *, name: str | None = None
    ) -> SSAValue:
        return self._emit(SplatOp(x, shape), name)

    def expand_dims(
        self, x: SSAValue, axis: int, *, name: str | None = None
    ) -> SSAValue:
        if axis < 0:
            axis += len(shape_of(x.type)) + 1
        return self._emit(ExpandDimsOp(x, axis), name)

    def broadcast_to(
        self, x: SSAValue, shape: Sequence[int], *, name: str | None = None
    ) -> SSAValue:
        """NumPy-style broadcast: splat scalars, add leading dims, expand 1s."""
        shape = tuple(shape)
        src = shape_of(x.type)
        if src == shape:
            return x
        if len(src) == 0:
            return self.splat(x, shape, name=name)
        if len(src) > len(shape) or broadcast_shapes(src, shape) != shape:
            raise ValueError(f"cannot broadcast {x.type} to {shape}")
        while len(shape_of(x.type)) < len(shape):
            x = self.expand_dims(x, 0)
        if shape_of(x.type) == shape:
            return self.name(x, name) if name else x
        return self._emit(BroadcastOp(x, shape), name)

    def reshape(
        self, x: SSAValue, shape: Sequence[int], *, name: str | None = None
    ) -> SSAValue:
        return self._emit(ReshapeOp(x, shape), name)

    def trans(self, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._emit(TransOp(x), name)

    # -- elementwise arithmetic ---------------------------------------------------

    def _binary(
        self,
        lhs: Value,
        rhs: Value,
        float_op: Callable[[SSAValue, SSAValue], Operation] | None,
        int_op: Callable[[SSAValue, SSAValue], Operation] | None,
        name: str | None,
    ) -> SSAValue:
        a, b = self._unify(lhs, rhs)
        make = float_op if is_float_type(element_type_of(a.type)) else int_op
        if make is None:
            raise TypeError(f"operation not defined on {a.type}")
        return self._emit(make(a, b), name)

    def add(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._binary(lhs, rhs, arith.AddfOp, arith.AddiOp, name)

    def sub(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._binary(lhs, rhs, arith.SubfOp, arith.SubiOp, name)

    def mul(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._binary(lhs, rhs, arith.MulfOp, arith.MuliOp, name)

    def div(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        """Float division, or integer division truncating toward zero (C, Triton)."""
        return self._binary(lhs, rhs, arith.DivfOp, arith.DivSIOp, name)

    def rem(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        """Integer remainder with the sign of the dividend (C, Triton `%`)."""
        return self._binary(lhs, rhs, None, arith.RemSIOp, name)

    def cdiv(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        """Ceiling division of signed integers (`arith.ceildivsi`: rounds toward +inf)."""
        return self._binary(lhs, rhs, None, arith.CeilDivSIOp, name)

    def maximum(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        """Elementwise max (floats: NaN-propagating `arith.maximumf`)."""
        return self._binary(lhs, rhs, arith.MaximumfOp, arith.MaxSIOp, name)

    def minimum(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._binary(lhs, rhs, arith.MinimumfOp, arith.MinSIOp, name)

    def and_(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._binary(lhs, rhs, None, arith.AndIOp, name)

    def or_(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._binary(lhs, rhs, None, arith.OrIOp, name)

    def xor(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._binary(lhs, rhs, None, arith.XOrIOp, name)

    def neg(self, x: SSAValue, *, name: str | None = None) -> SSAValue:
        if is_float_type(element_type_of(x.type)):
            return self._emit(arith.NegfOp(x), name)
        return self.sub(0, x, name=name)

    # -- comparisons and selection ------------------------------------------------

    def _compare(self, pred: str, lhs: Value, rhs: Value, name: str | None) -> SSAValue:
        a, b = self._unify(lhs, rhs)
        if isinstance(a.type, TensorType):
            return self._emit(CmpOp(pred, a, b), name)
        if is_float_type(a.type):
            return self._emit(arith.CmpfOp(a, b, _CMP_FLOAT[pred]), name)
        return self._emit(arith.CmpiOp(a, b, _CMP_INT[pred]), name)

    def lt(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._compare("lt", lhs, rhs, name)

    def le(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._compare("le", lhs, rhs, name)

    def gt(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._compare("gt", lhs, rhs, name)

    def ge(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._compare("ge", lhs, rhs, name)

    def eq(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        return self._compare("eq", lhs, rhs, name)

    def ne(self, lhs: Value, rhs: Value, *, name: str | None = None) -> SSAValue:
        """Not equal (unordered for floats: true if either side is NaN)."""
        return self._compare("ne", lhs, rhs, name)

    def where(
        self, cond: SSAValue, lhs: Value, rhs: Value, *, name: str | None = None
    ) -> SSAValue:
        """`cond ? lhs : rhs`, broadcasting all three."""
        if element_type_of(cond.type) != i1:
            raise TypeError(f"where condition must be i1, got {cond.type}")
        a, b = self._unify(lhs, rhs)
        shape = broadcast_shapes(shape_of(cond.type), shape_of(a.type))
        cond = self.broadcast_to(cond, shape)
        a, b = self.broadcast_to(a, shape), self.broadcast_to(b, shape)
        if len(shape) == 0:
            return self._emit(arith.SelectOp(cond, a, b), name)
        return self._emit(WhereOp(cond, a, b), name)

    # -- conversions --------------------------------------------------------------

    def cast(self, x: Value, dtype: Attribute, *, name: str | None = None) -> SSAValue:
        """Convert to element type `dtype` with `tl.cast` semantics (see
        `tile.convert`): scalars use the arith cast ops, tiles use arith.extf/truncf
        for float<->float and `tile.convert` otherwise. Casting to i1 is `x != 0`."""
        if not isinstance(x, SSAValue):
            return self.constant(x, dtype, name=name)
        src = element_type_of(x.type)
        if src == dtype:
            return self.name(x, name) if name else x
        if dtype == i1:
            return self.ne(x, 0, name=name)
        out_type = tile_type(shape_of(x.type), dtype)
        both_float = is_float_type(src) and is_float_type(dtype)
        if isinstance(x.type, TensorType) and not both_float:
            return self._emit(ConvertOp(x, dtype), name)
        if both_float:
            wider = bit_width(dtype) > bit_width(src)
            if bit_width(dtype) == bit_width(src):  # f16 <-> bf16 goes through f32
                return self.cast(self.cast(x, f32), dtype, name=name)
            op: Operation = (arith.ExtFOp if wider else arith.TruncFOp)(x, out_type)
        elif is_float_type(dtype):
            op = (arith.UIToFPOp if src == i1 else arith.SIToFPOp)(x, out_type)
        elif is_float_type(src):
            op = arith.FPToSIOp(x, out_type)
        elif bit_width(dtype) > bit_width(src):
            op = (arith.ExtUIOp if src == i1 else arith.ExtSIOp)(x, out_type)  # pyright: ignore
        else:
            op = arith.TruncIOp(x, out_type)  # pyright: ignore
        return self._emit(op, name)

    def to_i64(self, x: Value, *, name: str | None = None) -> SSAValue:
        """Widen an integer to i64 (for base offsets that may exceed 2**31)."""
        if not isinstance(x, SSAValue):
            return self.constant(x, i64, name=name)
        return self.cast(x, i64, name=name)

    # -- tile compute -------------------------------------------------------------

    def dot(
        self,
        a: SSAValue,
        b: SSAValue,
        acc: SSAValue | None = None,
        *,
        name: str | None = None,
    ) -> SSAValue:
        """`a @ b (+ acc)` accumulated in f32 (i32 for i8 inputs); f32 tiles are
        multiplied with the builder's `f32_dot` precision."""
        f32_inputs = element_type_of(a.type) == f32
        precision = self.f32_dot if f32_inputs and self.f32_dot != "ieee" else None
        return self._emit(DotOp(a, b, acc, precision=precision), name)

    def reduce(
        self, kind: ReduceKind | str, x: SSAValue, axis: int, *, name: str | None = None
    ) -> SSAValue:
        if axis < 0:
            axis += len(shape_of(x.type))
        return self._emit(ReduceOp(ReduceKind(kind), x, axis), name)

    def reduce_max(
        self, x: SSAValue, axis: int, *, name: str | None = None
    ) -> SSAValue:
        return self.reduce(ReduceKind.MAX, x, axis, name=name)

    def reduce_min(
        self, x: SSAValue, axis: int, *, name: str | None = None
    ) -> SSAValue:
        return self.reduce(ReduceKind.MIN, x, axis, name=name)

    def reduce_sum(
        self, x: SSAValue, axis: int, *, name: str | None = None
    ) -> SSAValue:
        return self.reduce(ReduceKind.SUM, x, axis, name=name)

    def rand(self, seed: Value, offsets: Value, *, name: str | None = None) -> SSAValue:
        """Uniform [0, 1) Philox numbers, a pure function of (seed, offset)."""
        seed_v = seed if isinstance(seed, SSAValue) else self.constant(seed, i64)
        offs_v = (
            offsets if isinstance(offsets, SSAValue) else self.constant(offsets, i32)
        )
        return self._emit(RandOp(seed_v, self.cast(offs_v, i32)), name)


__all__ = ["ForLoop", "IfBranches", "TileBuilder", "Value", "broadcast_shapes"]
