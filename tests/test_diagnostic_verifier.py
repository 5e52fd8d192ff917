"""Tests for ``--verify-diagnostics`` matching (attnfuse.diagnostic_verifier)."""

from __future__ import annotations

import pytest
from xdsl.utils.exceptions import DiagnosticException, ParseError
from xdsl.utils.lexer import Input, Span

from attnfuse.diagnostic_verifier import (
    Diagnostic,
    check_diagnostics,
    collect_diagnostics,
    parse_expectations,
)
from attnfuse.diagnostics import error_at, parse_module_with_locations, verify_module
from attnfuse.pass_manager import make_context

SOURCE = """\
line 1
line 2  // expected-error {{same line}}
// expected-warning @+2 {{two below}}
// expected-note @-3 {{three above}}
line 5
// expected-remark @above {{above}}
// expected-error @below {{below}}
// expected-error-re @below {{value {{[0-9]+}} is}}
line 9
// expected-error @unknown {{anywhere}}
// the expected-error annotations above (prose, not an annotation)
"""


def test_designators_give_lines() -> None:
    found = parse_expectations(SOURCE, "t.mlir")
    assert [(e.severity, e.text, e.line) for e in found] == [
        ("error", "same line", 2),
        ("warning", "two below", 5),
        ("note", "three above", 1),
        ("remark", "above", 5),
        ("error", "below", 9),
        ("error", "value {{[0-9]+}} is", 9),
        ("error", "anywhere", None),
    ]
    assert str(found[0].span.get_location()) == "t.mlir:2:12"
    compact = parse_expectations("a\n// expected-error@-1{{x}}\n", "t.mlir")  # MLIR's spelling
    assert [(e.severity, e.text, e.line) for e in compact] == [("error", "x", 1)]
    shifted = parse_expectations(SOURCE, "t.mlir", line_offset=10)
    assert [e.line for e in shifted][:3] == [12, 15, 11]


def _diag(severity: str, message: str, line: int | None) -> Diagnostic:
    if line is None:
        return Diagnostic(severity, message, None, "t.mlir")
    text = "x\n" * 20
    return Diagnostic(severity, message, Span(2 * (line - 1), 2 * (line - 1) + 1, Input(text, "t.mlir")))


def test_every_diagnostic_and_every_annotation_must_match() -> None:
    expected = parse_expectations(SOURCE, "t.mlir")
    emitted = [
        _diag("error", "on the same line here", 2),
        _diag("warning", "two below!", 5),
        _diag("note", "three above", 1),
        _diag("remark", "above", 5),
        _diag("error", "below", 9),
        _diag("error", "value 42 is bad", 9),
        _diag("error", "anywhere at all", None),
    ]
    assert check_diagnostics(expected, emitted) == []
    failures = check_diagnostics(expected, [*emitted[:5], _diag("error", "value x is", 9)])
    assert [f.message for f in failures] == [
        "unexpected error: value x is",
        'expected error "value {{[0-9]+}} is" was not produced',
        'expected error "anywhere" was not produced',
    ]
    assert [str(f.span.get_location()) for f in failures if f.span] == [
        "t.mlir:9:1",
        "t.mlir:8:4",
        "t.mlir:10:4",
    ]
    # wrong severity, wrong line, and one annotation per diagnostic
    twice = [_diag("error", "same line", 2), _diag("error", "same line", 2)]
    assert len(check_diagnostics(expected[:1], twice)) == 1
    assert len(check_diagnostics(expected[:1], [_diag("warning", "same line", 2)])) == 2
    assert len(check_diagnostics(expected[:1], [_diag("error", "same line", 3)])) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("// expected-error {{x}", "malformed annotation"),
        ("// expected-error @+x {{x}}", "malformed annotation"),
        ("// expected-error x", "malformed annotation"),
        ("// expected-error-re {{a {{b}}", "unterminated '{{'"),
        ("// expected-error-re {{{{(}}}}", "invalid regex"),
        ("// expected-error @below {{x}}", "@below: no line"),
        ("// expected-error @above {{x}}", "@above: no line"),
        ("a\n// expected-error @-3 {{x}}", "points outside the input"),
    ],
)
def test_malformed_annotations_are_located_errors(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message) as info:
        parse_expectations(text, "t.mlir")
    assert info.value.span.get_location().file == "t.mlir"


def test_collect_diagnostics_notes_share_the_error_location() -> None:
    ctx = make_context()
    text = "func.func @f() {\n  func.return\n}\nfunc.func @f() {\n  func.return\n}\n"
    module, _ = parse_module_with_locations(ctx, text, "r.mlir")
    with pytest.raises(DiagnosticException) as info:
        verify_module(module, notes=["in pass 'x'"])
    diags = collect_diagnostics(info.value, "r.mlir")
    assert [(d.severity, d.file_line) for d in diags] == [
        ("error", ("r.mlir", 4)),
        ("note", ("r.mlir", 4)),
        ("note", ("r.mlir", 4)),
    ]
    assert diags[1].message == "in pass 'x'"
    op = next(iter(module.ops))
    assert collect_diagnostics(error_at(op, "bad"), "r.mlir")[0].file_line == ("r.mlir", 1)
    unlocated = collect_diagnostics(DiagnosticException("pass 'p' failed"), "r.mlir")
    assert unlocated == [Diagnostic("error", "pass 'p' failed", None, "r.mlir")]
    assert unlocated[0].file_line is None
