"""Source locations: a parser that records where each operation came from.

xDSL 0.75 does not record where an operation came from unless the text spells an
explicit ``loc(...)``, so a verifier error cannot be reported at ``file:line:col``.
This module fixes that with a side table:

* :class:`LocatingParser` is an xDSL ``Parser`` that remembers the span of each
  operation's name token (the position MLIR reports for an op) in a
  :class:`SourceLocations` table (a ``WeakKeyDictionary`` op -> span).
* :func:`parse_module_with_locations` decodes and parses text and returns the module
  with its table; the table is also remembered per module (:func:`locations_of`), so
  later stages (the pass manager, the Python API) find it without threading it
  through.

:mod:`attnfuse.diagnostics` re-exports all of this.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from weakref import WeakKeyDictionary

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import AttributeInvT, Block, Operation, SSAValue
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.utils.exceptions import DiagnosticException, ParseError
from xdsl.utils.lexer import Input, Span
from xdsl.utils.mlir_lexer import MLIRLexer, MLIRTokenKind

# xDSL 0.75's string-literal regex nests quantifiers (`(?:[^"...]+|...)*`): an unclosed
# `"` makes it backtrack exponentially (30 characters took 34 s). The same language,
# matched one character at a time, is linear.
MLIRLexer._unescaped_characters_regex = re.compile(  # noqa: SLF001
    r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"'
)

__all__ = [
    "LocatingParser",
    "SourceLocations",
    "decode_source",
    "locations_of",
    "parse_module_with_locations",
]


class SourceLocations:
    """A weak side table from operations to the source span of their name token."""

    def __init__(self) -> None:
        self._spans: WeakKeyDictionary[Operation, Span] = WeakKeyDictionary()

    def record(self, op: Operation, span: Span) -> None:
        """Remember that ``op`` was parsed at ``span``."""
        self._spans[op] = span

    def get(self, op: Operation) -> Span | None:
        """The span ``op`` was parsed from, or None for ops created later."""
        return self._spans.get(op)

    def __contains__(self, op: Operation) -> bool:
        return op in self._spans

    def __len__(self) -> int:
        return len(self._spans)

    def __iter__(self) -> Iterator[Operation]:
        return iter(list(self._spans.keys()))

    def nearest(self, op: Operation) -> tuple[Operation, Span] | None:
        """The closest op at or above ``op`` (through its parents) that has a span."""
        current: Operation | None = op
        while current is not None:
            if (span := self._spans.get(current)) is not None:
                return current, span
            current = current.parent_op()
        return None


_MODULE_LOCATIONS: WeakKeyDictionary[ModuleOp, SourceLocations] = WeakKeyDictionary()


def locations_of(module: ModuleOp) -> SourceLocations | None:
    """The location table recorded when ``module`` was parsed, if any."""
    return _MODULE_LOCATIONS.get(module)


class LocatingParser(Parser):
    """An xDSL parser that records the source span of every operation it parses.

    The recorded span is the op's name token (``attn.scores`` in
    ``%s = attn.scores ...``), like MLIR; spans carry ``line_offset`` so chunks of a
    ``--split-input-file`` input report lines of the whole file.
    """

    def __init__(
        self,
        ctx: Context,
        input: str | bytes,
        name: str = "<unknown>",
        *,
        locations: SourceLocations | None = None,
        line_offset: int = 0,
    ) -> None:
        super().__init__(ctx, input, name)
        self.locations = SourceLocations() if locations is None else locations
        self.line_offset = line_offset
        self._name_spans: list[Span | None] = []
        self._first_uses: dict[str, Span] = {}

    def _parse_op_result_list(self) -> list[tuple[Span, int]]:
        # Called first thing in ``parse_operation``: the next token is the op name.
        results = super()._parse_op_result_list()
        if self._name_spans and self._name_spans[-1] is None:
            self._name_spans[-1] = self._current_token.span
        return results

    def _get_op_by_name(self, name: str) -> type[Operation]:
        # xDSL reports an unknown op at the token after its name; point at the name.
        try:
            return super()._get_op_by_name(name)
        except ParseError as e:
            if self._name_spans and (span := self._name_spans[-1]) is not None:
                hint = (
                    ""
                    if self.ctx.allow_unregistered
                    else (" (use --allow-unregistered-dialect to accept it)")
                )
                raise ParseError(span, f"{e.msg}{hint}") from None
            raise

    def resolve_operand(
        self, operand: UnresolvedOperand, type: AttributeInvT
    ) -> SSAValue[AttributeInvT]:
        name = operand.operand_name
        if name not in self.ssa_values and name not in self._first_uses:
            self._first_uses[name] = operand.span
        return super().resolve_operand(operand, type)

    def parse_module(self, allow_implicit_module: bool = True) -> ModuleOp:
        # xDSL reports undefined values at the end of input; point at the first use.
        try:
            return super().parse_module(allow_implicit_module)
        except ParseError as e:
            undefined = [
                n for n in self.forward_ssa_references if n in self._first_uses
            ]
            if not e.msg.startswith("values used but not defined") or not undefined:
                raise
            names = ", ".join(f"%{n}" for n in undefined)
            plural = "s" if len(undefined) > 1 else ""
            raise ParseError(
                self._first_uses[undefined[0]],
                f"use of undefined value{plural} {names}",
            ) from None

    def parse_optional_successor(self) -> Block | None:
        # xDSL 0.75 gives a numeric successor (`cf.br ^0`, valid MLIR) as a name hint
        # to the block, whose setter raises a bare ValueError; keep such blocks unnamed.
        token = self._current_token
        if token.kind == MLIRTokenKind.CARET_IDENT:
            name = token.text[1:]
            if name not in self.blocks and not Block.is_valid_name(name):
                self.forward_block_references[name].append(token.span)
                self.blocks[name] = (Block(), None)
        return super().parse_optional_successor()

    def _parse_block(self) -> Block:
        # xDSL 0.75 cannot name a block `^0` (valid MLIR): say so at the label.
        token = self._current_token
        name = token.text[1:]
        if (
            token.kind == MLIRTokenKind.CARET_IDENT
            and not Block.is_valid_name(name)
            and not Block.is_default_block_name(name)
        ):
            raise ParseError(
                token.span,
                f"unsupported block label '{token.text}': xDSL block names must not "
                "start with a digit (use e.g. ^bb0)",
            )
        return super()._parse_block()

    def parse_operation(self) -> Operation:
        start = self._current_token.span
        self._name_spans.append(None)
        try:
            op = super().parse_operation()
        except ParseError:
            raise
        except DiagnosticException as e:
            # Some ops verify their types while being built by the parser.
            span = self._name_spans[-1] or start
            name = span.text.strip('"')
            message = str(e).strip().split("\n", 1)[0]
            raise ParseError(span, f"'{name}' op {message}") from e
        except ValueError as e:  # xDSL raises a few bare ValueErrors on bad input
            message = " ".join(str(a) for a in e.args) or type(e).__name__
            raise ParseError(self._current_token.span, message) from e
        finally:
            name_span = self._name_spans.pop()
        span = name_span if name_span is not None else start
        self.locations.record(
            op, dataclasses.replace(span, line_offset=self.line_offset)
        )
        return op


def _is_blank(text: str) -> bool:
    """Only whitespace and ``//`` comments."""
    return all(
        not ln.strip() or ln.strip().startswith("//") for ln in text.splitlines()
    )


def decode_source(data: str | bytes, filename: str = "<input>") -> str:
    """``data`` as text; a located ``ParseError`` if it is not UTF-8 text.

    A UTF-8 byte-order mark is dropped; UTF-16 input (a UTF-16 byte-order mark),
    invalid UTF-8 and NUL characters (UTF-16 without a byte-order mark, binary data)
    are reported at the first offending byte.
    """
    if isinstance(data, bytes):
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            span = Span(0, 1, Input(data.decode("utf-16", "replace"), filename))
            raise ParseError(span, "input is UTF-16 (byte-order mark); expected UTF-8")
        try:
            data = data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            start = len(data[: e.start].decode("utf-8"))
            text = Input(data.decode("utf-8", "replace"), filename)
            message = f"invalid UTF-8 byte 0x{data[e.start]:02x}"
            raise ParseError(Span(start, start + 1, text), message) from None
    if (nul := data.find("\0")) >= 0:
        text = Input(data.replace("\0", " "), filename)
        raise ParseError(Span(nul, nul + 1, text), "unexpected NUL character (UTF-16?)")
    return data


def parse_module_with_locations(
    ctx: Context,
    text: str | bytes,
    filename: str = "<input>",
    *,
    line_offset: int = 0,
    allow_implicit_module: bool = True,
) -> tuple[ModuleOp, SourceLocations]:
    """Parse ``text`` into a module and a table of each op's source location.

    ``line_offset`` is added to every reported line (for chunks of a larger file).
    Parse errors (also input that is not UTF-8, or nests too deeply for Python's
    recursion limit) are raised as xDSL ``ParseError`` with the offset applied.
    """
    try:
        source = decode_source(text, filename)
        parser = LocatingParser(ctx, source, filename, line_offset=line_offset)
        if _is_blank(source):  # like mlir-opt, empty input is an empty module
            module = ModuleOp([])
            _MODULE_LOCATIONS[module] = parser.locations
            return module, parser.locations
        try:
            module = parser.parse_module(allow_implicit_module)
        except RecursionError:
            span = parser._current_token.span  # noqa: SLF001
            raise ParseError(span, "input nests too deeply") from None
    except ParseError as e:
        e.span = dataclasses.replace(e.span, line_offset=line_offset)
        raise
    _MODULE_LOCATIONS[module] = parser.locations
    return module, parser.locations
