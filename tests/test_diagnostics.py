"""Tests for source locations and MLIR-style diagnostics (attnfuse.diagnostics)."""

from __future__ import annotations

import pytest
from xdsl.dialects import arith
from xdsl.dialects.builtin import ModuleOp, i32
from xdsl.utils.exceptions import ParseError
from xdsl.utils.lexer import Input, Span

from attnfuse.diagnostics import (
    VerificationError,
    error_at,
    format_diagnostic,
    format_exception,
    locations_of,
    parse_module_with_locations,
    verify_module,
)
from attnfuse.pass_manager import make_context

NESTED = """\
func.func @outer(%a: i32, %b: i64) -> i32 {
  %r = "scf.execute_region"() ({
    %c = "arith.addi"(%a, %b) : (i32, i64) -> i32
    scf.yield %c : i32
  }) : () -> i32
  func.return %r : i32
}
"""


def test_every_op_gets_its_name_token_location() -> None:
    module, locs = parse_module_with_locations(make_context(), NESTED, "n.mlir")
    assert locations_of(module) is locs
    where = {
        op.name: (span.get_location().line, span.get_location().col, span.text)
        for op in module.walk()
        if (span := locs.get(op)) is not None
    }
    assert where["func.func"] == (1, 1, "func.func")
    assert where["scf.execute_region"] == (2, 8, '"scf.execute_region"')
    assert where["arith.addi"] == (3, 10, '"arith.addi"')
    assert where["scf.yield"] == (4, 5, "scf.yield")
    assert module not in locs  # the implicit module has no source text


def test_line_offset_for_chunks() -> None:
    text = "func.func @f() {\n  func.return\n}\n"
    module, locs = parse_module_with_locations(
        make_context(), text, "x.mlir", line_offset=10
    )
    ret = next(op for op in module.walk() if op.name == "func.return")
    span = locs.get(ret)
    assert span is not None and str(span.get_location()) == "x.mlir:12:3"
    with pytest.raises(ParseError) as info:
        parse_module_with_locations(
            make_context(), "\n\n%x = ", "x.mlir", line_offset=5
        )
    assert info.value.span.get_location().line > 5


def test_comment_only_input_is_an_empty_module() -> None:
    module, _ = parse_module_with_locations(make_context(), "// nothing\n\n", "e.mlir")
    assert isinstance(module, ModuleOp) and not list(module.ops)


def test_verifier_error_points_at_innermost_op() -> None:
    module, _ = parse_module_with_locations(make_context(), NESTED, "n.mlir")
    with pytest.raises(VerificationError) as info:
        verify_module(module)
    assert info.value.op is not None and info.value.op.name == "arith.addi"
    text = str(info.value)
    assert text.startswith(
        "n.mlir:3:10: error: 'arith.addi' op operand 'rhs' at position 1 does not "
        "verify: attribute i32 expected from variable 'T', but got i64\n"
    )
    assert text.splitlines()[1:] == [
        '    %c = "arith.addi"(%a, %b) : (i32, i64) -> i32',
        "         ^~~~~~~~~~~~",
    ]


def test_unlocated_op_reported_at_enclosing_op() -> None:
    text = "func.func @f(%a: i32, %b: i64) -> i32 {\n  func.return %a : i32\n}\n"
    module, _ = parse_module_with_locations(make_context(), text, "u.mlir")
    func_op = next(op for op in module.walk() if op.name == "func.func")
    a, b = func_op.body.block.args
    bad = arith.AddiOp(a, b, i32)  # created "by a pass": no source location
    func_op.body.block.insert_op_before(bad, func_op.body.block.first_op)
    with pytest.raises(VerificationError) as info:
        verify_module(module, notes=["after pass 'x'"])
    diag = info.value.diagnostic
    assert info.value.op is bad
    assert diag.span is not None and str(diag.span.get_location()) == "u.mlir:1:1"
    assert any("reported at its enclosing 'func.func'" in n for n in diag.notes)
    assert diag.notes[-1] == "after pass 'x'"


def test_module_without_locations_prints_the_failing_op() -> None:
    module, _ = parse_module_with_locations(make_context(), NESTED, "n.mlir")
    clone = module.clone()  # clones carry no locations
    with pytest.raises(VerificationError) as info:
        verify_module(clone)
    assert info.value.diagnostic.span is None
    assert str(info.value).startswith("error: 'arith.addi' op operand 'rhs'")
    assert '"arith.addi"' in str(info.value)  # the op itself, printed generically


def test_error_at_for_passes() -> None:
    module, _ = parse_module_with_locations(make_context(), NESTED, "n.mlir")
    add = next(op for op in module.walk() if op.name == "arith.addi")
    err = error_at(add, "cannot fuse this", notes=["try -p cse first"])
    assert format_exception(err) == (
        "n.mlir:3:10: error: 'arith.addi' op cannot fuse this\n"
        '    %c = "arith.addi"(%a, %b) : (i32, i64) -> i32\n'
        "         ^~~~~~~~~~~~\n"
        "note: try -p cse first\n"
    )


def test_format_diagnostic_keeps_tabs_and_clips_multiline_spans() -> None:
    inp = Input("\tx = bad\nnext line\n", "t.mlir")
    out = format_diagnostic("boom", Span(5, 15, inp))
    assert out == "t.mlir:1:6: error: boom\n\tx = bad\n\t    ^~~\n"
    assert format_diagnostic("oops", filename="f.attn") == "f.attn: error: oops\n"
    assert format_diagnostic("warn", severity="warning") == "warning: warn\n"


def test_parse_errors_are_formatted_like_mlir() -> None:
    with pytest.raises(ParseError) as info:
        parse_module_with_locations(
            make_context(), "func.func @f() {\n  foo.bar\n}\n", "p.mlir"
        )
    assert format_exception(info.value).splitlines() == [
        "p.mlir:2:3: error: Operation foo.bar is not registered "
        "(use --allow-unregistered-dialect to accept it)",
        "  foo.bar",
        "  ^~~~~~~",
    ]


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (  # an op that verifies its types while it is parsed
            "func.func @f(%x: f32, %c: i1) {\n  %d = arith.divf %x, %c : i1\n  func.return\n}\n",
            "p.mlir:2:8",
            "'arith.divf' op Unexpected attribute i1",
        ),
        (  # xDSL 0.75 raised a bare ValueError for numeric block labels
            "func.func @f() {\n^0:\n  func.return\n}\n",
            "p.mlir:2:1",
            "unsupported block label '^0'",
        ),
    ],
)
def test_errors_raised_while_parsing_are_located(
    text: str, where: str, message: str
) -> None:
    with pytest.raises(ParseError) as info:
        parse_module_with_locations(make_context(), text, "p.mlir")
    first = format_exception(info.value).splitlines()[0]
    assert first.startswith(f"{where}: error: {message}")


# ------------------------------------------------------------------------ dominance

USE_BEFORE_DEF = """\
func.func @f(%q: tensor<?x8x?x64xf32>, %k: tensor<?x8x?x64xf32>, %v: tensor<?x8x?x64xf32>) -> tensor<?x8x?x64xf32> {
  %s = attn.scores %q, %k : tensor<?x8x?x64xf32>, tensor<?x8x?x64xf32> -> !attn.scores<?x8x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x8x?x64xf32> -> tensor<?x8x?x64xf32>
  %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>
  func.return %o : tensor<?x8x?x64xf32>
}
"""

ACROSS_REGIONS = """\
func.func @f(%a: i32) -> i32 {
  %early = arith.addi %a, %a : i32
  %r = "scf.execute_region"() ({
    %c = arith.addi %early, %late : i32
    scf.yield %c : i32
  }) : () -> i32
  %late = arith.addi %a, %a : i32
  func.return %r : i32
}
"""

BRANCHES = """\
func.func @g(%c: i1, %a: i32) -> i32 {
  cf.cond_br %c, ^bb1, ^bb2
^bb1:
  %x = arith.addi %a, %a : i32
  cf.br ^bb3
^bb2:
  cf.br ^bb3
^bb3:
  %y = arith.addi %USE, %a : i32
  func.return %y : i32
}
"""


def _verify(text: str) -> None:
    from xdsl.dialects.cf import Cf

    ctx = make_context()
    ctx.load_dialect(Cf)
    module, _ = parse_module_with_locations(ctx, text, "d.mlir")
    verify_module(module)


def test_use_before_def_in_a_block() -> None:
    with pytest.raises(VerificationError) as info:
        _verify(USE_BEFORE_DEF)
    lines = str(info.value).splitlines()
    assert lines[0] == (
        "d.mlir:3:8: error: 'attn.weighted_sum' op operand #0 (%p) does not dominate "
        "this use"
    )
    assert lines[-1] == "note: operand defined here (d.mlir:4:8)"


def test_use_before_def_across_regions() -> None:
    with pytest.raises(VerificationError) as info:
        _verify(ACROSS_REGIONS)
    assert str(info.value).startswith(
        "d.mlir:4:10: error: 'arith.addi' op operand #1 (%late) does not dominate"
    )
    _verify(ACROSS_REGIONS.replace("%late : i32\n    scf", "%a : i32\n    scf"))


def test_dominance_across_blocks() -> None:
    with pytest.raises(VerificationError, match=r"d.mlir:9:8: .*operand #0 \(%x\)"):
        _verify(BRANCHES.replace("%USE", "%x"))
    _verify(BRANCHES.replace("%USE", "%a"))  # a function argument dominates all
    moved = BRANCHES.replace("  cf.br ^bb3\n^bb2:", "  %z = arith.addi %x, %a : i32\n  cf.br ^bb3\n^bb2:")
    _verify(moved.replace("%USE", "%a"))  # same block, after the definition
    entry = "  %e = arith.addi %a, %a : i32\n  cf.cond_br"
    unreachable = BRANCHES.replace("  cf.cond_br", entry).replace(
        "^bb3:\n", "^bb4:\n  cf.br ^bb3\n^bb3:\n"
    )
    _verify(unreachable.replace("%USE", "%e"))  # an unreachable jump into ^bb3


def test_reference_rejects_use_before_def_instead_of_a_key_error() -> None:
    import torch

    from attnfuse import reference

    q = torch.zeros(1, 8, 4, 64)
    with pytest.raises(VerificationError, match="does not dominate"):
        reference.run(USE_BEFORE_DEF, q, q, q)
