"""The shared custom syntax of `attn` ops.

Every attn op reads the same way:

```
%r = attn.<op> [kind] %a, %b, ... [keyword %x]... [{option = value, ...}]
        : type(%a), type(%b), ..., type(%x)... [-> result types] [region]
```

An op class describes its own shape through a few class variables (`KINDS`,
`POSITIONAL`, `KEYWORD_OPERANDS`, `VARIADIC`, `EXPLICIT_RESULTS`, `OPTIONS`), and
`AttnSyntaxOp` parses and prints it. Options are stored as properties only when given,
so printing is the exact inverse of parsing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, cast

from xdsl.dialects.builtin import FloatAttr, StringAttr
from xdsl.ir import Attribute, Region, SSAValue
from xdsl.irdl import IRDLOperation
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn_types import F32_MAX, Option, OptionValue, option_value, parse_options, print_options


def check_same_type(op: IRDLOperation, a: Attribute, b: Attribute, what: str) -> None:
    """Raise a VerifyException unless `b` is `a` (an operand or result type of `op`)."""
    if a != b:
        raise VerifyException(f"{op.name}: {what} must have type {a}, got {b}")


class AttnSyntaxOp(IRDLOperation):
    """Base of attn ops: the generic custom syntax and option accessors."""

    KINDS: ClassVar[tuple[str, ...]] = ()
    """Keywords naming the op's kind, written right after the op name."""
    DEFAULT_KIND: ClassVar[str | None] = None
    """Kind used when none is written (then the kind keyword is optional)."""
    POSITIONAL: ClassVar[tuple[str, ...]] = ()
    """Operand fields written first, separated by commas."""
    VARIADIC: ClassVar[str | None] = None
    """A variadic operand field continuing the positional list (captured values)."""
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ()
    """Optional operand fields introduced by their own name (`positions %pos`)."""
    EXPLICIT_RESULTS: ClassVar[bool] = False
    """Whether result types are written after `->` (else: the first operand's type)."""
    OPTIONS: ClassVar[tuple[Option, ...]] = ()

    # ------------------------------------------------------------------ accessors

    def option(self, name: str) -> OptionValue | None:
        """The value of an option, or its default when it was not written."""
        for opt in self.OPTIONS:
            if opt.name == name:
                attr = self.properties.get(name)
                return opt.default if attr is None else option_value(attr)
        raise KeyError(f"{self.name} has no option '{name}'")

    def float_option(self, name: str) -> float:
        return float(cast(float, self.option(name)))

    def int_option(self, name: str) -> int:
        return int(cast(int, self.option(name)))

    def str_option(self, name: str) -> str:
        return str(self.option(name))

    @property
    def kind_name(self) -> str:
        attr = self.properties.get("kind")
        if isinstance(attr, StringAttr):
            return attr.data
        return self.DEFAULT_KIND or ""

    # ------------------------------------------------------------------ verifying

    def verify_options(self) -> None:
        """The checks the custom parser makes, for ops built from Python or the generic form.

        A kind must be one of `KINDS`, a string option one of its choices, a float option
        finite (the custom syntax has no spelling for inf/nan).
        """
        kind = self.properties.get("kind")
        if self.KINDS and isinstance(kind, StringAttr) and kind.data not in self.KINDS:
            raise VerifyException(
                f"{self.name}: unknown kind '{kind.data}' (expected one of {', '.join(self.KINDS)})"
            )
        for opt in self.OPTIONS:
            attr = self.properties.get(opt.name)
            if isinstance(attr, StringAttr) and opt.choices and attr.data not in opt.choices:
                raise VerifyException(
                    f"{self.name}: option '{opt.name}' must be one of "
                    f"{', '.join(opt.choices)}, got '{attr.data}'"
                )
            if isinstance(attr, FloatAttr) and not math.isfinite(attr.value.data):
                raise VerifyException(f"{self.name}: option '{opt.name}' must be finite")
            if isinstance(attr, FloatAttr) and abs(attr.value.data) > F32_MAX:
                raise VerifyException(
                    f"{self.name}: option '{opt.name}' is out of the f32 range "
                    f"(|x| <= {F32_MAX:.7g})"
                )

    def verify(self, verify_nested_ops: bool = True) -> None:
        self.verify_options()
        super().verify(verify_nested_ops)

    # ------------------------------------------------------------------ parsing

    @classmethod
    def parse(cls, parser: Parser) -> AttnSyntaxOp:
        properties: dict[str, Attribute] = {}
        if cls.KINDS:
            start = parser.pos
            kind: str | None = None
            ident = parser.parse_optional_identifier()
            if ident is not None:
                if ident not in cls.KINDS:
                    parser.raise_error(
                        f"unknown {cls.name} kind '{ident}' (expected one of "
                        f"{', '.join(cls.KINDS)})",
                        start,
                        parser.pos,
                    )
                kind = ident
            elif cls.DEFAULT_KIND is None:
                parser.raise_error(f"expected {cls.name} kind: one of {', '.join(cls.KINDS)}")
            if kind is not None and kind != cls.DEFAULT_KIND:
                properties["kind"] = StringAttr(kind)

        written: list[tuple[str, UnresolvedOperand]] = []
        for i, field in enumerate(cls.POSITIONAL):
            if i:
                parser.parse_punctuation(",")
            written.append((field, parser.parse_unresolved_operand()))
        if cls.VARIADIC is not None:
            while parser.parse_optional_punctuation(",") is not None:
                written.append((cls.VARIADIC, parser.parse_unresolved_operand()))
        for field in cls.KEYWORD_OPERANDS:
            if parser.parse_optional_keyword(field) is not None:
                written.append((field, parser.parse_unresolved_operand()))

        properties.update(parse_options(parser, cls.name, cls.OPTIONS))
        parser.parse_punctuation(":")
        types_start = parser.pos
        types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
        if len(types) != len(written):
            parser.raise_error(
                f"{cls.name} expects {len(written)} operand types, got {len(types)}",
                types_start,
                parser.pos,
            )
        values: dict[str, list[SSAValue]] = {}
        for (field, operand), ty in zip(written, types, strict=True):
            values.setdefault(field, []).append(parser.resolve_operand(operand, ty))

        if cls.EXPLICIT_RESULTS:
            parser.parse_punctuation("->")
            result_types = parser.parse_comma_separated_list(
                parser.Delimiter.NONE, parser.parse_type
            )
        else:
            result_types = [types[0]]

        regions: list[Region] = []
        for _ in cls.get_irdl_definition().regions:
            region = parser.parse_optional_region()
            regions.append(region if region is not None else Region())

        operands: list[SSAValue | Sequence[SSAValue] | None] = []
        for name, operand_def in cls.get_irdl_definition().operands:
            group = values.get(name, [])
            if type(operand_def).__name__ == "VarOperandDef":
                operands.append(group)
            elif type(operand_def).__name__ == "OptOperandDef":
                operands.append(group[0] if group else [])
            else:
                operands.append(group[0])
        result_groups: list[Attribute | Sequence[Attribute]] = []
        remaining = list(result_types)
        for _, result_def in cls.get_irdl_definition().results:
            if type(result_def).__name__ in ("OptResultDef", "VarResultDef"):
                result_groups.append(remaining)
                remaining = []
            else:
                if not remaining:
                    parser.raise_error(f"{cls.name} expects more result types")
                result_groups.append(remaining.pop(0))
        if remaining:
            parser.raise_error(f"{cls.name} got too many result types")
        return cls.build(
            operands=operands,
            result_types=result_groups,
            properties=properties,
            regions=regions,
        )

    # ------------------------------------------------------------------ printing

    def _written_operands(self) -> list[SSAValue]:
        written: list[SSAValue] = [getattr(self, f) for f in self.POSITIONAL]
        if self.VARIADIC is not None:
            written.extend(getattr(self, self.VARIADIC))
        return written

    def print(self, printer: Printer) -> None:
        if self.KINDS and "kind" in self.properties:
            printer.print_string(f" {self.kind_name}")
        elif self.KINDS and self.DEFAULT_KIND is None:
            printer.print_string(f" {self.kind_name}")
        written = self._written_operands()
        printer.print_string(" ")
        printer.print_list(written, printer.print_ssa_value)
        for field in self.KEYWORD_OPERANDS:
            value = getattr(self, field)
            if value is not None:
                printer.print_string(f" {field} ")
                printer.print_ssa_value(value)
                written.append(value)
        given = [
            (o.name, option_value(self.properties[o.name]))
            for o in self.OPTIONS
            if o.name in self.properties
        ]
        print_options(printer, given)
        printer.print_string(" : ")
        printer.print_list([v.type for v in written], printer.print_attribute)
        if self.EXPLICIT_RESULTS:
            printer.print_string(" -> ")
            printer.print_list(self.result_types, printer.print_attribute)
        for region in self.regions:
            if not region.blocks:
                continue
            printer.print_string(" ")
            printer.print_region(region, print_entry_block_args=True)
