"""``--verify-diagnostics``: check emitted diagnostics against source annotations.

The semantics of MLIR's ``SourceMgrDiagnosticVerifierHandler``. A test file says which
diagnostics it expects in comments::

    %r = attn.rope %q {theta = -1.0} : tensor<?x8x?x64xf16>  // expected-error {{theta}}
    // expected-error @+1 {{must be positive}}
    %s = attn.scores %q, %k {scale = -1.0} : ...
    // expected-note @above {{in pass 'lower-backward'}}

``expected-error``, ``expected-warning``, ``expected-note`` and ``expected-remark``
name the severity; ``{{text}}`` must occur in the message (``expected-error-re``: the
text is literal except ``{{regex}}`` parts). The line is the annotation's own line, or
``@+N`` / ``@-N`` lines away, ``@above`` (the closest line above that has no
annotation), ``@below`` (the closest such line below), or ``@unknown`` (a diagnostic
without a location). Every emitted diagnostic must match an annotation and every
annotation a diagnostic; :func:`check_diagnostics` returns what did not, as located
errors. xDSL 0.75's ``--verify-diagnostics`` only prints the diagnostic, so none of it
can be reused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from xdsl.utils.exceptions import MultipleSpansParseError, ParseError
from xdsl.utils.lexer import Input, Span

from attnfuse.diagnostics import LocatedError, format_diagnostic

__all__ = [
    "Diagnostic",
    "Expectation",
    "check_diagnostics",
    "collect_diagnostics",
    "parse_expectations",
]

_START = re.compile(r"//\s*expected-(error|warning|note|remark)(-re)?\b")
_REST = re.compile(r"\s*(?:@([+-][0-9]+|above|below|unknown))?\s*\{\{(.*)\}\}\s*$")
_FILE_LINE_COL = re.compile(r"^(.*):([0-9]+):([0-9]+)$")


@dataclass(frozen=True)
class Diagnostic:
    """One emitted diagnostic (an error or one of its notes), flattened."""

    severity: str
    message: str
    span: Span | None = None
    """Where it points; None for an unlocated diagnostic or a ``loc(...)`` one."""
    where: str | None = None
    """``file:line:col`` (from a ``loc(...)``) or the file name, without a span."""

    @property
    def file_line(self) -> tuple[str, int] | None:
        """(file, 1-based line), or None for an unknown location."""
        if self.span is not None:
            loc = self.span.get_location()
            return loc.file, loc.line
        if self.where and (m := _FILE_LINE_COL.match(self.where)):
            return m.group(1), int(m.group(2))
        return None

    def format(self) -> str:
        """``file:line:col: severity: message`` with the source line and a caret."""
        return format_diagnostic(
            self.message, self.span, severity=self.severity, filename=self.where
        )


@dataclass(frozen=True)
class Expectation:
    """One ``// expected-<severity> [@designator] {{text}}`` annotation."""

    severity: str
    text: str
    pattern: re.Pattern[str] | None
    """For ``expected-<severity>-re``; else ``text`` is matched as a substring."""
    file: str
    line: int | None
    """The line the diagnostic is expected on; None for ``@unknown``."""
    span: Span = field(compare=False)
    """The annotation itself."""

    def matches(self, diag: Diagnostic) -> bool:
        """Same severity, same line, and the text occurs in the message."""
        if diag.severity != self.severity:
            return False
        expected_at = None if self.line is None else (self.file, self.line)
        if diag.file_line != expected_at:
            return False
        if self.pattern is not None:
            return self.pattern.search(diag.message) is not None
        return self.text in diag.message


def _regex(text: str, span: Span) -> re.Pattern[str]:
    """``expected-*-re`` text: literal, except ``{{regex}}`` parts."""
    parts: list[str] = []
    rest = text
    while (start := rest.find("{{")) >= 0:
        end = rest.find("}}", start + 2)
        if end < 0:
            raise ParseError(span, "unterminated '{{' in an expected-*-re annotation")
        parts += [re.escape(rest[:start]), f"(?:{rest[start + 2 : end]})"]
        rest = rest[end + 2 :]
    parts.append(re.escape(rest))
    try:
        return re.compile("".join(parts))
    except re.error as e:
        raise ParseError(span, f"invalid regex in annotation: {e}") from None


def parse_expectations(
    source: bytes | str, filename: str, line_offset: int = 0
) -> list[Expectation]:
    """The annotations in ``source`` (a chunk starting after ``line_offset`` lines).

    A comment that starts like an annotation but does not follow its grammar is a
    ``ParseError`` located at it: a typo must not silently disable a check.
    """
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    text = Input(source, filename)
    found: list[Expectation] = []
    below: list[tuple[str, str, re.Pattern[str] | None, Span]] = []
    last_plain: int | None = None
    pos = 0
    for index, line in enumerate(source.split("\n")):  # lines as the lexer counts
        number = index + 1 + line_offset
        start = _START.search(line)
        if start is None:
            for severity, body, pattern, span in below:
                found.append(Expectation(severity, body, pattern, filename, number, span))
            below, last_plain = [], number
            pos += len(line) + 1
            continue
        begin = pos + line.index("expected-", start.start())
        span = Span(begin, pos + start.end(), text, line_offset)
        pos += len(line) + 1
        rest = _REST.match(line, start.end())
        if rest is None:
            raise ParseError(
                span, "malformed annotation: expected [@+N|@-N|@above|@below|@unknown] "
                "{{message}}"
            )
        severity, designator, body = start.group(1), rest.group(1), rest.group(2)
        pattern = _regex(body, span) if start.group(2) else None
        if designator == "below":
            below.append((severity, body, pattern, span))
            continue
        target: int | None = number
        if designator == "unknown":
            target = None
        elif designator == "above":
            if last_plain is None:
                raise ParseError(span, "@above: no line without an annotation above")
            target = last_plain
        elif designator is not None:
            target = number + int(designator)
            if target <= line_offset:
                raise ParseError(span, f"@{designator} points outside the input")
        found.append(Expectation(severity, body, pattern, filename, target, span))
    if below:
        raise ParseError(below[0][3], "@below: no line without an annotation below")
    return found


def collect_diagnostics(exc: BaseException, filename: str) -> list[Diagnostic]:
    """The diagnostics an exception reports: the error, then its notes.

    A note without a location of its own is at its error's location (as in MLIR).
    """
    if isinstance(exc, LocatedError):
        diag = exc.diagnostic
        where = diag.filename if diag.span is not None or diag.filename else filename
        error = Diagnostic(diag.severity, diag.message, diag.span, where)
        notes = [
            Diagnostic("note", n.removeprefix("note:").strip(), diag.span, where)
            for n in diag.notes
        ]
        return [error, *notes]
    if isinstance(exc, MultipleSpansParseError):
        notes = [
            Diagnostic("note", msg or exc.ref_text or "see here", span)
            for span, msg in exc.refs
        ]
        return [Diagnostic("error", exc.msg, exc.span), *notes]
    if isinstance(exc, ParseError):
        return [Diagnostic("error", exc.msg, exc.span)]
    return [Diagnostic("error", str(exc) or type(exc).__name__, None, filename)]


def check_diagnostics(
    expected: list[Expectation], emitted: list[Diagnostic]
) -> list[Diagnostic]:
    """Errors for each unexpected diagnostic, then for each unmatched annotation."""
    unmatched = list(expected)
    failures: list[Diagnostic] = []
    for diag in emitted:
        match = next((e for e in unmatched if e.matches(diag)), None)
        if match is not None:
            unmatched.remove(match)
            continue
        message = f"unexpected {diag.severity}: {diag.message}"
        failures.append(Diagnostic("error", message, diag.span, diag.where))
    for exp in unmatched:
        message = f'expected {exp.severity} "{exp.text}" was not produced'
        failures.append(Diagnostic("error", message, exp.span))
    return failures
