"""Bad calls and unlowerable programs fail cleanly, with messages that say what is wrong.

Calls: `AttnfuseArgumentError` (a ValueError) naming the argument and what was expected,
raised before any kernel runs. Programs: a diagnostic (`DiagnosticException`: parse,
verification or `ProgramError` wrapped by the pass manager), never a pass crash or a
traceback from inside the lowering.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from programs import Builder, Program, compile_program, pipeline
from xdsl.utils.exceptions import DiagnosticException, ParseError

import attnfuse
from attnfuse import api
from attnfuse.api import AttnfuseArgumentError
from attnfuse.pass_manager import (
    MissingPrerequisiteError,
    PassCrashError,
    PipelineError,
    UnknownPassError,
)

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def plain() -> tuple[Program, Any]:
    p = Builder().mask("causal").build()
    return p, compile_program(p.text)


def _args(p: Program, batch: int = 2, sq: int = 9, skv: int = 9) -> list[Any]:
    return p.inputs(batch, sq, skv, seed=1)


# ============================================================================ calls


def test_wrong_number_of_arguments(plain: tuple[Program, Any]) -> None:
    p, fn = plain
    args = _args(p)
    with pytest.raises(
        AttnfuseArgumentError, match=r"@f takes 3 arguments \(q, k, v\), got 2"
    ):
        fn(*args[:2])
    with pytest.raises(AttnfuseArgumentError, match="got 4"):
        fn(*args, args[0])


def test_wrong_rank(plain: tuple[Program, Any]) -> None:
    p, fn = plain
    q, k, v = _args(p)
    with pytest.raises(
        AttnfuseArgumentError,
        match=re.escape(
            "argument 0 'q': expected shape [?, 4, ?, 64] torch.float32, got (2, 4, 9)"
        ),
    ):
        fn(q[..., 0], k, v)


@pytest.mark.parametrize(
    "index,shape,expected",
    [
        (0, (2, 3, 9, 64), "argument 0 'q': expected shape [?, 4, ?, 64]"),
        (1, (2, 2, 9, 32), "argument 1 'k': expected shape [?, 2, ?, 64]"),
        (2, (2, 4, 9, 64), "argument 2 'v': expected shape [?, 2, ?, 64]"),
    ],
)
def test_wrong_static_dim(
    plain: tuple[Program, Any], index: int, shape: tuple[int, ...], expected: str
) -> None:
    p, fn = plain
    args = _args(p)
    args[index] = torch.randn(shape)
    with pytest.raises(AttnfuseArgumentError, match=re.escape(expected)):
        fn(*args)


def test_wrong_dtype(plain: tuple[Program, Any]) -> None:
    p, fn = plain
    q, k, v = _args(p)
    with pytest.raises(
        AttnfuseArgumentError,
        match=r"argument 1 'k': expected dtype torch.float32, got torch.float16",
    ):
        fn(q, k.half(), v)


def test_not_a_tensor(plain: tuple[Program, Any]) -> None:
    p, fn = plain
    q, k, v = _args(p)
    with pytest.raises(
        AttnfuseArgumentError, match=r"argument 2 'v': expected a tensor .* got list"
    ):
        fn(q, k, v.tolist())


def test_kv_length_mismatch(plain: tuple[Program, Any]) -> None:
    p, fn = plain
    q, k, v = _args(p)
    with pytest.raises(
        AttnfuseArgumentError, match=r"argument 2 'v': expected shape \[B=2, 2, Skv=9, 64\], got \(2, 2, 8, 64\)"
    ):
        fn(q, k, v[:, :, :8])


def test_batch_mismatch(plain: tuple[Program, Any]) -> None:
    p, fn = plain
    q, k, v = _args(p)
    with pytest.raises(AttnfuseArgumentError, match=r"argument 1 'k': expected shape \[B=2, 2, Skv=9, 64\], got \(1, 2, 9, 64\)"):
        fn(q, k[:1], v)


def test_mixed_devices_meta(plain: tuple[Program, Any]) -> None:
    """Checked before anything runs, so a meta tensor shows it without a GPU."""
    p, fn = plain
    q, k, v = _args(p)
    with pytest.raises(
        AttnfuseArgumentError,
        match="argument 2 'v': on meta, but earlier arguments are on cpu",
    ):
        fn(q, k, v.to("meta"))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_mixed_devices_cuda(plain: tuple[Program, Any]) -> None:
    p, fn = plain
    q, k, v = _args(p)
    with pytest.raises(AttnfuseArgumentError, match="on cuda"):
        fn(q, k.cuda(), v)


def test_seed_must_be_integer() -> None:
    p = Builder().build(dropout=0.1)
    fn = compile_program(p.text)
    q, k, v, _ = _args(p)
    with pytest.raises(
        AttnfuseArgumentError, match="argument 3 'seed': expected an integer, got float"
    ):
        fn(q, k, v, 1.5)
    with pytest.raises(
        AttnfuseArgumentError,
        match=r"argument 3 'seed': expected a scalar i64, got a tensor of shape \(2,\)",
    ):
        fn(q, k, v, torch.tensor([1, 2]))


def test_extra_operand_static_shape() -> None:
    b = Builder()
    b.alibi(slopes=True)
    p = b.build(sinks=True)
    fn = compile_program(p.text)
    args = _args(p)
    args[3] = torch.randn(3)
    with pytest.raises(
        AttnfuseArgumentError,
        match=re.escape(
            "argument 3 'slopes': expected shape [4] torch.float32, got (3,)"
        ),
    ):
        fn(*args)
    args = _args(p)
    args[4] = args[4].double()
    with pytest.raises(
        AttnfuseArgumentError,
        match="argument 4 'sinks': expected dtype torch.float32, got torch.float64",
    ):
        fn(*args)


# Dynamic dims of extra operands must agree with q/k/v: a kernel reads them with the
# lengths of q and k, so a shorter tensor would be read out of bounds.


def _doc_program() -> Program:
    b = Builder()
    ids = b.doc_ids()
    return b.mask("document", ids).build()


def _pos_program() -> Program:
    b = Builder()
    pos = b.positions(2)
    return b.rope(positions=pos).build()


def _bias_program() -> Program:
    return Builder().bias(("?", 4, "?", "?")).build()


def _weight_program() -> Program:
    b = Builder()
    w = b.arg(
        "wq",
        "tensor<?xf32>",
        lambda g, bb, sq, skv: 1.0 + 0.1 * torch.randn(64, generator=g),
    )
    b.lines.append(f"%qn0 = attn.qk_norm %q weight {w} : {b.qtype}, tensor<?xf32>")
    b.q = "%qn0"
    return b.build()


def _plen_program() -> Program:
    b = Builder()
    plen = b.prefix_lengths()
    return b.mask("prefix_lm", plen).build()




@pytest.mark.parametrize(
    "make,bad,needle",
    [
        (_doc_program, lambda a: a[3][:, :5], "'doc'"),
        (_pos_program, lambda a: a[3][:, :5], "'pos'"),
        (_bias_program, lambda a: a[3][:, :, :5, :5], "'bias'"),
        (_weight_program, lambda a: a[3][:16], "'wq'"),
        (_plen_program, lambda a: torch.cat([a[3], a[3]]), "'plen'"),
    ],
    ids=[
        "doc_ids_length",
        "positions_length",
        "bias_seq_dims",
        "norm_weight_length",
        "prefix_batch",
    ],
)
def test_extra_operand_dynamic_dims(make: Any, bad: Any, needle: str) -> None:
    p = make()
    fn = compile_program(p.text)
    args = _args(p)
    args[3] = bad(args)
    with pytest.raises(AttnfuseArgumentError, match=needle):
        fn(*args)


@pytest.mark.parametrize(
    "make,needle",
    [(_doc_program, "'doc'"), (_pos_program, "'pos'")],
    ids=["doc_ids", "positions"],
)
def test_shared_operand_needs_equal_lengths(make: Any, needle: str) -> None:
    """One ids / positions operand serves queries and keys, so it needs Sq == Skv: with
    9 queries and 5 keys the kernel would read query rows 5..8 past its end."""
    p = make()
    fn = compile_program(p.text)
    args = p.inputs(2, 9, 5, seed=1)
    with pytest.raises(AttnfuseArgumentError, match=needle):
        fn(*args)


def test_argument_error_is_value_error() -> None:
    assert issubclass(AttnfuseArgumentError, ValueError)


# ============================================================================ programs


def _two_outputs(base: str, extra: str) -> str:
    out = "tensor<?x4x?x64xf32>"
    text = base.replace(
        f"func.return %o : {out}", f"{extra}\n  func.return %o, %o2 : {out}, {out}"
    )
    return text.replace(f") -> {out} {{", f") -> ({out}, {out}) {{")


def test_scores_used_twice() -> None:
    base = Builder().build().text
    text = _two_outputs(
        base,
        (
            "%p2 = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>\n"
            "  %o2 = attn.weighted_sum %p2, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf32> -> tensor<?x4x?x64xf32>"
        ),
    )
    with pytest.raises(
        DiagnosticException,
        match="attn.scores result must have exactly one use .* found 2",
    ):
        api.compile(text, pipeline=pipeline())


def test_probs_used_twice() -> None:
    base = Builder().build().text
    text = _two_outputs(
        base,
        (
            "%o2 = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf32> -> tensor<?x4x?x64xf32>"
        ),
    )
    with pytest.raises(DiagnosticException, match="exactly one use"):
        api.compile(text, pipeline=pipeline())


def test_rope_result_used_twice() -> None:
    b = Builder().rope("q")
    p = b.build()
    text = _two_outputs(
        p.text,
        (
            "%s9 = attn.scores %qr1, %k : tensor<?x4x?x64xf32>, tensor<?x2x?x64xf32> -> !attn.scores<?x4x?x?xf32>\n"
            "  %p9 = attn.softmax %s9 : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>\n"
            "  %o2 = attn.weighted_sum %p9, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf32> -> tensor<?x4x?x64xf32>"
        ),
    )
    with pytest.raises(DiagnosticException, match="exactly one"):
        api.compile(text, pipeline=pipeline())


def test_return_extra_value() -> None:
    base = Builder().build().text
    text = _two_outputs(
        base,
        "%o2 = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf32> -> tensor<?x4x?x64xf32>",
    )
    with pytest.raises(DiagnosticException):
        api.compile(text, pipeline=pipeline())


@pytest.mark.parametrize(
    "body,needle",
    [
        (
            "%keep$ = arith.cmpi ult, %kv$, %q$ : index\nattn.yield %keep$ : i1",
            "unsigned comparisons are not supported",
        ),
        (
            (
                "%c$ = arith.constant 2 : index\n%r$ = arith.divui %kv$, %c$ : index\n"
                "%keep$ = arith.cmpi sle, %r$, %q$ : index\nattn.yield %keep$ : i1"
            ),
            "cannot lower arith.divui",
        ),
    ],
    ids=["unsigned_compare", "divui"],
)
def test_region_op_without_lowering(body: str, needle: str) -> None:
    p = Builder().custom_mask(body).build()
    with pytest.raises(DiagnosticException, match=needle) as info:
        api.compile(p.text, pipeline=pipeline())
    assert not isinstance(info.value, PassCrashError)


def test_parse_error_is_located() -> None:
    text = Builder().build().text.replace("attn.scores %q", "attn.scorez %q")
    with pytest.raises(ParseError, match=r"<program>:\d+:\d+"):
        api.compile(text, pipeline=pipeline())


def test_verification_error_is_located() -> None:
    text = (
        Builder().build().text.replace("tensor<?x2x?x64xf32>", "tensor<?x3x?x64xf32>")
    )
    with pytest.raises(
        DiagnosticException, match=r"<program>:\d+:\d+: error: .*multiple of key heads"
    ):
        api.compile(text, pipeline=pipeline())


def test_pipeline_errors() -> None:
    text = Builder().build().text
    with pytest.raises(MissingPrerequisiteError, match="requires 'rope-fusion'"):
        api.compile(text, pipeline="lower-to-tile")
    with pytest.raises(UnknownPassError, match="unknown pass 'nope'"):
        api.compile(text, pipeline="attn-canonicalize,nope")


@pytest.mark.parametrize(
    "pipe,needle",
    [
        (
            pipeline().replace("block-m=16", "block-m=24"),
            "block-m must be a power of two",
        ),
        (pipeline("bogus"), "strategy must be one of"),
    ],
    ids=["block_size", "strategy"],
)
def test_bad_pass_option_is_not_a_crash(pipe: str, needle: str) -> None:
    """A bad option value is the user's mistake: a pipeline error or a diagnostic, not a
    PassCrashError ("crashed", reserved for compiler bugs)."""
    text = Builder().build().text
    with pytest.raises((PipelineError, DiagnosticException), match=needle):
        api.compile(text, pipeline=pipe)


def test_missing_file() -> None:
    with pytest.raises(FileNotFoundError):
        api.compile("/nonexistent/program.attn")


def test_no_attention_function() -> None:
    text = "func.func @empty() {\n  func.return\n}\n"
    with pytest.raises(ValueError, match="no attention function"):
        api.compile(text, pipeline=pipeline())


def test_program_file_that_is_not_utf8(tmp_path: Any) -> None:
    """A program file of invalid UTF-8 is a located ParseError (it was a raw
    UnicodeDecodeError from Path.read_text)."""
    path = tmp_path / "bad.attn"
    path.write_bytes(b"func.func @f() {\n  \xff\xfe\x00 }\n")
    with pytest.raises(ParseError) as info:
        attnfuse.compile(path)
    assert "bad.attn:2:" in str(info.value)
