"""
Index and shape ops of the `tile` dialect: `tile.arange`, `tile.splat`,
`tile.expand_dims`, `tile.broadcast`, `tile.reshape`, `tile.trans`.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import I32, I64, IntegerAttr, TensorType, i32, i64
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tile_types import expect_scalar, expect_tile


@irdl_op_definition
class ArangeOp(IRDLOperation):
    """
    The 1-d tile `[start, start + 1, ..., end - 1]` (`tl.arange(start, end)`);
    `end - start` must be a power of two.

    ```mlir
    %offs = tile.arange 0, 64 : tensor<64xi32>
    ```
    """

    name = "tile.arange"

    start = prop_def(IntegerAttr[I32])
    end = prop_def(IntegerAttr[I32])
    result = result_def(TensorType)

    traits = traits_def(Pure())
    assembly_format = "$start `,` $end attr-dict `:` type($result)"

    def __init__(self, start: int, end: int):
        super().__init__(
            properties={"start": IntegerAttr(start, i32), "end": IntegerAttr(end, i32)},
            result_types=[TensorType(i32, [end - start])],
        )

    def verify_(self) -> None:
        start, end = self.start.value.data, self.end.value.data
        if self.result.type != TensorType(i32, [end - start]):
            raise VerifyException(
                f"tile.arange {start}, {end} must have type tensor<{end - start}xi32>"
            )


@irdl_op_definition
class SplatOp(IRDLOperation):
    """
    A tile with every element equal to a scalar.

    ```mlir
    %t = tile.splat %x : i32 -> tensor<64x1xi32>
    ```
    """

    name = "tile.splat"

    value = operand_def()
    result = result_def(TensorType)

    traits = traits_def(Pure())
    assembly_format = "$value attr-dict `:` type($value) `->` type($result)"

    def __init__(self, value: SSAValue | Operation, shape: Sequence[int]):
        value = SSAValue.get(value)
        super().__init__(operands=[value], result_types=[TensorType(value.type, shape)])

    def verify_(self) -> None:
        expect_scalar(self.value.type, "tile.splat operand")
        if self.result.type.element_type != self.value.type:
            raise VerifyException(
                "tile.splat result element type must be the operand type"
            )


@irdl_op_definition
class ExpandDimsOp(IRDLOperation):
    """
    Inserts a dimension of size 1 at `axis` (`x[:, None]`, `x[None, :]`).

    ```mlir
    %col = tile.expand_dims %offs {axis = 1} : tensor<64xi32> -> tensor<64x1xi32>
    ```
    """

    name = "tile.expand_dims"

    input = operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation, axis: int):
        input = SSAValue.get(input)
        assert isinstance(input.type, TensorType)
        shape = list(input.type.get_shape())
        shape.insert(axis, 1)
        super().__init__(
            operands=[input],
            properties={"axis": IntegerAttr(axis, i64)},
            result_types=[TensorType(input.type.element_type, shape)],
        )

    def verify_(self) -> None:
        in_type = expect_tile(self.input.type, "tile.expand_dims operand")
        shape = list(in_type.get_shape())
        axis = self.axis.value.data
        if not 0 <= axis <= len(shape):
            raise VerifyException(f"tile.expand_dims axis {axis} out of range")
        shape.insert(axis, 1)
        if self.result.type != TensorType(in_type.element_type, shape):
            raise VerifyException(
                f"tile.expand_dims result must be {TensorType(in_type.element_type, shape)}"
            )


@irdl_op_definition
class BroadcastOp(IRDLOperation):
    """
    Broadcasts size-1 dimensions to the result shape (same rank), like
    `tl.broadcast_to`.

    ```mlir
    %b = tile.broadcast %m : tensor<64x1xf32> -> tensor<64x128xf32>
    ```
    """

    name = "tile.broadcast"

    input = operand_def(TensorType)
    result = result_def(TensorType)

    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation, shape: Sequence[int]):
        input = SSAValue.get(input)
        assert isinstance(input.type, TensorType)
        super().__init__(
            operands=[input], result_types=[TensorType(input.type.element_type, shape)]
        )

    def verify_(self) -> None:
        in_type, out_type = self.input.type, self.result.type
        assert isinstance(in_type, TensorType)
        if in_type.element_type != out_type.element_type:
            raise VerifyException("tile.broadcast must keep the element type")
        src, dst = in_type.get_shape(), out_type.get_shape()
        if len(src) != len(dst) or any(s not in (1, d) for s, d in zip(src, dst)):
            raise VerifyException(
                f"tile.broadcast cannot broadcast {in_type} to {out_type}"
            )


@irdl_op_definition
class ReshapeOp(IRDLOperation):
    """
    Reinterprets a tile with another shape of the same number of elements
    (row-major order, `tl.reshape`).

    ```mlir
    %r = tile.reshape %x : tensor<16x8xf32> -> tensor<128xf32>
    ```
    """

    name = "tile.reshape"

    input = operand_def(TensorType)
    result = result_def(TensorType)

    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation, shape: Sequence[int]):
        input = SSAValue.get(input)
        assert isinstance(input.type, TensorType)
        super().__init__(
            operands=[input], result_types=[TensorType(input.type.element_type, shape)]
        )

    def verify_(self) -> None:
        in_type, out_type = self.input.type, self.result.type
        assert isinstance(in_type, TensorType)
        if in_type.element_type != out_type.element_type:
            raise VerifyException("tile.reshape must keep the element type")
        if in_type.element_count() != out_type.element_count():
            raise VerifyException("tile.reshape must keep the number of elements")


@irdl_op_definition
class TransOp(IRDLOperation):
    """
    Transposes a 2-d tile (`tl.trans`).

    ```mlir
    %kt = tile.trans %k : tensor<64x128xbf16> -> tensor<128x64xbf16>
    ```
    """

    name = "tile.trans"

    input = operand_def(TensorType)
    result = result_def(TensorType)

    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation):
        input = SSAValue.get(input)
        assert isinstance(input.type, TensorType)
        shape = input.type.get_shape()
        super().__init__(
            operands=[input],
            result_types=[TensorType(input.type.element_type, shape[::-1])],
        )

    def verify_(self) -> None:
        in_type = self.input.type
        assert isinstance(in_type, TensorType)
        if in_type.get_num_dims() != 2:
            raise VerifyException("tile.trans expects a 2-d tile")
        expected = TensorType(in_type.element_type, in_type.get_shape()[::-1])
        if self.result.type != expected:
            raise VerifyException(f"tile.trans result must be {expected}")
