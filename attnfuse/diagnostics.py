"""Source locations and MLIR-style diagnostics for AttnFuse.

xDSL 0.75 does not record where an operation came from unless the text spells an
explicit ``loc(...)``, so a verifier error cannot be reported at ``file:line:col``.
This module fixes that with a side table:

* :class:`LocatingParser` is an xDSL ``Parser`` that remembers the span of each
  operation's name token (the position MLIR reports for an op) in a
  :class:`SourceLocations` table (a ``WeakKeyDictionary`` op -> span).
* :func:`parse_module_with_locations` parses text and returns the module with its table;
  the table is also remembered per module (:func:`locations_of`), so later stages (the
  pass manager, the Python API) find it without threading it through.
* :func:`verify_module` runs xDSL's verifier and, on failure, finds the innermost
  failing op and raises a :class:`VerificationError` located at that op.
* :func:`format_diagnostic` / :func:`format_exception` render errors like ``mlir-opt``::

      prog.attn:4:8: error: 'attn.scores' op head dims differ
        %s = attn.scores %q, %k : ...
             ^~~~~~~~~~~
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, ModuleOp
from xdsl.ir import AttributeInvT, Block, Operation, SSAValue
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    MultipleSpansParseError,
    ParseError,
    VerifyException,
)
from xdsl.utils.lexer import Span
from xdsl.utils.mlir_lexer import MLIRLexer, MLIRTokenKind

# xDSL 0.75's string-literal regex nests quantifiers (`(?:[^"...]+|...)*`): an unclosed
# `"` makes it backtrack exponentially (30 characters took 34 s). The same language,
# matched one character at a time, is linear.
MLIRLexer._unescaped_characters_regex = re.compile(  # noqa: SLF001
    r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"'
)

__all__ = [
    "LocatedError",
    "LocatingParser",
    "SourceDiagnostic",
    "SourceLocations",
    "VerificationError",
    "describe_spec_error",
    "error_at",
    "format_diagnostic",
    "format_exception",
    "locations_of",
    "parse_module_with_locations",
    "verify_module",
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


def _is_blank(text: str | bytes) -> bool:
    """Only whitespace and ``//`` comments."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return all(
        not ln.strip() or ln.strip().startswith("//") for ln in text.splitlines()
    )


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
    Parse errors are raised as xDSL ``ParseError`` with the offset applied.
    """
    parser = LocatingParser(ctx, text, filename, line_offset=line_offset)
    if _is_blank(text):  # like mlir-opt, empty input is an empty module
        module = ModuleOp([])
        _MODULE_LOCATIONS[module] = parser.locations
        return module, parser.locations
    try:
        module = parser.parse_module(allow_implicit_module)
    except ParseError as e:
        e.span = dataclasses.replace(e.span, line_offset=line_offset)
        raise
    _MODULE_LOCATIONS[module] = parser.locations
    return module, parser.locations


@dataclass
class SourceDiagnostic:
    """One diagnostic: a message, an optional source span, and notes."""

    message: str
    span: Span | None = None
    severity: str = "error"
    filename: str | None = None
    notes: list[str] = field(default_factory=list[str])

    def format(self) -> str:
        """Render as ``file:line:col: error: message``, source line, caret, notes."""
        return format_diagnostic(
            self.message,
            self.span,
            severity=self.severity,
            filename=self.filename,
            notes=self.notes,
        )


class LocatedError(DiagnosticException):
    """A diagnostic attached to an operation and, when known, its source span."""

    def __init__(
        self, diagnostic: SourceDiagnostic, op: Operation | None = None
    ) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic
        self.op = op

    def __str__(self) -> str:
        return self.diagnostic.format().rstrip("\n")


class VerificationError(LocatedError, VerifyException):
    """A verifier failure located at the offending operation."""


def error_at(op: Operation, message: str, *, notes: Sequence[str] = ()) -> LocatedError:
    """An error for passes to raise, reported at ``op``'s source location.

    ``raise error_at(op, "cannot fuse: rotary_dim is odd")`` prints
    ``file:line:col: error: 'attn.rope' op cannot fuse: rotary_dim is odd``.
    """
    top = op
    while (parent := top.parent_op()) is not None:
        top = parent
    locations = locations_of(top) if isinstance(top, ModuleOp) else None
    span, loc_text, loc_notes = _op_location(op, locations)
    text = (
        message if message.startswith(f"'{op.name}'") else f"'{op.name}' op {message}"
    )
    diag = SourceDiagnostic(text, span, filename=loc_text, notes=[*loc_notes, *notes])
    return LocatedError(diag, op)


def _caret_line(line: str, start_col: int, length: int) -> str:
    """A caret line under ``line`` starting at 1-based ``start_col``, tabs preserved."""
    prefix = "".join("\t" if c == "\t" else " " for c in line[: start_col - 1])
    width = max(1, min(length, len(line) - (start_col - 1)))
    return prefix + "^" + "~" * (width - 1)


def format_diagnostic(
    message: str,
    span: Span | None = None,
    *,
    severity: str = "error",
    filename: str | None = None,
    notes: Iterable[str] = (),
) -> str:
    """Format a diagnostic like MLIR: location, severity, one-line reason, context.

    The first line of ``message`` is the reason; further lines follow verbatim after
    the source context. With a span the output shows the source line and a caret
    under the span; ``notes`` are appended as ``note: ...`` lines.
    """
    first, *rest = message.strip("\n").split("\n") or [""]
    out: list[str] = []
    if span is not None:
        loc = span.get_location()
        out.append(f"{loc}: {severity}: {first}")
        content = span.input.content
        line_start = span.input.get_start_of_line(span.start)
        line_end = span.input.get_end_of_line(span.start)
        raw = content[line_start:line_end]
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        line = line.removesuffix("\r")
        out.append(line)
        length = min(span.end, line_end) - span.start
        out.append(_caret_line(line, loc.col, length))
    elif filename:
        out.append(f"{filename}: {severity}: {first}")
    else:
        out.append(f"{severity}: {first}")
    out.extend(r for r in rest if r.strip())
    for note in notes:
        out.append(note if note.startswith(("note:", "error:")) else f"note: {note}")
    return "\n".join(out) + "\n"


def describe_spec_error(exc: ArgSpecParseError) -> str:
    """xDSL's pass-pipeline syntax error as ``reason`` plus the text and a caret."""
    lines = str(exc).rstrip("\n").split("\n")
    # "Error parsing pass pipeline specification:", "pass-pipeline:1:5", text, caret, msg
    if len(lines) >= 5 and lines[1].startswith("pass-pipeline:"):
        text, caret, reason = lines[2], lines[3], lines[4].strip()
        return f"{reason}\n  {text}\n  {caret}"
    return str(exc)


def format_exception(exc: BaseException, filename: str | None = None) -> str:
    """Format a parse, verify, pass-pipeline or other diagnostic exception."""
    if isinstance(exc, LocatedError):
        return exc.diagnostic.format()
    if isinstance(exc, MultipleSpansParseError):
        notes = [
            format_diagnostic(msg or "see here", span, severity="note").rstrip("\n")
            for span, msg in exc.refs
        ]
        if exc.ref_text:
            notes.insert(0, exc.ref_text.strip())
        return format_diagnostic(exc.msg, exc.span, notes=notes)
    if isinstance(exc, ParseError):
        return format_diagnostic(exc.msg, exc.span)
    if isinstance(exc, ArgSpecParseError):
        return format_diagnostic(describe_spec_error(exc), filename=filename)
    if isinstance(exc, DiagnosticException) or isinstance(exc, ValueError):
        return format_diagnostic(str(exc) or type(exc).__name__, filename=filename)
    return format_diagnostic(f"{type(exc).__name__}: {exc}", filename=filename)


def _op_location(
    op: Operation, locations: SourceLocations | None
) -> tuple[Span | None, str | None, list[str]]:
    """Span (or FileLineColLoc text) for ``op`` and notes explaining fallbacks."""
    if locations is not None:
        if (span := locations.get(op)) is not None:
            return span, None, []
    if isinstance(op.location, FileLineColLoc):
        loc = op.location
        text = f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
        return None, text, []
    if locations is not None and (found := locations.nearest(op)) is not None:
        anc, span = found
        note = (
            f"'{op.name}' has no source location (created by a pass?); "
            f"reported at its enclosing '{anc.name}'"
        )
        return span, None, [note]
    return None, None, []


def _first_failure(op: Operation) -> tuple[Operation, DiagnosticException] | None:
    """The innermost op whose verification fails, descending from ``op``."""
    try:
        op.verify()
    except DiagnosticException as err:
        failure: tuple[Operation, DiagnosticException] = (op, err)
    else:
        return None
    for region in op.regions:
        for block in region.blocks:
            for child in block.ops:
                if (inner := _first_failure(child)) is not None:
                    return inner
    return failure


def _one_line(text: str) -> str:
    """Join xDSL's 'does not verify:' continuation lines into one line."""
    lines = [ln.strip() for ln in text.strip().split("\n") if ln.strip()]
    out: list[str] = []
    for ln in lines:
        if out and out[-1].endswith(":"):
            out[-1] = f"{out[-1]} {ln}"
        else:
            out.append(ln)
    return "\n".join(out)


def _short_message(op: Operation, err: BaseException) -> str:
    """MLIR-style ``'dialect.op' op reason`` from an xDSL verifier message."""
    text = _one_line(str(err)) or type(err).__name__
    text = text.removeprefix("Operation does not verify: ")
    text = text.removeprefix(f"Operation {op.name} ")
    text = text.removeprefix(f"{op.name}: ")  # dialects often prefix their own name
    if text.startswith(f"'{op.name}'"):
        return text
    return f"'{op.name}' op {text}"


def verify_module(
    module: Operation,
    locations: SourceLocations | None = None,
    *,
    notes: Sequence[str] = (),
) -> None:
    """Verify ``module``; on failure raise a :class:`VerificationError` at the op.

    ``locations`` defaults to the table recorded when the module was parsed.
    """
    try:
        module.verify()
    except DiagnosticException as err:
        if locations is None and isinstance(module, ModuleOp):
            locations = locations_of(module)
        found = _first_failure(module)
        op, cause = found if found is not None else (module, err)
        span, loc_text, loc_notes = _op_location(op, locations)
        message = _short_message(op, cause)
        diag = SourceDiagnostic(
            message,
            span,
            filename=loc_text,
            notes=[*loc_notes, *notes],
        )
        if span is None and loc_text is None:
            diag.notes.append("the failing operation:\n" + _generic_text(op))
        raise VerificationError(diag, op) from err


def _generic_text(op: Operation) -> str:
    from io import StringIO

    from xdsl.printer import Printer

    stream = StringIO()
    Printer(stream=stream, print_generic_format=True).print_op(op)
    text = stream.getvalue()
    lines = text.split("\n")
    if len(lines) > 20:
        text = "\n".join([*lines[:20], "  ..."])
    return text
