"""In-process tests for ``attnfuse-opt`` (attnfuse.driver.AttnfuseOptMain)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from xdsl.universe import Universe

import attnfuse.driver as driver
from attnfuse.driver import EXIT_ERROR, EXIT_INTERNAL, EXIT_USAGE, AttnfuseOptMain, main
from attnfuse.pass_manager import available_passes, unregister_pass

ROOT = Path(__file__).parent.parent
PLUGIN = ROOT / "tests" / "filecheck" / "driver" / "Inputs" / "plugin_passes.py"
DROPOUT = ROOT / "examples" / "dropout.attn"
LLAMA3 = ROOT / "examples" / "llama3.attn"

GOOD = """\
func.func @f(%a: i32) -> i32 {
  %b = arith.addi %a, %a : i32
  %c = arith.addi %a, %a : i32
  func.return %c : i32
}
"""
BAD_SYNTAX = "func.func @f(%a: i32) -> i32 {\n  %c = arith.addi %a %a : i32\n}\n"
BAD_TYPES = """\
func.func @g(%a: i32, %b: i64) -> i32 {
  %c = "arith.addi"(%a, %b) : (i32, i64) -> i32
  func.return %c : i32
}
"""


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    before = set(available_passes())
    yield
    for name in set(available_passes()) - before:
        unregister_pass(name)


def run(
    args: Sequence[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """Run the driver in-process: (exit code, stdout, stderr)."""
    try:
        AttnfuseOptMain(args=list(args)).run()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def write(tmp_path: Path, text: str, name: str = "x.mlir") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_plain_run_prints_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([write(tmp_path, GOOD), "-p", "cse"], capsys)
    assert code == 0 and err == ""
    assert "%b" not in out and "func.return %c : i32" in out


def test_parse_error_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BAD_SYNTAX)
    code, out, err = run([path], capsys)
    assert code == EXIT_ERROR and out == ""
    assert err.splitlines() == [
        f"{path}:2:22: error: Expected ','",
        "  %c = arith.addi %a %a : i32",
        "                     ^~",
    ]


def test_verify_error_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BAD_TYPES)
    code, _, err = run([path], capsys)
    assert code == EXIT_ERROR
    first = err.splitlines()[0]
    assert re.fullmatch(
        re.escape(path) + r":2:8: error: 'arith\.addi' op .* but got i64", first
    )


def test_verify_diagnostics_and_split_offsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    annotated_types = BAD_TYPES.replace(
        "-> i32\n  func.return", "-> i32  // expected-error {{'arith.addi' op}}\n  func.return"
    )
    annotated_syntax = BAD_SYNTAX + "// expected-error @-2 {{Expected ','}}\n"
    text = GOOD + "// -----\n" + annotated_types + "// -----\n" + annotated_syntax
    path = write(tmp_path, text)
    code, out, err = run([path, "--split-input-file", "--verify-diagnostics"], capsys)
    assert code == 0 and err == ""
    assert out.count("// -----\n") == 2
    assert "func.func @f" in out  # the valid chunk is still printed
    assert "error" not in out

    code, out, err = run([path, "--split-input-file"], capsys)
    assert code == EXIT_ERROR
    assert f"{path}:8:8: error" in err and f"{path}:13:22: error" in err  # all chunks

    wrong = text.replace("{{Expected ','}}", "{{Expected ';'}}")
    code, _, err = run([write(tmp_path, wrong), "--split-input-file", "--verify-diagnostics"], capsys)
    assert code == EXIT_ERROR
    assert f"{path}:13:22: error: unexpected error: Expected ','" in err
    assert f"""{path}:15:4: error: expected error "Expected ';'" was not produced""" in err


def test_stdin_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BAD_SYNTAX.encode())))
    code, _, err = run([], capsys)
    assert code == EXIT_ERROR and err.startswith("<stdin>:2:22: error: Expected ','")


def test_print_ir_after_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        [write(tmp_path, GOOD), "-p", "cse,canonicalize", "--print-ir-after-all"],
        capsys,
    )
    assert code == 0
    headers = [ln for ln in err.splitlines() if ln.startswith("// -----//")]
    assert headers == [
        "// -----// IR Dump After cse //----- //",
        "// -----// IR Dump After canonicalize //----- //",
    ]
    assert err.count("builtin.module") == 2 and out.count("builtin.module") == 1


def test_time_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([write(tmp_path, GOOD), "-p", "cse", "--time-passes"], capsys)
    assert code == 0
    names = re.findall(r"%\)  (.*)$", err, re.M)
    assert names == ["(parse)", "cse", "(verifier)", "(output)", "Total"]


def test_pipeline_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD)
    code, _, err = run([path, "-p", "canonicalise"], capsys)
    assert code == EXIT_ERROR
    assert err.startswith(
        "attnfuse-opt: error: unknown pass 'canonicalise'; did you mean"
    )
    code, _, err = run(
        [path, "--pass-plugin", str(PLUGIN), "-p", "test-requires-tag"], capsys
    )
    assert code == EXIT_ERROR
    assert "pass 'test-requires-tag' requires 'test-tag-funcs'" in err


def test_pass_failures_and_crashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, GOOD)
    code, _, err = run(
        [path, "--pass-plugin", str(PLUGIN), "-p", "test-reject"], capsys
    )
    assert code == EXIT_ERROR
    assert err.startswith(f"{path}:2:8: error: 'arith.addi' op rejected by test-reject")
    code, _, err = run([path, "--pass-plugin", str(PLUGIN), "-p", "test-break-ir"], capsys)
    assert code == EXIT_INTERNAL  # a pass that breaks the IR is a bug, not bad input
    assert err.startswith(f"{path}:4:3: error: 'func.return' op Expected arguments")
    assert err.endswith("note: this is a bug in AttnFuse or a plugin; set "
                        "ATTNFUSE_TRACEBACK=1 for the Python traceback\n")
    code, _, err = run([path, "--pass-plugin", str(PLUGIN), "-p", "test-crash"], capsys)
    assert code == EXIT_INTERNAL
    assert "pass 'test-crash' crashed: RuntimeError: boom" in err
    assert "ATTNFUSE_TRACEBACK=1" in err
    monkeypatch.setenv("ATTNFUSE_TRACEBACK", "1")
    with pytest.raises(SystemExit):
        AttnfuseOptMain(
            args=[path, "--pass-plugin", str(PLUGIN), "-p", "test-crash"]
        ).run()
    assert "Traceback" in capsys.readouterr().err


def test_bad_pass_option_value_is_an_error_not_a_crash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    llama = ROOT / "examples" / "llama3.attn"
    code, _, err = run(
        [str(llama), "-p", "online-softmax,mask-tiling{block-m=100}"], capsys
    )
    assert code == EXIT_ERROR
    assert err.startswith(f"{llama}: error: pass 'mask-tiling' failed: block-m must be")


def test_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([str(tmp_path / "missing.mlir")], capsys)
    assert code == EXIT_ERROR and "cannot read" in err and "No such file" in err
    txt = write(tmp_path, GOOD, "prog.txt")
    code, _, err = run([txt], capsys)
    assert code == EXIT_ERROR and "unrecognized file extension 'txt'" in err
    code, out, _ = run([txt, "-f", "mlir"], capsys)
    assert code == 0 and "func.func @f" in out


def test_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "out.mlir"
    code, out, _ = run([write(tmp_path, GOOD), "-o", str(out_path)], capsys)
    assert code == 0 and out == "" and "func.func @f" in out_path.read_text()


def test_attn_file_and_target(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([str(DROPOUT)], capsys)
    assert code == 0 and "attn.dropout" in out
    code, out, _ = run(
        [
            str(DROPOUT),
            "--pass-plugin",
            str(PLUGIN),
            "-p",
            "test-target",
            "--device",
            "H200",
            "--seq-len",
            "2048",
        ],
        capsys,
    )
    assert code == 0 and 'test.target = "h200", test.seq_len = "2048"' in out
    code, _, err = run([str(DROPOUT), "--device", "gtx480"], capsys)
    assert code == 1 and "unknown target 'gtx480'; known targets: a100," in err


def test_cost_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([str(LLAMA3), "--device", "l4", "--seq-len", "512", "--cost-report"], capsys)
    assert code == 0 and "@llama3 on l4: B=32 Hq=32 Hkv=8 S=512" in out
    assert "choice: hybrid (forward)" in out and "fused vs separate: fused stops winning at S = 3840" in out
    assert "attn.rope" not in out  # the report replaces the IR
    code, _, err = run([str(LLAMA3), "--cost-report"], capsys)
    assert code == 2 and "--cost-report needs --device NAME" in err
    code, _, err = run([str(LLAMA3), "--device", "h200", "--seq-len", "-1", "--cost-report"], capsys)
    assert code == 2 and "--seq-len must be >= 0" in err


def test_triton_target_defaults_to_the_default_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    monkeypatch.setattr(driver, "DEFAULT_PIPELINE", "cse,canonicalize")
    opt = AttnfuseOptMain(args=[path, "-t", "triton"])
    assert opt.pass_manager.pipeline == "cse,canonicalize"
    assert (
        AttnfuseOptMain(args=[path, "-t", "triton", "-p", ""]).pass_manager.passes == ()
    )
    assert AttnfuseOptMain(args=[path]).pass_manager.passes == ()


def test_help_lists_passes_with_summaries(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    listing = out.split("AttnFuse passes:")[1]
    for name in ("attn-canonicalize", "rope-fusion", "online-softmax", "mask-tiling"):
        assert re.search(rf"^  {name} ", listing, re.M)
    assert re.search(r"^  online-softmax +Rewrite softmax", listing, re.M)
    assert "--print-ir-after-all" in out and "--device NAME" in out


def test_version_and_main(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.startswith("attnfuse-opt ") and "xdsl 0.75" in out
    with pytest.raises(SystemExit) as info:
        main([write(tmp_path, BAD_SYNTAX)])
    assert info.value.code == EXIT_ERROR
    main([write(tmp_path, GOOD)])
    assert "func.func @f" in capsys.readouterr().out


def test_universe_is_published_for_stock_xdsl_opt() -> None:
    universe = Universe.get_multiverse()
    assert {"attn", "tile"} <= universe.all_dialects.keys()
    assert "rope-fusion" in universe.all_passes
    assert "triton" in universe.all_targets and "attn" in universe.all_frontends
    xdsl_opt = shutil.which("xdsl-opt", path=str(Path(sys.executable).parent))
    assert xdsl_opt is not None
    proc = subprocess.run(
        [xdsl_opt, str(DROPOUT), "-p", "online-softmax"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "attn.online_softmax" in proc.stdout


# ------------------------------------------------ user input never crashes (issue 8)

LLAMA = ROOT / "examples" / "llama3.attn"


def one_located_error(err: str, path: str) -> str:
    """The first line of ``err``, asserting it is a located error."""
    first = err.splitlines()[0]
    assert re.match(re.escape(path) + r":\d+:\d+: error: ", first), err
    return first


def test_invalid_encodings_are_located_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = b"func.func @f() {\n  \xff\xfe\n}\n"
    path = tmp_path / "bad.mlir"
    path.write_bytes(bad)
    code, _, err = run([str(path)], capsys)
    assert code == EXIT_ERROR
    assert one_located_error(err, str(path)).endswith(":2:3: error: invalid UTF-8 byte 0xff")
    path.write_bytes(LLAMA.read_text().encode("utf-16"))
    code, _, err = run([str(path)], capsys)
    assert code == EXIT_ERROR and "1:1: error: input is UTF-16" in err
    path.write_bytes(LLAMA.read_text().encode("utf-16-le"))  # no byte-order mark
    code, _, err = run([str(path)], capsys)
    assert code == EXIT_ERROR and "1:2: error: unexpected NUL character (UTF-16?)" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bad)))
    code, _, err = run([], capsys)
    assert code == EXIT_ERROR and err.startswith("<stdin>:2:3: error: invalid UTF-8")
    # a bad chunk does not stop the chunks after it; its lines are the file's lines
    path.write_bytes(GOOD.encode() + b"// -----\n" + bad + b"// -----\n" + GOOD.encode())
    code, out, err = run([str(path), "--split-input-file"], capsys)
    assert code == EXIT_ERROR and f"{path}:8:3: error: invalid UTF-8" in err
    assert out.count("func.func @f") == 2
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())  # a UTF-8 byte-order mark is fine
    assert run([str(path)], capsys)[0] == 0


def test_deep_nesting_is_a_located_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops = '  "test.op"() ({\n' * 400 + "  }) : () -> ()\n" * 400
    path = write(tmp_path, "func.func @f() {\n" + ops + "  func.return\n}\n")
    code, _, err = run([path, "--allow-unregistered-dialect"], capsys)
    assert code == EXIT_ERROR and "error: input nests too deeply" in one_located_error(
        err, path
    )
    path = write(tmp_path, "func.func @f() -> " + "tensor<" * 2000 + "f32" + ">" * 2000)
    code, _, err = run([path], capsys)
    assert code == EXIT_ERROR and "input nests too deeply" in one_located_error(err, path)


def test_float_option_out_of_f32_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = LLAMA.read_text().replace("%qr, %kr :", "%qr, %kr {scale = 1.0e300} :")
    path = write(tmp_path, text, "big.attn")
    code, _, err = run([path, "-t", "triton"], capsys)
    assert code == EXIT_ERROR
    first = one_located_error(err, path)
    assert first.endswith("error: option 'scale' is out of the f32 range (|x| <= 3.402823e+38)")
    # found by the driver fuzz: a denormal theta made the rotation frequencies overflow f32
    text = LLAMA.read_text().replace("theta = 500000.0", "theta = 1.0e-320")
    code, _, err = run([write(tmp_path, text, "theta.attn"), "-t", "triton"], capsys)
    assert code == EXIT_ERROR
    assert "'attn.rope' op theta and factor give rotation frequencies beyond the f32" in err


def test_write_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([str(LLAMA), "-o", "/dev/full"], capsys)
    assert code == EXIT_ERROR
    assert err == "attnfuse-opt: error: cannot write '/dev/full': No space left on device\n"


def test_bad_target_options_are_rejected_before_the_pipeline_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [str(LLAMA), "--pass-plugin", str(PLUGIN), "-p", "test-crash"]
    code, _, err = run([*args, "-t", "triton{x=1}"], capsys)
    assert code == EXIT_USAGE and "crashed" not in err
    assert err.startswith("attnfuse-opt: error: invalid options for -t 'triton': ")
    code, _, err = run([str(LLAMA), "-f", "attn{x=1}"], capsys)
    assert code == EXIT_USAGE and "invalid options for -f 'attn'" in err


def test_stdin_closed_and_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", None)
    for args in ([], ["-"]):
        code, _, err = run(args, capsys)
        assert code == EXIT_ERROR
        assert err == "attnfuse-opt: error: cannot read '<stdin>': standard input is closed\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BAD_SYNTAX.encode())))
    code, _, err = run(["-"], capsys)
    assert code == EXIT_ERROR and err.startswith("<stdin>:2:22: error: Expected ','")


def test_redefined_symbol_is_located(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD + GOOD.replace("%b = ", "%d = "))
    code, _, err = run([path], capsys)
    assert code == EXIT_ERROR and "builtin.module" not in err
    assert err.splitlines()[0] == (
        f"{path}:6:1: error: 'func.func' op redefinition of symbol named 'f'"
    )
    assert err.splitlines()[-1] == f"note: see existing symbol definition here ({path}:1:1)"


def test_crashing_chunk_does_not_stop_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD + "// -----\n" + BAD_TYPES + "// -----\n" + GOOD)
    args = [path, "--split-input-file", "--pass-plugin", str(PLUGIN)]
    code, _, err = run([*args, "-p", "test-crash"], capsys)
    assert code == EXIT_INTERNAL and err.count("pass 'test-crash' crashed") == 2
    assert f"{path}:8:8: error: 'arith.addi' op" in err


def test_recursion_in_a_pass_is_not_an_internal_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import dataclass

    from xdsl.passes import ModulePass

    from attnfuse.pass_manager import register_pass

    @dataclass(frozen=True)
    class RecursePass(ModulePass):
        name = "test-recurse"

        def apply(self, ctx: object, op: object) -> None:
            def down(n: int) -> int:
                return down(n + 1) + 1

            down(0)

    register_pass(RecursePass)
    code, _, err = run([write(tmp_path, GOOD), "-p", "test-recurse"], capsys)
    assert code == EXIT_ERROR
    assert err.endswith(
        "error: pass 'test-recurse' failed: recursion too deep (input nests too deeply?)\n"
    )


def test_static_batch_and_seq_dims_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = re.sub(r"tensor<\?x(\d+)x\?x", r"tensor<2x\1x64x", LLAMA.read_text())
    text = re.sub(r"(scores|probs)<\?x(\d+)x\?x\?x", r"\1<2x\2x64x64x", text)
    code, out, err = run([write(tmp_path, text, "static.attn"), "-t", "triton"], capsys)
    assert code == 0, err
    assert "@triton.jit" in out


HEADS = """\
func.func @f(%q: tensor<?x{hq}x?x{d}xbf16>, %k: tensor<?x{hk}x?x{d}xbf16>,
             %v: tensor<?x{hv}x?x{d}xbf16>) -> tensor<?x{hq}x?x{d}xbf16> {{
  %s = attn.scores %q, %k : tensor<?x{hq}x?x{d}xbf16>, tensor<?x{hk}x?x{d}xbf16> -> !attn.scores<?x{hq}x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x{hq}x?x?xf32> -> !attn.probs<?x{hq}x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x{hq}x?x?xf32>, tensor<?x{hv}x?x{d}xbf16> -> tensor<?x{hq}x?x{d}xbf16>
  func.return %o : tensor<?x{hq}x?x{d}xbf16>
}}
"""


@pytest.mark.parametrize(
    "shape,line,message",
    [
        (dict(hq=32, hk=5, hv=5, d=128), 3, "'attn.scores' op query heads (32) must be a multiple of key heads (5)"),
        (dict(hq=32, hk=8, hv=5, d=128), 5, "'attn.weighted_sum' op heads (32) must be a multiple of v heads (5)"),
        (dict(hq=32, hk=8, hv=16, d=128), 3,
         "'attn.scores' op the backward needs K and V with the same number of heads (K 8, V 16)"),
        (dict(hq=4, hk=2, hv=2, d=65536), 3,
         "'attn.scores' op head dim 65536 is too wide for blocks of 64 x 64 rows "
         "(lower-backward{block-m block-n}): a [64, 65536] tile has more than Triton's 1048576 elements"),
    ],
    ids=["k_heads", "v_heads", "k_ne_v_heads", "head_dim_65536"],
)
def test_unlowerable_shapes_are_located(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: dict[str, int], line: int, message: str
) -> None:
    """Head counts and head dims the kernels cannot take are reported at the op
    (file:line:col), whether the verifier or a lowering pass finds them."""
    path = write(tmp_path, HEADS.format(**shape), "heads.attn")
    code, _, err = run([path, "-t", "triton"], capsys)
    assert code == EXIT_ERROR
    assert err.startswith(f"{path}:{line}:8: error: {message}"), err


def test_example_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--example NAME` reads a shipped program, from any working directory."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(["--example", "dropout", "-p", "attn-canonicalize"], capsys)
    assert code == 0 and "func.func @dropout" in out and "attn.dropout" in out
    code, _, err = run(["--example", "nope"], capsys)
    assert code == EXIT_USAGE and "no example named 'nope' (known: alibi," in err
    code, _, err = run([str(DROPOUT), "--example", "llama3"], capsys)
    assert code == EXIT_USAGE and "give an input file or --example, not both" in err
