"""
Compute ops of the `tile` dialect: `tile.dot`, `tile.reduce`, `tile.rand`,
`tile.where`, `tile.cmp` and `tile.convert` (what `arith`, `math` and `scf` lack for
tiles: xDSL's `arith.cmpi/cmpf/select` and conversions do not accept tensors).
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    AnyAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    f32,
    f64,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tile_types import (
    CmpPredicate,
    CmpPredicateAttr,
    ReduceKind,
    ReduceKindAttr,
    element_type_of,
    is_element_type,
    is_float_type,
    is_int_type,
    shape_of,
    tile_type,
)


@irdl_op_definition
class DotOp(IRDLOperation):
    """
    Matrix product `a @ b (+ acc)` with fp32 accumulation (`tl.dot`). `a`, `b`
    have the same element type (f16, bf16 or f32; i8 accumulates in i32); every
    dimension is at least 16. f32 inputs are multiplied in full IEEE precision
    (on the FMA units), or as `precision` says: `"tf32x3"` (three TF32 tensor-core
    products of the operands split into a high and a low TF32 part, about fp32
    accuracy) or `"tf32"` (one product, 10-bit mantissas).

    ```mlir
    %s = tile.dot %q, %kt, %acc : tensor<64x128xbf16>, tensor<128x64xbf16> -> tensor<64x64xf32>
    %p = tile.dot %q, %kt : tensor<64x128xbf16>, tensor<128x64xbf16> -> tensor<64x64xf32>
    %t = tile.dot %a, %b {precision = "tf32x3"} : tensor<64x64xf32>, tensor<64x64xf32> -> tensor<64x64xf32>
    ```
    """

    name = "tile.dot"

    C: ClassVar = VarConstraint("C", base(TensorType))
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    acc = opt_operand_def(C)
    result = result_def(C)
    precision = opt_prop_def(StringAttr)

    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$lhs `,` $rhs (`,` $acc^)? attr-dict `:` type($lhs) `,` type($rhs) "
        "`->` type($result)"
    )

    PRECISIONS: ClassVar[tuple[str, ...]] = ("ieee", "tf32x3", "tf32")

    def __init__(
        self,
        lhs: SSAValue | Operation,
        rhs: SSAValue | Operation,
        acc: SSAValue | Operation | None = None,
        result_type: Attribute | None = None,
        precision: str | None = None,
    ):
        lhs, rhs = SSAValue.get(lhs), SSAValue.get(rhs)
        if result_type is None:
            if acc is not None:
                result_type = SSAValue.get(acc).type
            else:
                assert isinstance(lhs.type, TensorType)
                assert isinstance(rhs.type, TensorType)
                out_elem = i32 if is_int_type(lhs.type.element_type) else f32
                m, n = lhs.type.get_shape()[0], rhs.type.get_shape()[1]
                result_type = TensorType(out_elem, [m, n])
        super().__init__(
            operands=[lhs, rhs, [] if acc is None else [acc]],
            result_types=[result_type],
            properties={"precision": StringAttr(precision)} if precision is not None else {},
        )

    def verify_(self) -> None:
        a, b, c = self.lhs.type, self.rhs.type, self.result.type
        if self.precision is not None:
            if self.precision.data not in self.PRECISIONS:
                raise VerifyException(
                    f"tile.dot precision must be one of {', '.join(self.PRECISIONS)}, got {self.precision.data!r}")
            if not isinstance(a, TensorType) or a.element_type != f32:
                raise VerifyException("tile.dot precision applies to f32 operands only")
        assert isinstance(a, TensorType) and isinstance(b, TensorType)
        assert isinstance(c, TensorType)
        if a.get_num_dims() != 2 or b.get_num_dims() != 2 or c.get_num_dims() != 2:
            raise VerifyException("tile.dot operands must be 2-d tiles")
        (m, k), (k2, n) = a.get_shape(), b.get_shape()
        if k != k2 or c.get_shape() != (m, n):
            raise VerifyException(
                f"tile.dot shape mismatch: {a} x {b} -> {c} (expected {m}x{n} result)"
            )
        if min(m, n, k) < 16:
            raise VerifyException("tile.dot dimensions must all be >= 16 (Triton rule)")
        if a.element_type != b.element_type:
            raise VerifyException("tile.dot operands must have the same element type")
        if a.element_type == IntegerType(8):
            expected_out: Attribute = i32
        elif is_float_type(a.element_type) and a.element_type != f64:
            expected_out = f32
        else:
            raise VerifyException(
                f"tile.dot operands must be f16, bf16, f32 or i8, got {a.element_type}"
            )
        if c.element_type != expected_out:
            raise VerifyException(
                f"tile.dot result element type must be {expected_out}"
            )


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """
    Reduces a tile along `axis` with max, min or sum (`tl.max/min/sum`); a 1-d
    tile reduces to a scalar.

    ```mlir
    %m = tile.reduce max %s {axis = 1} : tensor<64x128xf32> -> tensor<64xf32>
    ```
    """

    name = "tile.reduce"

    kind = prop_def(ReduceKindAttr)
    input = operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def()

    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$kind $input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, kind: ReduceKind, input: SSAValue | Operation, axis: int):
        input = SSAValue.get(input)
        assert isinstance(input.type, TensorType)
        shape = list(input.type.get_shape())
        del shape[axis]
        super().__init__(
            operands=[input],
            properties={"kind": ReduceKindAttr(kind), "axis": IntegerAttr(axis, i64)},
            result_types=[tile_type(shape, input.type.element_type)],
        )

    def verify_(self) -> None:
        in_type = self.input.type
        assert isinstance(in_type, TensorType)
        shape = list(in_type.get_shape())
        axis = self.axis.value.data
        if not 0 <= axis < len(shape):
            raise VerifyException(f"tile.reduce axis {axis} out of range for {in_type}")
        del shape[axis]
        expected = tile_type(shape, in_type.element_type)
        if self.result.type != expected:
            raise VerifyException(f"tile.reduce result must be {expected}")


@irdl_op_definition
class RandOp(IRDLOperation):
    """
    Counter-based (Philox) uniform random numbers in [0, 1), a pure function of
    `seed` and each element of `offsets` (`tl.rand(seed, offsets)`).

    ```mlir
    %u = tile.rand %seed, %offs : i64, tensor<64x128xi32> -> tensor<64x128xf32>
    ```
    """

    name = "tile.rand"

    seed = operand_def(IntegerType)
    offsets = operand_def()
    result = result_def()

    traits = traits_def(Pure())
    assembly_format = (
        "$seed `,` $offsets attr-dict `:` type($seed) `,` type($offsets) "
        "`->` type($result)"
    )

    def __init__(self, seed: SSAValue | Operation, offsets: SSAValue | Operation):
        offsets = SSAValue.get(offsets)
        super().__init__(
            operands=[seed, offsets],
            result_types=[tile_type(shape_of(offsets.type), f32)],
        )

    def verify_(self) -> None:
        if self.seed.type not in (i32, i64):
            raise VerifyException("tile.rand seed must be i32 or i64")
        if element_type_of(self.offsets.type) != i32:
            raise VerifyException("tile.rand offsets must be i32 (scalar or tile)")
        if self.result.type != tile_type(shape_of(self.offsets.type), f32):
            raise VerifyException(
                "tile.rand result must be f32 with the offsets' shape"
            )


@irdl_op_definition
class WhereOp(IRDLOperation):
    """
    Elementwise choice `cond ? lhs : rhs` with a tile condition (`tl.where`);
    scalar conditions use `arith.select`.

    ```mlir
    %s2 = tile.where %keep, %s, %ninf : tensor<64x64xi1>, tensor<64x64xf32>
    ```
    """

    name = "tile.where"

    T: ClassVar = VarConstraint("T", base(TensorType))
    cond = operand_def(TensorType)
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def(T)

    traits = traits_def(Pure())
    assembly_format = (
        "$cond `,` $lhs `,` $rhs attr-dict `:` type($cond) `,` type($result)"
    )

    def __init__(
        self,
        cond: SSAValue | Operation,
        lhs: SSAValue | Operation,
        rhs: SSAValue | Operation,
    ):
        lhs = SSAValue.get(lhs)
        super().__init__(operands=[cond, lhs, rhs], result_types=[lhs.type])

    def verify_(self) -> None:
        cond = self.cond.type
        assert isinstance(cond, TensorType)
        if cond.element_type != i1 or cond.get_shape() != shape_of(self.lhs.type):
            raise VerifyException(
                f"tile.where condition must be i1 with the shape of the values, got {cond}"
            )


@irdl_op_definition
class CmpOp(IRDLOperation):
    """
    Elementwise comparison giving i1 (Triton's `<`, `<=`, `>`, `>=`, `==`, `!=`):
    signed for integers, ordered for floats except `ne` (unordered).

    ```mlir
    %in = tile.cmp lt, %offs, %n : tensor<64xi32> -> tensor<64xi1>
    ```
    """

    name = "tile.cmp"

    T: ClassVar = VarConstraint("T", AnyAttr())
    predicate = prop_def(CmpPredicateAttr)
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def()

    traits = traits_def(Pure())
    assembly_format = (
        "$predicate `,` $lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)"
    )

    def __init__(
        self,
        predicate: CmpPredicate | str,
        lhs: SSAValue | Operation,
        rhs: SSAValue | Operation,
    ):
        lhs = SSAValue.get(lhs)
        super().__init__(
            operands=[lhs, rhs],
            properties={"predicate": CmpPredicateAttr(CmpPredicate(predicate))},
            result_types=[tile_type(shape_of(lhs.type), i1)],
        )

    def verify_(self) -> None:
        if self.lhs.type != self.rhs.type:
            raise VerifyException("tile.cmp operands must have the same type")
        if not is_element_type(element_type_of(self.lhs.type)):
            raise VerifyException(f"tile.cmp cannot compare {self.lhs.type}")
        expected = tile_type(shape_of(self.lhs.type), i1)
        if self.result.type != expected:
            raise VerifyException(f"tile.cmp result must be {expected}")


@irdl_op_definition
class ConvertOp(IRDLOperation):
    """
    Elementwise numeric conversion with `tl.cast` semantics: float->float rounds
    to nearest even, int->float is signed (i1 counts as 0/1), float->int truncates
    toward zero, int->int sign-extends or truncates (i1 zero-extends), and
    anything->i1 is `!= 0`. Works on scalars and tiles.

    ```mlir
    %f = tile.convert %offs : tensor<64xi32> -> tensor<64xf32>
    ```
    """

    name = "tile.convert"

    input = operand_def()
    result = result_def()

    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation, element_type: Attribute):
        input = SSAValue.get(input)
        super().__init__(
            operands=[input],
            result_types=[tile_type(shape_of(input.type), element_type)],
        )

    def verify_(self) -> None:
        src, dst = self.input.type, self.result.type
        if shape_of(src) != shape_of(dst):
            raise VerifyException("tile.convert must keep the shape")
        for t in (src, dst):
            if not is_element_type(element_type_of(t)):
                raise VerifyException(f"tile.convert cannot convert {t}")


__all__ = ["CmpOp", "ConvertOp", "DotOp", "RandOp", "ReduceOp", "WhereOp"]
