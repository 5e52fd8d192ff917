"""MLIR-style diagnostics for AttnFuse.

* :func:`verify_module` runs xDSL's verifier and AttnFuse's extra checks (dominance,
  symbol redefinitions: :mod:`attnfuse.ir_checks`) and, on failure, raises a
  :class:`VerificationError` located at the innermost failing op.
* :func:`error_at` builds an error located at an op, for passes to raise.
* :func:`format_diagnostic` / :func:`format_exception` render errors like ``mlir-opt``::

      prog.attn:4:8: error: 'attn.scores' op head dims differ
        %s = attn.scores %q, %k : ...
             ^~~~~~~~~~~

Ops know their source locations through the side table of
:mod:`attnfuse.source_locations`, whose parser entry points are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import FileLineColLoc, ModuleOp
from xdsl.ir import Operation
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    MultipleSpansParseError,
    ParseError,
    VerifyException,
)
from xdsl.utils.lexer import Span

from attnfuse.ir_checks import (
    Violation,
    first_dominance_violation,
    first_redefined_symbol,
)
from attnfuse.source_locations import (
    LocatingParser,
    SourceLocations,
    decode_source,
    locations_of,
    parse_module_with_locations,
)

__all__ = [
    "LocatedError",
    "LocatingParser",
    "OpError",
    "SourceDiagnostic",
    "SourceLocations",
    "VerificationError",
    "decode_source",
    "describe_spec_error",
    "error_at",
    "format_diagnostic",
    "format_exception",
    "locations_of",
    "parse_module_with_locations",
    "verify_module",
]


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


class OpError(DiagnosticException):
    """An error about ``op`` (when known) that the pass manager reports at ``op``'s
    source location, for analyses that do not build the diagnostic themselves."""

    def __init__(self, message: str, op: Operation | None = None) -> None:
        super().__init__(message)
        self.op = op


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

    ``locations`` defaults to the table recorded when the module was parsed. Besides
    xDSL's verifier this checks symbol redefinitions (reported at the second
    definition) and dominance (:mod:`attnfuse.ir_checks`).
    """
    if locations is None and isinstance(module, ModuleOp):
        locations = locations_of(module)
    cause: DiagnosticException | None = None
    found = first_redefined_symbol(module)
    if found is None:
        try:
            module.verify()
        except DiagnosticException as err:
            cause = err
            op, err = _first_failure(module) or (module, err)
            found = Violation(op, _short_message(op, err))
        else:
            found = first_dominance_violation(module)
    if found is None:
        return
    span, loc_text, loc_notes = _op_location(found.op, locations)
    diag = SourceDiagnostic(
        found.message, span, filename=loc_text, notes=[*loc_notes, *notes]
    )
    if found.related is not None:
        where, text, _ = _op_location(found.related, locations)
        if where is not None or text is not None:
            at = where.get_location() if where is not None else text
            diag.notes.append(f"{found.related_message} ({at})")
    if span is None and loc_text is None:
        diag.notes.append("the failing operation:\n" + _generic_text(found.op))
    raise VerificationError(diag, found.op) from cause


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
