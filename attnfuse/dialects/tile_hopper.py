"""The `tile_hopper` dialect: Gluon kernels for Hopper (sm_90a) built from a template.

A `tile_hopper.kernel` is a warp-specialized kernel whose schedule (shared-memory ring,
mbarriers, TMA, async wgmma, `warp_specialize` partitions) is Gluon source text chosen
by a lowering, and whose problem-specific parts are **device functions** in tile IR
(`tile_hopper.func`): the template calls them by symbol (`callees`). The Gluon emitter
(`attnfuse/backends/gluon/emitter.py`) translates the functions op by op and prints the
template around them; layouts of the functions' tiles are inferred by Gluon
(`gl.AutoLayout`) from the layouts of the arguments the template passes.

Kernel arguments are `!tile.ptr<T>`, `i32`, `i64`, `f32` as for `tile.kernel`, plus
TMA descriptors (`!tile_hopper.tma<bf16, [128, 128]>`: a 2-D descriptor over the view
of a tensor as rows of its dim -2 stride, block shape `[128, 128]`, shared layout the
default NVMMA layout of the block), which the runtime builds per call from the tensor
operand of `host.launch`. A 2-D descriptor argument is followed by the (rows, columns)
step of each leading dim of its tensor (`i32`s the runtime fills from the strides, as it
fills a pointer's strides; see `runtime.launch.tma_view`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DictionaryAttr,
    FunctionType,
    IntAttr,
    IntegerAttr,
    StringAttr,
    SymbolRefAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, ParametrizedAttribute, Region, SSAValue, TypeAttribute
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, NoTerminator, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tile_types import PtrType, is_element_type

KERNEL_SCALAR_TYPES = ("i32", "i64", "f32")


@irdl_attr_definition
class TmaDescType(ParametrizedAttribute, TypeAttribute):
    """A TMA tensor descriptor argument with block shape `block`: 2-D over the view of a
    tensor as rows of its dim -2 stride (the kernel's next arguments are the steps of its
    leading dims), or 1-D over the flat view of a contiguous tensor.

    ```mlir
    %k_desc: !tile_hopper.tma<bf16, [128, 128]>
    ```
    """

    name = "tile_hopper.tma"

    element: Attribute
    block: ArrayAttr[IntAttr]

    def __init__(self, element: Attribute, block: Sequence[int]):
        super().__init__(element, ArrayAttr([IntAttr(b) for b in block]))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b.data for b in self.block.data)

    @classmethod
    def parse_parameters(cls, parser: Parser) -> Sequence[Attribute]:
        parser.parse_punctuation("<")
        element = parser.parse_type()
        parser.parse_punctuation(",")
        block = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_integer)
        parser.parse_punctuation(">")
        return (element, ArrayAttr([IntAttr(b) for b in block]))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        printer.print_attribute(self.element)
        printer.print_string(", [" + ", ".join(map(str, self.shape)) + "]>")

    def verify(self) -> None:
        if not is_element_type(self.element) or len(self.shape) not in (1, 2):
            raise VerifyException("!tile_hopper.tma needs an element type and a 1-D or 2-D block shape")


def _print_signature(printer: Printer, block: Block) -> None:
    printer.print_string("(")
    printer.print_list(block.args, printer.print_block_argument)
    printer.print_string(")")


@irdl_op_definition
class FuncOp(IRDLOperation):
    """A device function in tile IR, called by a `tile_hopper.kernel` template.

    ```mlir
    tile_hopper.func @f_score(%s: tensor<64x128xf32>, %cols: tensor<128xi32>) -> (tensor<64x128xf32>) {
      tile_hopper.return %s : tensor<64x128xf32>
    }
    ```
    """

    name = "tile_hopper.func"
    sym_name = prop_def(StringAttr)
    function_type = prop_def(FunctionType)
    body = region_def("single_block")
    traits = traits_def(SymbolOpInterface(), IsolatedFromAbove())

    def __init__(self, name: str, arg_types: Sequence[Attribute], result_types: Sequence[Attribute],
                 body: Region | None = None):
        super().__init__(
            properties={"sym_name": StringAttr(name),
                        "function_type": FunctionType.from_lists(arg_types, result_types)},
            regions=[body or Region(Block(arg_types=arg_types))],
        )

    @property
    def args(self) -> tuple[SSAValue, ...]:
        return tuple(self.body.block.args)

    def verify_(self) -> None:
        last = self.body.block.last_op
        if not isinstance(last, ReturnOp):
            raise VerifyException("tile_hopper.func body must end with tile_hopper.return")
        if tuple(v.type for v in last.values) != tuple(self.function_type.outputs.data):
            raise VerifyException("tile_hopper.return types differ from the function's results")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        _print_signature(printer, self.body.block)
        printer.print_string(" -> (")
        printer.print_list(self.function_type.outputs.data, printer.print_attribute)
        printer.print_string(") ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> FuncOp:
        name = parser.parse_symbol_name().data
        args = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_argument)
        parser.parse_punctuation("->")
        results = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_type)
        body = parser.parse_region(args)
        arg_types = [a.type for a in body.block.args]
        return cls(name, arg_types, results, body)


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """Returns the results of a `tile_hopper.func`.

    ```mlir
    tile_hopper.return %s, %m : tensor<64x128xf32>, tensor<64xf32>
    ```
    """

    name = "tile_hopper.return"
    values = var_operand_def()
    traits = traits_def(IsTerminator(), HasParent(FuncOp))
    assembly_format = "($values^ `:` type($values))? attr-dict"

    def __init__(self, *values: SSAValue):
        super().__init__(operands=[list(values)])


@irdl_op_definition
class KernelOp(IRDLOperation):
    """A Gluon kernel: template source around calls of `tile_hopper.func`s.

    `template` is the Gluon source of the kernel's helper functions followed by a line
    `def __kernel__():` and the kernel body (the emitter writes the real signature from
    the block arguments); `callees` are the device functions it calls. `num_warps` is
    the default partition's warp count, `maxnreg` the register cap Triton derives the
    partitions' `setmaxnreg` budgets from. `writes`, when present, names the arguments
    the kernel writes through (the launch metadata's `writes`: the runtime may then run
    a launch that fills a buffer the kernel only reads once per shape class); absent, the
    kernel may write any tensor it takes.

    ```mlir
    tile_hopper.kernel @f_fwd_ws(%k_desc: !tile_hopper.tma<bf16, [128, 128]>, %Sq: i32)
        attributes {num_warps = 4 : i64, maxnreg = 168 : i64, callees = [@f_score],
                    launch = {role = "forward"}, writes = ["o_desc"], template = "..."} {
    }
    ```
    """

    name = "tile_hopper.kernel"
    sym_name = prop_def(StringAttr)
    num_warps = prop_def(IntegerAttr[I64])
    maxnreg = prop_def(IntegerAttr[I64])
    launch = prop_def(DictionaryAttr)
    callees = prop_def(ArrayAttr[SymbolRefAttr])
    template = prop_def(StringAttr)
    writes = opt_prop_def(ArrayAttr[StringAttr])
    body = region_def("single_block")
    traits = traits_def(SymbolOpInterface(), IsolatedFromAbove(), NoTerminator())

    _PROP_NAMES: ClassVar[tuple[str, ...]] = ("num_warps", "maxnreg", "launch", "callees", "template")

    def __init__(self, name: str, arg_types: Sequence[Attribute], *, num_warps: int, maxnreg: int,
                 launch: dict[str, Attribute], callees: Sequence[str], template: str,
                 writes: Sequence[str] | None = None, body: Region | None = None):
        properties: dict[str, Attribute] = {
            "sym_name": StringAttr(name), "num_warps": IntegerAttr(num_warps, i64),
            "maxnreg": IntegerAttr(maxnreg, i64), "launch": DictionaryAttr(launch),
            "callees": ArrayAttr([SymbolRefAttr(c) for c in callees]), "template": StringAttr(template),
        }
        if writes is not None:
            properties["writes"] = ArrayAttr([StringAttr(w) for w in writes])
        super().__init__(properties=properties, regions=[body or Region(Block(arg_types=arg_types))])

    @property
    def args(self) -> tuple[SSAValue, ...]:
        return tuple(self.body.block.args)

    @property
    def arg_types(self) -> tuple[Attribute, ...]:
        return tuple(a.type for a in self.body.block.args)

    def verify_(self) -> None:
        for i, t in enumerate(self.arg_types):
            if not isinstance(t, (PtrType, TmaDescType)) and str(t) not in KERNEL_SCALAR_TYPES:
                raise VerifyException(f"tile_hopper.kernel argument #{i}: unsupported type {t}")
        if "def __kernel__():" not in self.template.data:
            raise VerifyException("tile_hopper.kernel template has no 'def __kernel__():' line")
        if self.body.block.ops:
            raise VerifyException("tile_hopper.kernel body holds only its arguments")
        if self.writes is not None:
            names = {a.name_hint for a in self.body.block.args}
            for w in self.writes.data:
                if w.data not in names:
                    raise VerifyException(f"tile_hopper.kernel writes '{w.data}', which is not an argument")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        _print_signature(printer, self.body.block)
        attrs = {name: self.properties[name] for name in self._PROP_NAMES}
        if self.writes is not None:
            attrs["writes"] = self.writes
        printer.print_op_attributes(attrs, print_keyword=True)
        printer.print_string(" {\n}")

    @classmethod
    def parse(cls, parser: Parser) -> KernelOp:
        name = parser.parse_symbol_name().data
        args = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_argument)
        attr_dict = parser.parse_optional_attr_dict_with_keyword()
        attrs = dict(attr_dict.data) if attr_dict is not None else {}
        body = parser.parse_region(args)
        props: dict[str, Attribute] = {"sym_name": StringAttr(name)}
        for prop in cls._PROP_NAMES:
            if prop not in attrs:
                parser.raise_error(f"tile_hopper.kernel needs '{prop}'")
            props[prop] = attrs.pop(prop)
        if "writes" in attrs:
            props["writes"] = attrs.pop("writes")
        return cls.create(properties=props, attributes=attrs, regions=[body])


TileHopper = Dialect("tile_hopper", [FuncOp, ReturnOp, KernelOp], [TmaDescType])

__all__ = ["FuncOp", "KernelOp", "ReturnOp", "TileHopper", "TmaDescType"]
