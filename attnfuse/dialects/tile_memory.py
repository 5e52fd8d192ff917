"""
Pointer and global-memory ops of the `tile` dialect: `tile.ptr_add`, `tile.load`,
`tile.store`, `tile.atomic_add`, and the two that let the programs of a kernel hand
work to each other: `tile.barrier` and `tile.atomic_fetch_add`.

They address `ptr + offsets` elementwise: a tile of integer offsets (in elements)
gives a tile access, a scalar offset a scalar access. The optional `mask` (i1 with
the offsets' shape) disables out-of-bounds lanes; a masked-off load lane returns
`other` (or an unspecified value when `other` is absent).
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import (
    DenseArrayBase,
    IntegerType,
    f16,
    f32,
    f64,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    result_def,
    traits_def,
)
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.traits import MemoryReadEffect, MemoryWriteEffect, Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tile_types import (
    PtrType,
    element_type_of,
    expect_int,
    shape_of,
    tile_type,
)

_Operand = SSAValue | Operation


def _mask_type(offsets_type: Attribute) -> Attribute:
    return tile_type(shape_of(offsets_type), i1)


def _verify_address(
    op: IRDLOperation, ptr: SSAValue, offsets: SSAValue, mask: SSAValue | None
) -> PtrType:
    if not isinstance(ptr.type, PtrType):
        raise VerifyException(f"{op.name} expects a !tile.ptr, got {ptr.type}")
    expect_int(offsets.type, f"{op.name} offsets")
    if mask is not None and mask.type != _mask_type(offsets.type):
        raise VerifyException(
            f"{op.name} mask must be {_mask_type(offsets.type)} (the offsets' shape), "
            f"got {mask.type}"
        )
    return ptr.type


def _parse_address(parser: Parser) -> tuple[UnresolvedOperand, UnresolvedOperand]:
    ptr = parser.parse_unresolved_operand()
    parser.parse_punctuation("[")
    offsets = parser.parse_unresolved_operand()
    parser.parse_punctuation("]")
    return ptr, offsets


def _print_address(printer: Printer, ptr: SSAValue, offsets: SSAValue) -> None:
    printer.print_string(" ")
    printer.print_operand(ptr)
    printer.print_string("[")
    printer.print_operand(offsets)
    printer.print_string("]")


@irdl_op_definition
class PtrAddOp(IRDLOperation):
    """
    Offsets a scalar pointer by a number of elements (`p + off`); use an i64
    offset for batch/head bases that may exceed 2**31 elements.

    ```mlir
    %qh = tile.ptr_add %q, %base : !tile.ptr<bf16>, i64
    ```
    """

    name = "tile.ptr_add"

    P: ClassVar = VarConstraint("P", base(PtrType))
    ptr = operand_def(P)
    offset = operand_def(IntegerType)
    result = result_def(P)

    traits = traits_def(Pure())
    assembly_format = "$ptr `,` $offset attr-dict `:` type($ptr) `,` type($offset)"

    def __init__(self, ptr: SSAValue | Operation, offset: SSAValue | Operation):
        ptr = SSAValue.get(ptr)
        super().__init__(operands=[ptr, offset], result_types=[ptr.type])

    def verify_(self) -> None:
        if self.offset.type not in (i32, i64):
            raise VerifyException("tile.ptr_add offset must be i32 or i64")


@irdl_op_definition
class LoadOp(IRDLOperation):
    """
    Loads `ptr[offsets]` (`tl.load(ptr + offsets, mask=..., other=...)`). The
    result has the pointee element type and the offsets' shape.

    ```mlir
    %q = tile.load %qp[%offs] mask %m other %zero : !tile.ptr<bf16>, tensor<64x128xi32> -> tensor<64x128xbf16>
    %s = tile.load %sinks[%h] : !tile.ptr<f32>, i32 -> f32
    ```
    """

    name = "tile.load"

    ptr = operand_def(PtrType)
    offsets = operand_def()
    mask = opt_operand_def()
    other = opt_operand_def()
    result = result_def()

    traits = traits_def(MemoryReadEffect())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(
        self,
        ptr: _Operand,
        offsets: _Operand,
        mask: _Operand | None = None,
        other: _Operand | None = None,
    ):
        ptr, offsets = SSAValue.get(ptr), SSAValue.get(offsets)
        assert isinstance(ptr.type, PtrType)
        super().__init__(
            operands=[
                ptr,
                offsets,
                [] if mask is None else [mask],
                [] if other is None else [other],
            ],
            result_types=[tile_type(shape_of(offsets.type), ptr.type.pointee)],
        )

    def verify_(self) -> None:
        ptr_type = _verify_address(self, self.ptr, self.offsets, self.mask)
        expected = tile_type(shape_of(self.offsets.type), ptr_type.pointee)
        if self.result.type != expected:
            raise VerifyException(f"tile.load result must be {expected}")
        if self.other is not None:
            if self.mask is None:
                raise VerifyException("tile.load `other` needs a `mask`")
            if self.other.type != expected:
                raise VerifyException(f"tile.load `other` must be {expected}")

    @classmethod
    def parse(cls, parser: Parser) -> LoadOp:
        ptr, offsets = _parse_address(parser)
        mask = other = None
        if parser.parse_optional_keyword("mask") is not None:
            mask = parser.parse_unresolved_operand()
        if parser.parse_optional_keyword("other") is not None:
            other = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ptr_type = parser.parse_type()
        parser.parse_punctuation(",")
        offsets_type = parser.parse_type()
        parser.parse_punctuation("->")
        result_type = parser.parse_type()
        return cls.create(
            operands=[
                parser.resolve_operand(ptr, ptr_type),
                parser.resolve_operand(offsets, offsets_type),
                *(
                    []
                    if mask is None
                    else [parser.resolve_operand(mask, _mask_type(offsets_type))]
                ),
                *(
                    []
                    if other is None
                    else [parser.resolve_operand(other, result_type)]
                ),
            ],
            properties={
                "operandSegmentSizes": _segments(
                    1, 1, int(mask is not None), int(other is not None)
                )
            },
            attributes=attrs,
            result_types=[result_type],
        )

    def print(self, printer: Printer) -> None:
        _print_address(printer, self.ptr, self.offsets)
        if self.mask is not None:
            printer.print_string(" mask ")
            printer.print_operand(self.mask)
        if self.other is not None:
            printer.print_string(" other ")
            printer.print_operand(self.other)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_list((self.ptr.type, self.offsets.type), printer.print_attribute)
        printer.print_string(" -> ")
        printer.print_attribute(self.result.type)


def _segments(*sizes: int) -> Attribute:
    return DenseArrayBase.from_list(i32, sizes)


class _StoreLikeOp(IRDLOperation):
    """Shared structure of `tile.store` and `tile.atomic_add`."""

    ptr = operand_def(PtrType)
    offsets = operand_def()
    value = operand_def()
    mask = opt_operand_def()

    def __init__(
        self,
        ptr: _Operand,
        offsets: _Operand,
        value: _Operand,
        mask: _Operand | None = None,
    ):
        super().__init__(operands=[ptr, offsets, value, [] if mask is None else [mask]])

    def verify_(self) -> None:
        ptr_type = _verify_address(self, self.ptr, self.offsets, self.mask)
        expected = tile_type(shape_of(self.offsets.type), ptr_type.pointee)
        if self.value.type != expected:
            raise VerifyException(
                f"{self.name} value must be {expected} (pointee type, offsets' shape), "
                f"got {self.value.type}"
            )

    @classmethod
    def parse(cls, parser: Parser) -> _StoreLikeOp:
        ptr, offsets = _parse_address(parser)
        parser.parse_punctuation(",")
        value = parser.parse_unresolved_operand()
        mask = None
        if parser.parse_optional_keyword("mask") is not None:
            mask = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ptr_type = parser.parse_type()
        parser.parse_punctuation(",")
        offsets_type = parser.parse_type()
        parser.parse_punctuation(",")
        value_type = parser.parse_type()
        operands = [
            parser.resolve_operand(ptr, ptr_type),
            parser.resolve_operand(offsets, offsets_type),
            parser.resolve_operand(value, value_type),
        ]
        if mask is not None:
            operands.append(parser.resolve_operand(mask, _mask_type(offsets_type)))
        return cls.create(operands=operands, attributes=attrs)

    def print(self, printer: Printer) -> None:
        _print_address(printer, self.ptr, self.offsets)
        printer.print_string(", ")
        printer.print_operand(self.value)
        if self.mask is not None:
            printer.print_string(" mask ")
            printer.print_operand(self.mask)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_list(
            (self.ptr.type, self.offsets.type, self.value.type), printer.print_attribute
        )


@irdl_op_definition
class StoreOp(_StoreLikeOp):
    """
    Stores `value` to `ptr[offsets]` where `mask` is set (`tl.store`). The value
    has the pointee element type and the offsets' shape.

    ```mlir
    tile.store %op[%offs], %o mask %m : !tile.ptr<bf16>, tensor<64x128xi32>, tensor<64x128xbf16>
    ```
    """

    name = "tile.store"

    traits = traits_def(MemoryWriteEffect())


@irdl_op_definition
class AtomicAddOp(_StoreLikeOp):
    """
    Atomically adds `value` to `ptr[offsets]` where `mask` is set
    (`tl.atomic_add`, relaxed memory order: the sums are complete for later
    kernels, not ordered against other accesses of the same kernel); element type
    f32, f16, f64, i32 or i64. Used to accumulate gradients (e.g. dQ) from several
    programs.

    ```mlir
    tile.atomic_add %dq[%offs], %d mask %m : !tile.ptr<f32>, tensor<64x128xi32>, tensor<64x128xf32>
    ```
    """

    name = "tile.atomic_add"

    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())

    def verify_(self) -> None:
        super().verify_()
        assert isinstance(self.ptr.type, PtrType)
        if element_type_of(self.ptr.type.pointee) not in (f32, f16, f64, i32, i64):
            raise VerifyException(
                f"tile.atomic_add supports f32, f16, f64, i32 and i64, "
                f"got {self.ptr.type.pointee}"
            )


@irdl_op_definition
class BarrierOp(IRDLOperation):
    """
    Waits until every thread of the program reaches it (`tl.debug_barrier`): what the
    threads stored before it is ordered before what any of them does after it, so a
    `tile.atomic_fetch_add` that follows publishes the whole program's stores.

    ```mlir
    tile.barrier
    ```
    """

    name = "tile.barrier"

    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())
    assembly_format = "attr-dict"


@irdl_op_definition
class AtomicFetchAddOp(IRDLOperation):
    """
    Adds the scalar `value` to the i32 at `ptr[offset]` and returns what was there
    before (`tl.atomic_add`, acquire-release at device scope): the program's memory
    accesses before it (after a `tile.barrier`: those of all its threads) are seen by
    every program whose add comes later, and its accesses after it see those of every
    program whose add came earlier. The last of N programs to add 1 to a zero counter
    gets N - 1 and may read what the others stored.

    ```mlir
    %ticket = tile.atomic_fetch_add %counts[%pid], %one : !tile.ptr<i32>, i32
    ```
    """

    name = "tile.atomic_fetch_add"

    ptr = operand_def(PtrType)
    offset = operand_def(i32)
    value = operand_def(i32)
    result = result_def(i32)

    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())
    assembly_format = "$ptr `[` $offset `]` `,` $value attr-dict `:` type($ptr) `,` type($offset)"

    def __init__(self, ptr: _Operand, offset: _Operand, value: _Operand):
        super().__init__(operands=[ptr, offset, value], result_types=[i32])

    def verify_(self) -> None:
        assert isinstance(self.ptr.type, PtrType)
        if element_type_of(self.ptr.type.pointee) != i32:
            raise VerifyException(f"tile.atomic_fetch_add counts in i32, got a pointer to {self.ptr.type.pointee}")


__all__ = ["AtomicAddOp", "AtomicFetchAddOp", "BarrierOp", "LoadOp", "PtrAddOp", "StoreOp"]
