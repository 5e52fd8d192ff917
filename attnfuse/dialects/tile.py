"""
The `tile` dialect: GPU kernels over blocks of values, one step above Triton.

A `tile.kernel` is a function run once per program (CTA) of a launch grid. Its body
works on scalars and *tiles* (static `tensor<...>` values) with program ids, ranges,
masked block loads and stores through `!tile.ptr<T>`, `dot`, reductions and
elementwise math. Elementwise arithmetic reuses `arith` and `math`, control flow
reuses `scf.for` (with `iter_args`) and `scf.if`. This dialect only adds what those
lack; in particular xDSL's `arith.cmpi/cmpf/select` and the integer/float conversion
ops do not accept tensors, hence `tile.cmp`, `tile.where` and `tile.convert`.

See docs/tile-dialect.md for the reference and the Triton each op becomes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    I32,
    I64,
    DictionaryAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f32,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    lazy_traits_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import (
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    Pure,
    SymbolOpInterface,
)
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tile_memory import AtomicAddOp, AtomicFetchAddOp, BarrierOp, LoadOp, PtrAddOp, StoreOp
from attnfuse.dialects.tile_shape import (
    ArangeOp,
    BroadcastOp,
    ExpandDimsOp,
    ReshapeOp,
    SplatOp,
    TransOp,
)
from attnfuse.dialects.tile_types import (
    CmpPredicate,
    CmpPredicateAttr,
    PtrType,
    ReduceKind,
    ReduceKindAttr,
    verify_tile_shape,
)
from attnfuse.dialects.tile_compute import CmpOp, ConvertOp, DotOp, RandOp, ReduceOp, WhereOp

FLATTEN = "tile.flatten"
"""Unit attribute of an `scf.for` whose loop nest Triton fuses into one loop
(`tl.range(..., flatten=True)`): a persistent kernel's walk over its work items, whose
next item's first loads the software pipeliner then issues under the current item's
last tiles. Triton fuses only the loops directly nested in it whose bounds do not
change from item to item, and leaves the others as they are."""


__all__ = [
    "FLATTEN",
    "ArangeOp",
    "AtomicAddOp",
    "AtomicFetchAddOp",
    "BarrierOp",
    "BroadcastOp",
    "CmpOp",
    "CmpPredicate",
    "CmpPredicateAttr",
    "ConvertOp",
    "DotOp",
    "ExpandDimsOp",
    "KernelOp",
    "LoadOp",
    "NumProgramsOp",
    "ProgramIdOp",
    "PtrAddOp",
    "PtrType",
    "RandOp",
    "ReduceKind",
    "ReduceKindAttr",
    "ReduceOp",
    "ReshapeOp",
    "ReturnOp",
    "SplatOp",
    "StoreOp",
    "Tile",
    "TransOp",
    "WhereOp",
]

KERNEL_SCALAR_ARG_TYPES: tuple[Attribute, ...] = (i32, i64, f32)
"""Scalar kernel argument types (besides `!tile.ptr<T>`)."""


# ---------------------------------------------------------------------------
# Kernel structure
# ---------------------------------------------------------------------------


@irdl_op_definition
class KernelOp(IRDLOperation):
    """
    A GPU kernel: the body runs once per program of the launch grid. The entry
    block arguments are the kernel arguments (`!tile.ptr<T>`, `i32`, `i64`, `f32`).
    `num_warps`/`num_stages` are Triton launch options; `launch` is a free-form
    dictionary read by the runtime (grid description, block sizes, ...).

    ```mlir
    tile.kernel @add(%x: !tile.ptr<f32>, %n: i32) attributes {launch = {grid = "cdiv(n, 64)"}, num_stages = 3 : i64, num_warps = 4 : i64} {
      tile.return
    }
    ```
    """

    name = "tile.kernel"

    sym_name = prop_def(StringAttr)
    num_warps = prop_def(IntegerAttr[I64])
    num_stages = prop_def(IntegerAttr[I64])
    launch = prop_def(DictionaryAttr)
    body = region_def("single_block")

    traits = lazy_traits_def(lambda: (SymbolOpInterface(), IsolatedFromAbove()))

    _PROP_NAMES: ClassVar[tuple[str, ...]] = ("num_warps", "num_stages", "launch")

    def __init__(
        self,
        name: str,
        arg_types: Sequence[Attribute],
        *,
        num_warps: int = 4,
        num_stages: int = 3,
        launch: DictionaryAttr | Mapping[str, Attribute] | None = None,
        body: Region | None = None,
    ):
        if body is None:
            body = Region(Block(arg_types=arg_types))
        if not isinstance(launch, DictionaryAttr):
            launch = DictionaryAttr(dict(launch or {}))
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "num_warps": IntegerAttr(num_warps, i64),
                "num_stages": IntegerAttr(num_stages, i64),
                "launch": launch,
            },
            regions=[body],
        )

    @property
    def args(self) -> tuple[SSAValue, ...]:
        return tuple(self.body.block.args)

    @property
    def arg_types(self) -> tuple[Attribute, ...]:
        return tuple(a.type for a in self.body.block.args)

    def verify_(self) -> None:
        for i, arg in enumerate(self.body.block.args):
            if not isinstance(arg.type, PtrType) and arg.type not in (
                KERNEL_SCALAR_ARG_TYPES
            ):
                raise VerifyException(
                    f"tile.kernel argument #{i} must be !tile.ptr<T>, i32, i64 or "
                    f"f32, got {arg.type}"
                )
        last = self.body.block.last_op
        if not isinstance(last, ReturnOp):
            raise VerifyException("tile.kernel body must end with tile.return")
        if self.num_warps.value.data <= 0 or self.num_warps.value.data & (
            self.num_warps.value.data - 1
        ):
            raise VerifyException("num_warps must be a positive power of two")
        if self.num_stages.value.data < 1:
            raise VerifyException("num_stages must be >= 1")
        for op in self.body.walk():
            for value in (
                *op.results,
                *(a for r in op.regions for b in r.blocks for a in b.args),
            ):
                verify_tile_shape(value.type, op.name)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string("(")
        printer.print_list(self.body.block.args, printer.print_block_argument)
        printer.print_string(")")
        attrs = {name: self.properties[name] for name in self._PROP_NAMES}
        attrs.update(self.attributes)
        printer.print_op_attributes(attrs, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> KernelOp:
        name = parser.parse_symbol_name().data
        args = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, parser.parse_argument
        )
        attr_dict = parser.parse_optional_attr_dict_with_keyword()
        attrs = dict(attr_dict.data) if attr_dict is not None else {}
        body = parser.parse_region(args)
        props: dict[str, Attribute] = {"sym_name": StringAttr(name)}
        for prop in cls._PROP_NAMES:
            if prop in attrs:
                props[prop] = attrs.pop(prop)
        props.setdefault("num_warps", IntegerAttr(4, i64))
        props.setdefault("num_stages", IntegerAttr(3, i64))
        props.setdefault("launch", DictionaryAttr({}))
        return cls.create(properties=props, attributes=attrs, regions=[body])


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """
    Terminates a `tile.kernel` (kernels return nothing; results go through stores).

    ```mlir
    tile.return
    ```
    """

    name = "tile.return"

    traits = traits_def(IsTerminator(), HasParent(KernelOp), Pure())
    assembly_format = "attr-dict"


# ---------------------------------------------------------------------------
# Program ids and index tiles
# ---------------------------------------------------------------------------


class _GridQueryOp(IRDLOperation):
    axis = prop_def(IntegerAttr[I32])
    result = result_def(IntegerType)

    traits = traits_def(Pure())
    assembly_format = "$axis attr-dict `:` type($result)"

    def __init__(self, axis: int):
        super().__init__(
            properties={"axis": IntegerAttr(axis, i32)}, result_types=[i32]
        )

    def verify_(self) -> None:
        if self.axis.value.data not in (0, 1, 2):
            raise VerifyException(f"{self.name} axis must be 0, 1 or 2")
        if self.result.type != i32:
            raise VerifyException(f"{self.name} result must be i32")


@irdl_op_definition
class ProgramIdOp(_GridQueryOp):
    """
    The index of this program along a grid axis (`tl.program_id(axis)`).

    ```mlir
    %pid = tile.program_id 0 : i32
    ```
    """

    name = "tile.program_id"


@irdl_op_definition
class NumProgramsOp(_GridQueryOp):
    """
    The number of programs along a grid axis (`tl.num_programs(axis)`).

    ```mlir
    %n = tile.num_programs 1 : i32
    ```
    """

    name = "tile.num_programs"


# ---------------------------------------------------------------------------


Tile = Dialect(
    "tile",
    [
        KernelOp,
        ReturnOp,
        ProgramIdOp,
        NumProgramsOp,
        ArangeOp,
        SplatOp,
        ExpandDimsOp,
        BroadcastOp,
        ReshapeOp,
        TransOp,
        PtrAddOp,
        LoadOp,
        StoreOp,
        AtomicAddOp,
        AtomicFetchAddOp,
        BarrierOp,
        DotOp,
        ReduceOp,
        RandOp,
        WhereOp,
        CmpOp,
        ConvertOp,
    ],
    [PtrType, ReduceKindAttr, CmpPredicateAttr],
)
