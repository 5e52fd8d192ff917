"""Driver fuzz: ``attnfuse-opt`` on mutated examples never crashes.

Every ``examples/*.attn`` program is mutated (byte flips, truncation, duplicated or
moved lines, huge numbers, deep nesting, invalid encodings, chunk separators) and run
through the driver in-process with random flags, targets and pass pipelines (valid and
invalid). Properties: the exit status is 0, 1 or 2, never 3 (internal error); no
Python traceback; every failure starts with a located ``file:line:col: error:`` or is a
one-line ``attnfuse-opt: error:`` / ``file: error:`` message. A handful of cases run
as real subprocesses (closed stdin, a full disk, invalid UTF-8 on a pipe).

Fixed seed; ``ATTNFUSE_DRIVER_FUZZ_CASES`` (default 1000) and
``ATTNFUSE_DRIVER_FUZZ_SEED`` choose the run (``make fuzz-driver``: a longer one).
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from attnfuse.driver import AttnfuseOptMain
from attnfuse.passes import PASSES

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.attn"))
CASES = int(os.environ.get("ATTNFUSE_DRIVER_FUZZ_CASES", "1000"))
SEED = int(os.environ.get("ATTNFUSE_DRIVER_FUZZ_SEED", "8"))
HEAVY_SHARE = 0.005
"""Share of cases that run the lowering passes (about 0.5 s each)."""

LOCATED = re.compile(r"^(?:.+):\d+:\d+: error: ")
ONE_LINE = re.compile(r"^(?:attnfuse-opt|.+): error: [^\n]*$")
HUGE = ["1.0e300", "-1.0e300", "1.0e39", "3.4e38", "1.0e-320", "0.0", "-0.0",
        "99999999999999999999", "-9223372036854775809", "9223372036854775807",
        "0", "-1", "4294967296", "1.0e999", "1e", "0x7fffffff"]


# ------------------------------------------------------------------ mutations

Mutation = Callable[[random.Random, bytes], bytes]


def flip_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data))]


def duplicate_slice(rng: random.Random, data: bytes) -> bytes:
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.randint(1, 200))
    return data[:b] + data[a:b] + data[b:]


def move_line(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    line = lines.pop(rng.randrange(len(lines)))
    lines.insert(rng.randrange(len(lines) + 1), line)
    return b"\n".join(lines)


def huge_number(rng: random.Random, data: bytes) -> bytes:
    numbers = list(re.finditer(rb"(?<![%\w])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", data))
    if not numbers:
        return data
    m = rng.choice(numbers)
    return data[: m.start()] + rng.choice(HUGE).encode() + data[m.end() :]


def huge_option(rng: random.Random, data: bytes) -> bytes:
    """A float option with an extreme value on a random attn op."""
    ops = list(re.finditer(rb"= attn\.(scores|softcap|rope|qk_norm|bias|dropout) ([^:{\n]*)", data))
    if not ops:
        return huge_number(rng, data)
    m = rng.choice(ops)
    name = {b"scores": b"scale", b"softcap": b"cap", b"rope": b"theta", b"qk_norm": b"eps",
            b"bias": b"max_bias", b"dropout": b"p"}[m.group(1)]
    value = rng.choice(HUGE).encode()
    if b"{" in data[m.end() : m.end() + 2]:
        return data
    return data[: m.end()] + b"{" + name + b" = " + value + b"} " + data[m.end() :]


def deep_nesting(rng: random.Random, data: bytes) -> bytes:
    depth = rng.choice([50, 300, 3000])
    if rng.random() < 0.5:
        return data.replace(b"f32>", b"tensor<" * depth + b"f32" + b">" * depth + b">", 1)
    nest = b'"test.op"() ({\n' * depth + b"}) : () -> ()\n" * depth
    return data.replace(b"  func.return", nest + b"  func.return", 1)


def bad_encoding(rng: random.Random, data: bytes) -> bytes:
    choice = rng.randrange(4)
    if choice == 0:
        return data.decode("utf-8", "replace").encode("utf-16")
    if choice == 1:
        return data.decode("utf-8", "replace").encode("utf-16-le")  # no byte-order mark
    pos = rng.randrange(len(data))
    junk = rng.choice([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf"])
    return data[:pos] + junk + data[pos:]


def split_markers(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    for _ in range(rng.randint(1, 3)):
        lines.insert(rng.randrange(len(lines) + 1), b"// -----")
    return b"\n".join(lines)


def annotate(rng: random.Random, data: bytes) -> bytes:
    """Random (often wrong or malformed) expected-* annotations."""
    lines = data.split(b"\n")
    sev = rng.choice([b"error", b"warning", b"note", b"remark", b"error-re", b"bogus"])
    where = rng.choice([b"", b" @above", b" @below", b" @+1", b" @-100", b" @unknown", b" @x"])
    text = rng.choice([b"{{op}}", b"{{", b"{{{{(}}}}", b"{{}}", b"no braces"])
    lines.insert(rng.randrange(len(lines) + 1), b"// expected-" + sev + where + b" " + text)
    return b"\n".join(lines)


MUTATIONS: list[Mutation] = [
    flip_bytes, truncate, duplicate_slice, move_line, huge_number, huge_option,
    deep_nesting, bad_encoding, split_markers, annotate,
]


# ---------------------------------------------------------------- command lines

def random_pipeline(rng: random.Random) -> str:
    names = [*PASSES, "canonicalize", "cse", "dce", "no-such-pass"]
    options = ["", "{strategy=fused}", "{strategy=hybrid}", "{strategy=separate}",
               "{strategy=bogus}", "{block-m=16 block-n=16}", "{block-m=100}",
               "{block-m=0}", "{x=1}", "{", "{block-m=-16}", "{block-m=99999999999999999999}"]
    passes = [rng.choice(names) + rng.choice(options) for _ in range(rng.randint(0, 4))]
    text = ",".join(passes)
    return text if rng.random() > 0.05 else text + rng.choice([",", "{{", "}", ",,"])


def random_flags(rng: random.Random, tmp: Path, heavy: bool) -> list[str]:
    flags: list[str] = []
    if heavy:
        return ["-t", "triton", *rng.choice([[], ["--split-input-file"]])]
    if rng.random() < 0.5:
        flags += ["-p", random_pipeline(rng)]
    if rng.random() < 0.15:
        flags += ["-t", rng.choice(["mlir", "triton{x=1}", "triton{", "nope", "mlir{y=2}"])]
        if flags[-1].startswith("triton") or rng.random() < 0.5:
            flags += ["-p", ""]  # keep the lowering out of cheap cases
    for flag in ("--split-input-file", "--verify-diagnostics", "--print-op-generic",
                 "--no-implicit-module", "--allow-unregistered-dialect",
                 "--print-ir-after-all", "--time-passes", "--disable-verify",
                 "--parsing-diagnostics"):
        if rng.random() < 0.12:
            flags.append(flag)
    if rng.random() < 0.1:
        flags += ["--device", rng.choice(["h200", "H100", "no-such-gpu", ""])]
    if rng.random() < 0.05:
        flags += ["-o", rng.choice(["/dev/full", str(tmp), str(tmp / "out.mlir"),
                                    str(tmp / "missing" / "out")])]
    if rng.random() < 0.05:
        flags += ["-f", rng.choice(["mlir", "attn", "attn{no-implicit-module=true}", "nope"])]
    return flags


# -------------------------------------------------------------------- running

def run_driver(args: list[str], stdin: bytes | None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                AttnfuseOptMain(args=args).run()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def check_result(code: int, err: str, what: str) -> None:
    assert code in (0, 1, 2), f"exit {code} for {what}:\n{err[-3000:]}"
    assert "Traceback" not in err, f"traceback for {what}:\n{err[-3000:]}"
    assert "the failing operation:" not in err, f"unlocated error for {what}:\n{err}"
    if code == 0:
        return
    errors = [ln for ln in err.splitlines() if re.search(r"(^|: )error: ", ln)]
    assert errors, f"exit {code} without an error message for {what}:\n{err}"
    first = errors[0]  # after any --time-passes report or --print-ir-after-all dump
    assert LOCATED.match(first) or ONE_LINE.match(first), f"bad error for {what}:\n{err}"


def test_driver_fuzz(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    seeds = {p.name: p.read_bytes() for p in EXAMPLES}
    codes: Counter[int] = Counter()
    for case in range(CASES):
        name = rng.choice(list(seeds))
        data = seeds[name]
        applied = [rng.choice(MUTATIONS) for _ in range(rng.choice([1, 1, 1, 2]))]
        for mutation in applied:
            data = mutation(rng, data) if data else data
        heavy = rng.random() < HEAVY_SHARE
        flags = random_flags(rng, tmp_path, heavy)
        if rng.random() < 0.2:
            args, stdin = [*flags, *rng.choice([[], ["-"]])], data
        else:
            path = tmp_path / f"case{rng.choice(['.attn', '.mlir', '.txt'])}"
            path.write_bytes(data)
            args, stdin = [str(path), *flags], None
        code, _, err = run_driver(args, stdin)
        what = f"case {case} ({name}, {[m.__name__ for m in applied]}, args {args})"
        check_result(code, err, what)
        codes[code] += 1
    print(f"driver fuzz: {CASES} cases (seed {SEED}), exit codes {dict(sorted(codes.items()))}")
    assert sum(codes.values()) == CASES and codes[0] and codes[1]


# ---------------------------------------------------- a few real subprocesses

LLAMA = REPO / "examples" / "llama3.attn"


@pytest.mark.parametrize(
    ("args", "stdin", "expected"),
    [
        ([], "closed", r"^attnfuse-opt: error: cannot read '<stdin>': standard input is closed$"),
        (["-"], b"func.func @f() {\xff}", r"^<stdin>:1:17: error: invalid UTF-8 byte 0xff\n"),
        ([str(LLAMA), "-o", "/dev/full"], None,
         r"^attnfuse-opt: error: cannot write '/dev/full': No space left on device$"),
        ([str(LLAMA), "-t", "triton{x=1}"], None, r"^attnfuse-opt: error: invalid options for -t"),
        ([str(LLAMA), "-p", "lower-to-tile{"], None, r"^attnfuse-opt: error: invalid pass pipeline"),
    ],
)
def test_subprocess(args: list[str], stdin: bytes | str | None, expected: str) -> None:
    command = [sys.executable, "-m", "attnfuse.driver", *args]
    kwargs: dict[str, object] = {"stdin": subprocess.DEVNULL}
    if stdin == "closed":
        command = ["sh", "-c", 'exec "$0" "$@" <&-', *command]
    elif stdin is not None:
        kwargs = {"input": stdin}
    proc = subprocess.run(command, capture_output=True, timeout=120, **kwargs)  # type: ignore[call-overload]
    err = proc.stderr.decode()
    assert proc.returncode in (1, 2), err
    assert re.search(expected, err.strip() if expected.endswith("$") else err), err


def test_subprocess_stdout_full() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "attnfuse.driver", str(LLAMA)],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
        )
    assert proc.returncode == 1
    assert proc.stderr == "attnfuse-opt: error: cannot write '<stdout>': No space left on device\n"
