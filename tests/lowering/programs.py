"""Builders of attn program text and of matching random inputs, for the lowering tests.

A `Builder` writes one attention function op by op (`rope`, `qk_norm`, `scores`,
`alibi`, `bias`, `softcap`, `mask`, `custom_mask`, `score_mod`) and `build` closes it with
the softmax (optional sinks / lse / dropout) and the weighted sum. Every extra operand it
declares (positions, norm weights, slopes, bias tables, ids, prefix lengths, captured
tables, sinks, seeds) comes with a generator, so `Program.inputs(batch, q_len, kv_len,
seed)` returns fresh random arguments of the right shapes (never zeros).

Region bodies (`custom_mask`, `score_mod`) are written with `$` in their SSA names; the
builder replaces it with a number unique to the region. The block arguments are
`%x$` (score_mod only), `%b$`, `%h$`, `%q$`, `%kv$`, then one per capture (`%c0$`, ...).

Kernels run through the Triton interpreter; these helpers keep tests short:
`compile_program(text, strategy)` compiles with `pipeline(strategy)` (block-m = block-n
= 16, so 37 rows make three q blocks, the last one partial) and `check(...)` compares a
compiled program with `attnfuse.reference.run` through `attnfuse.testing.assert_close`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import attnfuse.api
from attnfuse import reference
from attnfuse.testing import assert_close

STRATEGIES = ("fused", "hybrid", "separate")
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
BLOCK = 16


def pipeline(
    strategy: str = "fused",
    *,
    block_m: int = BLOCK,
    block_n: int = BLOCK,
    count_tiles: bool = False,
) -> str:
    lower = "lower-to-tile{count-tiles=true}" if count_tiles else "lower-to-tile"
    return (
        f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,"
        f"mask-tiling{{block-m={block_m} block-n={block_n}}},{lower}"
    )


_COMPILED: dict[tuple[str, str], attnfuse.api.AttentionFunction] = {}


def compile_program(
    text: str, strategy: str = "fused", **kw: Any
) -> attnfuse.api.AttentionFunction:
    """attnfuse.api.compile with `pipeline(strategy, **kw)`, memoised per process."""
    pipe = pipeline(strategy, **kw)
    key = (text, pipe)
    if key not in _COMPILED:
        _COMPILED[key] = attnfuse.api.compile(text, pipeline=pipe)
    return _COMPILED[key]


def fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text if "." in text and "e" not in text else f"{value:.6e}"
    return f'"{value}"'


def fmt_options(options: dict[str, Any]) -> str:
    items = [f"{k} = {fmt_value(v)}" for k, v in options.items() if v is not None]
    return f" {{{', '.join(items)}}}" if items else ""


Gen = Callable[[torch.Generator, int, int, int], Any]
"""(generator, batch, q_len, kv_len) -> argument."""


@dataclass
class Arg:
    name: str
    type: str
    gen: Gen


def _randn(
    shape: Callable[[int, int, int], Sequence[int]],
    dtype: torch.dtype,
    scale: float = 1.0,
    shift: float = 0.0,
) -> Gen:
    def gen(g: torch.Generator, b: int, sq: int, skv: int) -> torch.Tensor:
        return (shift + scale * torch.randn(list(shape(b, sq, skv)), generator=g)).to(
            dtype
        )

    return gen


def segments(
    g: torch.Generator, batch: int, length: int, docs: int = 3
) -> torch.Tensor:
    """[batch, length] int32 sorted document ids, `docs` random cuts per row (some empty)."""
    ids = torch.zeros(batch, length, dtype=torch.int32)
    for row in range(batch):
        cuts = torch.randint(1, max(2, length), (docs,), generator=g).sort().values
        for cut in cuts:
            ids[row, int(cut) :] += 1
    return ids


@dataclass
class Program:
    """Program text, its entry name and its argument generators."""

    text: str
    name: str
    args: list[Arg]
    returns_lse: bool = False
    notes: dict[str, Any] = field(default_factory=dict)

    def inputs(self, batch: int, q_len: int, kv_len: int, seed: int = 0) -> list[Any]:
        g = torch.Generator().manual_seed(seed)
        return [a.gen(g, batch, q_len, kv_len) for a in self.args]

    def with_dtype(self, dtype: str) -> Program:
        """The same program with q/k/v (and 4-d bias tensors) in `dtype`."""
        from attnfuse.testing import with_dtype

        text = with_dtype(self.text, dtype)
        torch_dt = DTYPES[dtype]
        args = list(self.args)
        for i in range(3):
            a = args[i]
            old = a.gen
            args[i] = Arg(
                a.name,
                a.type,
                lambda g, b, sq, skv, old=old: old(g, b, sq, skv).to(torch_dt),
            )
        for i, a in enumerate(args[3:], start=3):
            if (
                a.type.count("x") == 4
                and a.type.startswith("tensor<")
                and "i32" not in a.type
            ):
                old = a.gen
                args[i] = Arg(
                    a.name,
                    a.type,
                    lambda g, b, sq, skv, old=old: old(g, b, sq, skv).to(torch_dt),
                )
        return Program(text, self.name, args, self.returns_lse, dict(self.notes))


class Builder:
    """Writes one attention function (see the module docstring)."""

    def __init__(
        self,
        name: str = "f",
        *,
        hq: int = 4,
        hkv: int = 2,
        hv: int | None = None,
        d: int = 64,
        dv: int | None = None,
        dtype: str = "f32",
    ) -> None:
        self.name = name
        self.hq, self.hkv, self.hv = hq, hkv, hkv if hv is None else hv
        self.d, self.dv = d, d if dv is None else dv
        self.dtype = dtype
        self.torch_dtype = DTYPES[dtype]
        self.args: list[Arg] = []
        self.lines: list[str] = []
        self.q, self.k = "%q", "%k"
        self.s: str | None = None
        self._n = 0
        dt = self.torch_dtype
        self.args.append(
            Arg("q", self.qtype, _randn(lambda b, sq, skv: (b, hq, sq, self.d), dt))
        )
        self.args.append(
            Arg("k", self.ktype, _randn(lambda b, sq, skv: (b, hkv, skv, self.d), dt))
        )
        self.args.append(
            Arg(
                "v",
                self.vtype,
                _randn(lambda b, sq, skv: (b, self.hv, skv, self.dv), dt),
            )
        )

    # ------------------------------------------------------------------ types

    @property
    def qtype(self) -> str:
        return f"tensor<?x{self.hq}x?x{self.d}x{self.dtype}>"

    @property
    def ktype(self) -> str:
        return f"tensor<?x{self.hkv}x?x{self.d}x{self.dtype}>"

    @property
    def vtype(self) -> str:
        return f"tensor<?x{self.hv}x?x{self.dv}x{self.dtype}>"

    @property
    def otype(self) -> str:
        return f"tensor<?x{self.hq}x?x{self.dv}x{self.dtype}>"

    @property
    def stype(self) -> str:
        return f"!attn.scores<?x{self.hq}x?x?xf32>"

    @property
    def ptype(self) -> str:
        return f"!attn.probs<?x{self.hq}x?x?xf32>"

    def fresh(self, base: str) -> str:
        self._n += 1
        return f"%{base}{self._n}"

    def arg(self, name: str, type_: str, gen: Gen) -> str:
        assert all(a.name != name for a in self.args), name
        self.args.append(Arg(name, type_, gen))
        return f"%{name}"

    # ------------------------------------------------------------------ Q/K side

    def _sides(self, side: str) -> list[str]:
        return {"q": ["q"], "k": ["k"], "both": ["q", "k"]}[side]

    def positions(
        self,
        rank: int,
        *,
        name: str = "pos",
        high: int = 256,
        seq: str = "kv",
        dtype: str = "i32",
    ) -> str:
        """A positions operand: [S] (rank 1) or [B, S] (rank 2), random in [0, high),
        of the q or kv length."""
        tdt = {"i32": torch.int32, "i64": torch.int64}[dtype]

        def gen(g: torch.Generator, b: int, sq: int, skv: int) -> torch.Tensor:
            n = sq if seq == "q" else skv
            shape = (n,) if rank == 1 else (b, n)
            return torch.randint(0, high, shape, generator=g, dtype=tdt)

        ty = f"tensor<?x{dtype}>" if rank == 1 else f"tensor<?x?x{dtype}>"
        return self.arg(name, ty, gen)

    def rope(
        self, side: str = "both", *, positions: str | None = None, **options: Any
    ) -> Builder:
        for which in self._sides(side):
            src = self.q if which == "q" else self.k
            ty = self.qtype if which == "q" else self.ktype
            out = self.fresh(f"{which}r")
            if positions is not None:
                pty = next(a.type for a in self.args if f"%{a.name}" == positions)
                self.lines.append(
                    f"{out} = attn.rope {src} positions {positions}{fmt_options(options)} : {ty}, {pty}"
                )
            else:
                self.lines.append(
                    f"{out} = attn.rope {src}{fmt_options(options)} : {ty}"
                )
            if which == "q":
                self.q = out
            else:
                self.k = out
        return self

    def qk_norm(
        self, side: str = "both", *, weight: str | None = None, **options: Any
    ) -> Builder:
        """`weight`: None, or the weight's element type (f32, bf16, ...)."""
        for which in self._sides(side):
            src = self.q if which == "q" else self.k
            ty = self.qtype if which == "q" else self.ktype
            out = self.fresh(f"{which}n")
            if weight is not None:
                wty = f"tensor<{self.d}x{weight}>"
                w = self.arg(
                    f"w{which}",
                    wty,
                    _randn(lambda b, sq, skv: (self.d,), DTYPES[weight], 0.1, 1.0),
                )
                self.lines.append(
                    f"{out} = attn.qk_norm {src} weight {w}{fmt_options(options)} : {ty}, {wty}"
                )
            else:
                self.lines.append(
                    f"{out} = attn.qk_norm {src}{fmt_options(options)} : {ty}"
                )
            if which == "q":
                self.q = out
            else:
                self.k = out
        return self

    # ------------------------------------------------------------------ scores

    def scores(self, **options: Any) -> Builder:
        self.s = "%s"
        self.lines.append(
            f"%s = attn.scores {self.q}, {self.k}{fmt_options(options)} : {self.qtype}, {self.ktype} -> {self.stype}"
        )
        return self

    def _score_op(self, text: str) -> str:
        if self.s is None:
            self.scores()
        out = self.fresh("s")
        self.lines.append(f"{out} = {text}")
        return out

    def alibi(self, *, slopes: bool = False, **options: Any) -> Builder:
        if slopes:
            sl = self.arg(
                "slopes",
                f"tensor<{self.hq}xf32>",
                _randn(lambda b, sq, skv: (self.hq,), torch.float32, 0.3),
            )
            self.s = self._score_op(
                f"attn.bias alibi {self._cur()} slopes {sl}{fmt_options(options)} : {self.stype}, tensor<{self.hq}xf32>"
            )
        else:
            self.s = self._score_op(
                f"attn.bias alibi {self._cur()}{fmt_options(options)} : {self.stype}"
            )
        return self

    def _cur(self) -> str:
        if self.s is None:
            self.scores()
        assert self.s is not None
        return self.s

    def bias(
        self, shape: Sequence[str | int], *, dtype: str = "f32", name: str = "bias"
    ) -> Builder:
        """A bias tensor operand: dims are 1, "?" or the head count."""
        dims = "x".join(str(d) for d in shape)
        ty = f"tensor<{dims}x{dtype}>"

        def size(i: int, d: str | int, b: int, sq: int, skv: int) -> int:
            if d == 1 or d == "1":
                return 1
            return [b, self.hq, sq, skv][i]

        b_ = self.arg(
            name,
            ty,
            _randn(
                lambda b, sq, skv: [
                    size(i, d, b, sq, skv) for i, d in enumerate(shape)
                ],
                DTYPES[dtype],
            ),
        )
        cur = self._cur()
        self.s = self._score_op(f"attn.bias tensor {cur}, {b_} : {self.stype}, {ty}")
        return self

    def softcap(self, cap: float) -> Builder:
        cur = self._cur()
        self.s = self._score_op(
            f"attn.softcap {cur} {{cap = {fmt_value(float(cap))}}} : {self.stype}"
        )
        return self

    def mask(self, kind: str, *operands: str, **options: Any) -> Builder:
        cur = self._cur()
        if operands:
            types = [
                next(a.type for a in self.args if f"%{a.name}" == o) for o in operands
            ]
            self.s = self._score_op(
                f"attn.mask {kind} {cur}, {', '.join(operands)}{fmt_options(options)} : {self.stype}, {', '.join(types)}"
            )
        else:
            self.s = self._score_op(
                f"attn.mask {kind} {cur}{fmt_options(options)} : {self.stype}"
            )
        return self

    def doc_ids(
        self,
        name: str = "doc",
        *,
        seq: str = "kv",
        docs: int = 3,
        dtype: str = "i32",
        batch1: bool = False,
    ) -> str:
        """A [B, S] document-ids operand (sorted segments) of the q or kv length
        (`batch1`: one row [1, S] shared by the batch)."""
        tdt = {"i32": torch.int32, "i64": torch.int64}[dtype]

        def gen(g: torch.Generator, b: int, sq: int, skv: int) -> torch.Tensor:
            return segments(g, 1 if batch1 else b, sq if seq == "q" else skv, docs).to(
                tdt
            )

        return self.arg(name, f"tensor<?x?x{dtype}>", gen)

    def prefix_lengths(self, name: str = "plen") -> str:
        return self.arg(
            name,
            "tensor<?xi32>",
            lambda g, b, sq, skv: torch.randint(
                0, skv + 1, (b,), generator=g, dtype=torch.int32
            ),
        )

    def table(
        self, name: str, n: int, dtype: str = "f32", gen: Gen | None = None
    ) -> str:
        if gen is None:
            if dtype.startswith("i"):
                gen = lambda g, b, sq, skv: torch.randint(
                    0, 40, (n,), generator=g, dtype=torch.int32
                )
            else:
                gen = _randn(lambda b, sq, skv: (n,), DTYPES[dtype])
        return self.arg(name, f"tensor<{n}x{dtype}>", gen)

    def _region(self, head: str, body: str, captures: Sequence[str]) -> tuple[str, str]:
        self._n += 1
        n = str(self._n)
        cap_types = [
            next(a.type for a in self.args if f"%{a.name}" == c) for c in captures
        ]
        block_args = [
            f"%b{n}: index",
            f"%h{n}: index",
            f"%q{n}: index",
            f"%kv{n}: index",
        ]
        block_args += [f"%c{i}{n}: {t}" for i, t in enumerate(cap_types)]
        lines = body.strip().replace("$", n).splitlines()
        region = "\n".join(
            ["  ^bb0(" + head.replace("$", n) + ", ".join(block_args) + "):"]
            + ["    " + ln.strip() for ln in lines]
            + ["  }"]
        )
        operands = "".join(f", {c}" for c in captures)
        types = "".join(f", {t}" for t in cap_types)
        return operands + " : " + self.stype + types + " {\n" + region, n

    def custom_mask(self, body: str, *captures: str) -> Builder:
        cur = self._cur()
        tail, _ = self._region("", body, captures)
        self.s = self._score_op(f"attn.mask custom {cur}{tail}")
        return self

    def score_mod(self, body: str, *captures: str) -> Builder:
        cur = self._cur()
        tail, _ = self._region("%x$: f32, ", body, captures)
        self.s = self._score_op(f"attn.score_mod {cur}{tail}")
        return self

    # ------------------------------------------------------------------ close

    def build(
        self, *, sinks: bool = False, lse: bool = False, dropout: float | None = None
    ) -> Program:
        cur = self._cur()
        sink_text, sink_type = "", ""
        if sinks:
            sk = self.arg(
                "sinks",
                f"tensor<{self.hq}xf32>",
                _randn(lambda b, sq, skv: (self.hq,), torch.float32, 1.0, 0.5),
            )
            sink_text, sink_type = f" sinks {sk}", f", tensor<{self.hq}xf32>"
        lse_type = f"tensor<?x{self.hq}x?xf32>"
        if lse:
            self.lines.append(
                f"%p, %lse = attn.softmax {cur}{sink_text} : {self.stype}{sink_type} -> {self.ptype}, {lse_type}"
            )
        else:
            self.lines.append(
                f"%p = attn.softmax {cur}{sink_text} : {self.stype}{sink_type} -> {self.ptype}"
            )
        probs = "%p"
        if dropout is not None:
            seed = self.arg(
                "seed",
                "i64",
                lambda g, b, sq, skv: int(torch.randint(0, 2**40, (1,), generator=g)),
            )
            self.lines.append(
                f"%pd = attn.dropout %p, {seed} {{p = {fmt_value(float(dropout))}}} : {self.ptype}, i64"
            )
            probs = "%pd"
        self.lines.append(
            f"%o = attn.weighted_sum {probs}, %v : {self.ptype}, {self.vtype} -> {self.otype}"
        )
        if lse:
            self.lines.append(f"func.return %o, %lse : {self.otype}, {lse_type}")
            results = f"({self.otype}, {lse_type})"
        else:
            self.lines.append(f"func.return %o : {self.otype}")
            results = self.otype
        params = ",\n    ".join(f"%{a.name}: {a.type}" for a in self.args)
        body = "\n".join("  " + ln.replace("\n", "\n  ") for ln in self.lines)
        text = f"func.func @{self.name}(\n    {params}) -> {results} {{\n{body}\n}}\n"
        return Program(
            text, self.name, list(self.args), returns_lse=lse, notes={"scores": cur[1:]}
        )


def plain(**kw: Any) -> Builder:
    """A builder with default shapes (Hq=4, Hkv=2, D=64, f32)."""
    return Builder(**kw)


# ---------------------------------------------------------------------- checking


def run_both(
    program: Program | str,
    args: Sequence[Any],
    strategy: str = "fused",
    *,
    return_lse: bool = False,
) -> tuple[Any, Any]:
    """(kernel result, reference result) of a program on `args`."""
    text = program.text if isinstance(program, Program) else program
    fn = compile_program(text, strategy)
    got = fn(*args, return_lse=return_lse)
    want = reference.run(text, *args)
    return got, want


def check(
    program: Program,
    *,
    strategy: str = "fused",
    batch: int = 2,
    q_len: int = 37,
    kv_len: int | None = None,
    seed: int = 0,
    args: Sequence[Any] | None = None,
    check_lse: bool = False,
) -> tuple[torch.Tensor, Any]:
    """Compile, run, compare with the reference (out, and lse when the program returns
    it or `check_lse`). Returns (out, lse or None)."""
    kv_len = q_len if kv_len is None else kv_len
    if args is None:
        args = program.inputs(batch, q_len, kv_len, seed)
    fn = compile_program(program.text, strategy)
    got = fn(*args, return_lse=check_lse)
    want = reference.run(program.text, *args)
    dtype = args[0].dtype
    out, lse = got if isinstance(got, tuple) else (got, None)
    if isinstance(want, tuple):
        want_out, want_lse = want
    else:
        want_out, want_lse = want, None
    assert out.dtype == dtype, f"output dtype {out.dtype}, expected {dtype}"
    assert_close(out, want_out)
    if want_lse is not None:
        assert lse is not None
        assert_close(lse, want_lse, dtype)
    elif check_lse:
        assert lse is not None
        ref_lse = reference_lse(program, args)
        assert_close(lse, ref_lse, dtype)
    return out, lse


def empty_rows(program: Program, args: Sequence[Any]) -> torch.Tensor:
    """[B, H, Sq] bool: rows whose scores (right before the softmax) are all -inf."""
    values = reference.run(program.text, *args, return_all=True)
    scores = values[program.notes["scores"]]
    return torch.isneginf(scores).all(dim=-1)


def reference_lse(program: Program | str, args: Sequence[Any]) -> torch.Tensor:
    """The reference lse of a program that does not return it: the same program with
    `%p, %lse = attn.softmax` and the lse returned (the softmax result must be `%p` and
    the output `%o`, as in the builder's programs and the examples)."""
    text = program.text if isinstance(program, Program) else program
    if isinstance(program, Program) and program.returns_lse:
        return reference.run(text, *args)[1]
    import re

    lines = text.splitlines()
    out_lines = []
    hq = None
    for line in lines:
        m = re.match(
            r"(\s*)%p = attn\.softmax (.*) -> (!attn\.probs<\?x(\d+)x\?x\?xf32>)$", line
        )
        if m:
            hq = m.group(4)
            line = f"{m.group(1)}%p, %lse = attn.softmax {m.group(2)} -> {m.group(3)}, tensor<?x{hq}x?xf32>"
        r = re.match(r"(\s*)func\.return %o : (.*)$", line)
        if r:
            line = (
                f"{r.group(1)}func.return %o, %lse : {r.group(2)}, tensor<?x{hq}x?xf32>"
            )
        out_lines.append(line)
    new = "\n".join(out_lines)
    new = re.sub(
        r"\) -> (tensor<[^>]*>) \{",
        lambda m: f") -> ({m.group(1)}, tensor<?x{hq}x?xf32>) {{",
        new,
        count=1,
    )
    return reference.run(new, *args)[1]


__all__ = [
    "BLOCK",
    "DTYPES",
    "STRATEGIES",
    "Builder",
    "Program",
    "check",
    "compile_program",
    "empty_rows",
    "pipeline",
    "plain",
    "reference_lse",
    "run_both",
    "segments",
]
