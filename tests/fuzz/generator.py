"""Random valid attention programs for the differential fuzzer.

`random_case(rng)` draws one `Case`: a program written with `programs.Builder` (the
lowering tests' builder) as a random composition of the ten building blocks, the
shapes to run it at and the rope-fusion strategies to compile it under. Every program
is valid by construction: the generator only combines blocks in ways the dialect
accepts and the compiler documents as supported (see docs/dialect.md):

* Q/K side: RoPE (half / interleaved, partial `rotary_dim`, none / linear / llama3 /
  yarn scaling, `offset` or position-ids operands) on q, k or both, with Q and K free to
  differ in style and `rotary_dim`; QK-norm with or without a weight (f32 or the
  program's dtype, optional `weight_offset`), before or after RoPE.
* scores with the default or an explicit scale; then, in random order, ALiBi (default
  or learnable slopes), a broadcast bias tensor, softcap and score_mod regions, followed
  by masks (causal with both alignments, sliding windows whose sides sit at tile-boundary
  residues, prefix-LM static or per row, document ids, custom predicates).
* softmax with optional sinks and lse result, optional dropout, weighted sum.
* head dims including non-powers of two, V head dim differing from Q/K's, GQA / MQA
  ratios, V head counts differing from K's (forward only), Sq != Skv (q or kv longer), f16 / f32 (not bf16: the Triton interpreter
  truncates fp32 -> bf16 where a GPU rounds, which would hide real errors).

Score_mod regions go before the masks (a region applied to a masked `-inf` may produce
NaN or `+inf`, which has no defined softmax, docs/dialect.md), and a bias tensor never
has a broadcast kv dim (its exact gradient is then 0, not comparable relatively).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from programs import BLOCK, Builder, Program

FUSION_STRATEGIES = ("fused", "hybrid", "separate")

ROPE_SCALINGS: tuple[dict[str, object], ...] = (
    {},
    {"theta": 500000.0},
    {"scaling": "linear", "factor": 4.0},
    {"theta": 500000.0, "scaling": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position": 64},
    {"theta": 150000.0, "scaling": "yarn", "factor": 32.0, "original_max_position": 64,
     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": 0},
)

SCORE_MODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (region body, kinds of captures: "temp" an f32 scalar, "table" an [Hq] f32 table)
    ("""
        %t$ = math.tanh %x$ : f32
        %y$ = arith.mulf %t$, %c0$ : f32
        attn.yield %y$ : f32
    """, ("temp",)),
    ("""
        %d$ = arith.subi %kv$, %q$ : index
        %di$ = arith.index_cast %d$ : index to i32
        %df$ = arith.sitofp %di$ : i32 to f32
        %e$ = arith.mulf %df$, %c0$ : f32
        %y$ = arith.addf %x$, %e$ : f32
        attn.yield %y$ : f32
    """, ("temp",)),
    ("""
        %w$ = tensor.extract %c0$[%h$] : tensor<HQxf32>
        %y$ = arith.mulf %x$, %w$ : f32
        attn.yield %y$ : f32
    """, ("table",)),
    ("""
        %c$ = arith.cmpi sle, %kv$, %q$ : index
        %t$ = math.tanh %x$ : f32
        %e$ = math.exp %t$ : f32
        %y$ = arith.select %c$, %x$, %e$ : f32
        attn.yield %y$ : f32
    """, ()),
    ("""
        %a$ = math.absf %x$ : f32
        %c2$ = arith.constant 1.5 : f32
        %p$ = math.powf %a$, %c2$ : f32
        %m$ = arith.minimumf %p$, %c0$ : f32
        %y$ = arith.addf %x$, %m$ : f32
        attn.yield %y$ : f32
    """, ("temp",)),
)

CUSTOM_MASKS: tuple[str, ...] = (
    # an affine band: 0 <= q - kv <= 19
    """
        %d$ = arith.subi %q$, %kv$ : index
        %c19$ = arith.constant 19 : index
        %a$ = arith.cmpi sle, %d$, %c19$ : index
        %b2$ = arith.cmpi sge, %q$, %kv$ : index
        %keep$ = arith.andi %a$, %b2$ : i1
        attn.yield %keep$ : i1
    """,
    # every third key, plus the diagonal
    """
        %c3$ = arith.constant 3 : index
        %c0$ = arith.constant 0 : index
        %r$ = arith.remsi %kv$, %c3$ : index
        %a$ = arith.cmpi eq, %r$, %c0$ : index
        %d$ = arith.cmpi eq, %kv$, %q$ : index
        %keep$ = arith.ori %a$, %d$ : i1
        attn.yield %keep$ : i1
    """,
    # a head-dependent causal offset
    """
        %w$ = arith.addi %q$, %h$ : index
        %keep$ = arith.cmpi sle, %kv$, %w$ : index
        attn.yield %keep$ : i1
    """,
    # chunked attention with a per-head chunk size read from a captured i32 table
    """
        %n$ = tensor.extract %c0$[%h$] : tensor<HQxi32>
        %ni$ = arith.index_cast %n$ : i32 to index
        %cq$ = arith.divsi %q$, %ni$ : index
        %ck$ = arith.divsi %kv$, %ni$ : index
        %keep$ = arith.cmpi eq, %cq$, %ck$ : index
        attn.yield %keep$ : i1
    """,
)


@dataclass
class Case:
    """One fuzz case: a program, its shapes, strategies and which arguments learn."""

    program: Program
    dtype: str
    batch: int
    q_len: int
    kv_len: int
    strategies: tuple[str, ...]
    learnable: tuple[int, ...]
    """Argument indices whose gradient is checked (q, k, v and learnable operands)."""
    blocks_mn: tuple[int, int] = (BLOCK, BLOCK)
    """(block-m, block-n) of the tile plan, forward and backward."""
    forward_only: bool = False
    """V's heads differ from K's: compiled without lower-backward, no gradient checked."""
    blocks: list[str] = field(default_factory=list)
    """The blocks used, for the summary (e.g. 'rope', 'mask:causal')."""


def _window_side(rng: random.Random) -> int:
    """A window side at a tile-boundary residue (0, 1, 15, 16, 17 mod 16) or random."""
    return rng.choice([0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK - 1, rng.randrange(40)])


class _Draw:
    """Draws the blocks of one program into a `Builder`."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.dtype = rng.choice(["f16", "f32"])
        hkv = rng.choice([1, 2])
        hq = hkv * rng.choice([1, 2, 3])
        # V with its own head count (forward only: the backward needs K's and V's heads equal)
        v_heads = [h for h in (1, 2, hq) if hq % h == 0 and h != hkv]
        hv = rng.choice(v_heads) if v_heads and rng.random() < 0.1 else hkv
        self.forward_only = hv != hkv
        d = rng.choice([16, 24, 32, 40, 48, 64])
        dv = d if rng.random() < 0.7 else rng.choice([16, 24, 40])
        self.b = Builder("fuzz", hq=hq, hkv=hkv, hv=hv, d=d, dv=dv, dtype=self.dtype)
        self.batch = rng.choice([1, 2])
        self.q_len = rng.choice([1, 5, 16, 17, 29, 37, 50])
        self.kv_len = self.q_len if rng.random() < 0.4 else rng.choice([1, 13, 16, 29, 33, 50])
        self.learnable: list[int] = [0, 1, 2]
        self.blocks: list[str] = []

    def learn(self, name: str) -> None:
        self.learnable.append(next(i for i, a in enumerate(self.b.args) if a.name == name))

    def side_ops(self) -> None:
        rng, b = self.rng, self.b
        rope_sides = rng.choice([(), ("q",), ("k",), ("q", "k"), ("q", "k"), ("q", "k")])
        norm_sides = rng.choice([(), (), ("q",), ("k",), ("q", "k")])
        norm_first = rng.random() < 0.5
        if norm_first:
            self._norms(norm_sides)
        same = rng.random() < 0.6
        options = self._rope_options()
        shared_pos = None
        if rng.random() < 0.3 and self.q_len == self.kv_len and same and "offset" not in options:
            shared_pos = b.positions(rng.choice([1, 2]))
        for side in rope_sides:
            opts = options if same else self._rope_options()
            pos = shared_pos
            if pos is None and "offset" not in opts and rng.random() < 0.25:
                pos = b.positions(rng.choice([1, 2]), name=f"{side}pos", seq="q" if side == "q" else "kv")
            b.rope(side, positions=pos, **opts)
            self.blocks.append("rope")
        if len(rope_sides) == 2 and not same:
            self.blocks.append("rope:mismatched")
        if not norm_first:
            self._norms(norm_sides)

    def _rope_options(self) -> dict[str, object]:
        rng, d = self.rng, self.b.d
        opts: dict[str, object] = dict(rng.choice(ROPE_SCALINGS))
        if rng.random() < 0.5:
            opts["style"] = "interleaved"
        if rng.random() < 0.4:
            opts["rotary_dim"] = rng.randrange(1, d // 2 + 1) * 2
        if rng.random() < 0.2:
            opts["offset"] = rng.randrange(100)
        return opts

    def _norms(self, sides: tuple[str, ...]) -> None:
        for side in sides:
            weight = self.rng.choice([None, "f32", self.dtype])
            opts: dict[str, object] = {"eps": 1e-5}
            if weight is not None and self.rng.random() < 0.3:
                opts["weight_offset"] = 1.0
            self.b.qk_norm(side, weight=weight, **opts)
            if weight is not None:
                self.learn(f"w{side}")
            self.blocks.append("qk_norm" if weight is None else "qk_norm:weight")

    def score_ops(self) -> None:
        rng, b = self.rng, self.b
        b.scores(**({"scale": rng.choice([0.1, 0.3, 1.0])} if rng.random() < 0.3 else {}))
        draws: list[Callable[[], None]] = []
        if rng.random() < 0.3:
            draws.append(self._alibi)
        if rng.random() < 0.25:
            draws.append(self._bias)
        if rng.random() < 0.25:
            draws.append(lambda: self._softcap())
        if rng.random() < 0.3:
            draws.append(self._score_mod)
        rng.shuffle(draws)
        for draw in draws:
            draw()
        masks = [self._causal, self._window, self._prefix, self._document, self._custom]
        for mask in rng.sample(masks, rng.choice([0, 1, 1, 2, 2, 3])):
            mask()
        if rng.random() < 0.1:
            self._softcap()

    def _alibi(self) -> None:
        slopes = self.rng.random() < 0.6
        self.b.alibi(slopes=slopes)
        if slopes:
            self.learn("slopes")
        self.blocks.append("alibi:slopes" if slopes else "alibi")

    def _bias(self) -> None:
        shape = ("?" if self.rng.random() < 0.5 else 1, self.rng.choice([self.b.hq, 1]),
                 "?" if self.rng.random() < 0.8 else 1, "?")
        self.b.bias(shape, dtype=self.rng.choice(["f32", self.dtype]))
        self.learn("bias")
        self.blocks.append("bias:tensor")

    def _softcap(self) -> None:
        self.b.softcap(self.rng.choice([2.0, 5.0, 30.0]))
        self.blocks.append("softcap")

    def _score_mod(self) -> None:
        body, kinds = self.rng.choice(SCORE_MODS)
        captures = []
        for n, kind in enumerate(kinds):
            if kind == "temp":
                value = self.rng.choice([0.5, 0.7, 2.0])
                captures.append(self.b.arg(f"temp{n}", "f32", lambda g, bb, sq, skv, value=value: value))
            else:
                captures.append(self.b.table(f"tab{n}", self.b.hq))
        self.b.score_mod(body.replace("HQ", str(self.b.hq)), *captures)
        self.blocks.append("score_mod")

    def _align(self) -> dict[str, str]:
        return {"align": "bottom_right"} if self.rng.random() < 0.5 else {}

    def _causal(self) -> None:
        self.b.mask("causal", **self._align())
        self.blocks.append("mask:causal")

    def _window(self) -> None:
        sides = self.rng.choice([("left",), ("right",), ("left", "right")])
        self.b.mask("sliding_window", **self._align(), **{s: _window_side(self.rng) for s in sides})
        self.blocks.append("mask:window")

    def _prefix(self) -> None:
        if self.rng.random() < 0.5:
            self.b.mask("prefix_lm", prefix=self.rng.choice([0, 1, 15, 16, 20]))
        else:
            self.b.mask("prefix_lm", self.b.prefix_lengths())
        self.blocks.append("mask:prefix_lm")

    def _document(self) -> None:
        if self.q_len == self.kv_len and self.rng.random() < 0.6:
            self.b.mask("document", self.b.doc_ids(docs=self.rng.choice([1, 3])))
        else:
            q_ids = self.b.doc_ids("qdoc", seq="q", docs=2)
            kv_ids = self.b.doc_ids("kvdoc", seq="kv", docs=2, dtype=self.rng.choice(["i32", "i64"]))
            self.b.mask("document", q_ids, kv_ids)
        self.blocks.append("mask:document")

    def _custom(self) -> None:
        body = self.rng.choice(CUSTOM_MASKS)
        captures = []
        if "%c0$" in body and "tensor.extract" in body:
            hq = self.b.hq
            captures.append(self.b.table("chunk", hq, "i32", lambda g, bb, sq, skv: torch.randint(
                1, 24, (hq,), generator=g, dtype=torch.int32)))
        self.b.custom_mask(body.replace("HQ", str(self.b.hq)), *captures)
        self.blocks.append("mask:custom")

    def build(self) -> Program:
        rng = self.rng
        sinks, lse = rng.random() < 0.3, rng.random() < 0.3
        dropout = rng.choice([0.1, 0.3]) if rng.random() < 0.15 else None
        program = self.b.build(sinks=sinks, lse=lse, dropout=dropout)
        if sinks:
            self.learn("sinks")
        self.blocks += ["softmax:sinks"] * sinks + ["softmax:lse"] * lse + ["dropout"] * (dropout is not None)
        return program


def random_case(rng: random.Random) -> Case:
    """One random valid program with its shapes (see the module docstring)."""
    draw = _Draw(rng)
    draw.side_ops()
    draw.score_ops()
    program = draw.build()
    has_side_ops = "attn.rope" in program.text or "attn.qk_norm" in program.text
    strategies = FUSION_STRATEGIES if has_side_ops else ("fused",)
    blocks_mn = rng.choice([(BLOCK, BLOCK), (BLOCK, BLOCK), (BLOCK, 2 * BLOCK), (2 * BLOCK, BLOCK)])
    if draw.forward_only:
        draw.blocks.append("forward_only:v_heads")
    return Case(program, draw.dtype, draw.batch, draw.q_len, draw.kv_len, strategies,
                tuple(draw.learnable), blocks_mn, draw.forward_only, draw.blocks)


__all__ = ["FUSION_STRATEGIES", "Case", "random_case"]
