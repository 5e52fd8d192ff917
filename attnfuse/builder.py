"""Attention programs from Python: a builder of the same attn IR the text format describes.

```python
import attnfuse, torch

program = (attnfuse.attention(heads=32, kv_heads=8, head_dim=128, dtype=torch.bfloat16, name="llama3")
           .rope(theta=500000.0).causal().build())
print(program)                       # the .attn text of the program
fn = attnfuse.compile(program)
```

A `ProgramBuilder` is immutable: every method returns a new builder with one more
building block, so a base program can be shared by variants. Q/K transforms (`qk_norm`,
`rope`) run before `attn.scores` in the order they are added; score ops (`alibi`,
`bias`, `softcap`, the masks, `score_mod`, `mask_mod`) run in the order they are added;
`sinks`, `dropout` and `lse` configure the softmax; `packed` makes the batch a packed
one (q, k, v `[1, heads, total_tokens, head_dim]` cut into sequences by cu_seqlens);
`cache_lengths` makes k and v a cache of which each sequence holds its first
`kv_lens[b]` keys. Extra operands become function arguments after q, k, v, in the order
their blocks are added (`cu_seqlens_q`/`cu_seqlens_k` or `kv_lens` first, then `pos`,
`wq`, `wk`, `slopes`, `bias`,
`doc`, `prefix_len`, captures, `sinks`, `seed`). `score_mod` and
`mask_mod` take Python functions written as for flex_attention, traced into regions
(`attnfuse.tracing`). `build()` verifies the IR and prints it: the program *is* its text.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    IndexType,
    ModuleOp,
    StringAttr,
    TensorType,
    f32,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn import (
    BiasOp,
    DropoutOp,
    MaskOp,
    QKNormOp,
    RopeOp,
    ScoreModOp,
    ScoresOp,
    SoftcapOp,
    SoftmaxOp,
    WeightedSumOp,
)
from attnfuse.dialects.attn_syntax import AttnSyntaxOp
from attnfuse.dialects.attn_types import DYNAMIC, ProbsType, ScoresType

__all__ = ["Capture", "Program", "ProgramBuilder", "attention", "element_type"]

OptionValue = float | int | str
_ELEMENT_TYPES: dict[str, Attribute] = {"f16": Float16Type(), "bf16": BFloat16Type(), "f32": Float32Type()}
_TORCH_NAMES = {"torch.float16": "f16", "torch.half": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32",
                "torch.float": "f32"}
_INT_TYPES: dict[str, Attribute] = {"i32": i32, "i64": i64, "torch.int32": i32, "torch.int64": i64}
_BROADCAST_DIMS = ("batch", "heads", "q", "kv")


def element_type(dtype: object, what: str = "dtype") -> Attribute:
    """The element type of `dtype`: "f16", "bf16", "f32" or the torch dtype."""
    name = _TORCH_NAMES.get(str(dtype), dtype)
    if not isinstance(name, str) or name not in _ELEMENT_TYPES:
        raise ValueError(f"{what} must be one of f16, bf16, f32 (or the torch dtype), got {dtype!r}")
    return _ELEMENT_TYPES[name]


@dataclass(frozen=True)
class Program:
    """An attention program: one `func.func` in the text format."""

    name: str
    source: str
    """The program text (`str(program)`), what `attnfuse.compile` parses."""

    def text(self) -> str:
        return self.source

    def __str__(self) -> str:
        return self.source


@dataclass(frozen=True)
class Capture:
    """A value a `score_mod` / `mask_mod` reads besides the indices: a tensor argument of
    the program (`shape` with "?" for dynamic dims) or, with `shape=()`, a float scalar."""

    shape: tuple[int | str, ...] = ()
    dtype: object = "f32"

    def to_type(self, what: str) -> Attribute:
        if not self.shape:
            return element_type(self.dtype, what)
        dims = [DYNAMIC if d == "?" else d for d in self.shape]
        if not all(isinstance(d, int) and (d >= 0 or d == DYNAMIC) for d in dims):
            raise ValueError(f"{what}: shape dims must be non-negative ints or '?', got {self.shape}")
        ty = _INT_TYPES.get(str(self.dtype)) or element_type(self.dtype, what)
        return TensorType(ty, dims)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Operand:
    """A function argument a building block adds (shared by blocks asking for one name)."""

    name: str
    type: Attribute


@dataclass(frozen=True)
class _Step:
    """One building block: an op of `op_type` on the current Q, K or scores value."""

    op_type: type[AttnSyntaxOp]
    side: str
    """"q" or "k" (transforms before attn.scores), else "scores"."""
    options: tuple[tuple[str, OptionValue], ...] = ()
    kind: str | None = None
    operands: tuple[_Operand, ...] = ()
    keyword_operand: _Operand | None = None
    region: Region | None = None
    """A traced region, cloned into every build."""


def _options(op_type: type[AttnSyntaxOp], given: dict[str, OptionValue | None]) -> tuple[tuple[str, OptionValue], ...]:
    """The options written (not None), checked against the op's declared kinds and choices."""
    declared = {o.name: o for o in op_type.OPTIONS}
    written: list[tuple[str, OptionValue]] = []
    for name, value in given.items():
        if value is None:
            continue
        option = declared[name]
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) if option.kind is float else (
            isinstance(value, int) and not isinstance(value, bool)) if option.kind is int else isinstance(value, str)
        if not ok:
            raise TypeError(f"{op_type.name} option {name!r} must be {option.kind.__name__}, got {value!r}")
        if option.choices and value not in option.choices:
            raise ValueError(f"{op_type.name} option {name!r} must be one of {', '.join(option.choices)}, got {value!r}")
        written.append((name, float(value) if option.kind is float else value))
    return tuple(written)


@dataclass(frozen=True)
class ProgramBuilder:
    """Builds one attention program (see the module docstring); start with `attention(...)`."""

    heads: int
    head_dim: int
    kv_heads: int
    v_head_dim: int
    dtype: Attribute
    name: str = "attention"
    steps: tuple[_Step, ...] = ()
    scale_value: float | None = None
    sink_type: Attribute | None = None
    dropout_p: float | None = None
    returns_lse: bool = False
    cu_seqlens: tuple[str, ...] = ()
    """Names of the cu_seqlens arguments of a packed batch (q's, then k's; one when shared)."""
    kv_lens: bool = False
    """k and v are a contiguous cache with per-sequence lengths (an int32 `kv_lens` argument)."""

    # ---------------------------------------------------------------- Q and K transforms

    def _sides_of(self, on: str) -> tuple[str, ...]:
        if on not in ("q", "k", "qk"):
            raise ValueError(f"on must be 'q', 'k' or 'qk', got {on!r}")
        return tuple(side for side in ("q", "k") if side in on)

    def qk_norm(self, *, eps: float | None = None, weight: bool = True, weight_offset: float | None = None,
                weight_dtype: object = None, placement: str | None = None, on: str = "qk") -> ProgramBuilder:
        """RMS-norm of Q and/or K rows (`attn.qk_norm`); `weight` adds a learned `[head_dim]`
        weight argument per side (`wq`, `wk`; default dtype: the program's)."""
        options = _options(QKNormOp, {"eps": eps, "weight_offset": weight_offset, "placement": placement})
        wtype = TensorType(self.dtype if weight_dtype is None else element_type(weight_dtype, "weight_dtype"),
                           [self.head_dim])
        return self._add(*(
            _Step(QKNormOp, side, options, keyword_operand=_Operand(f"w{side}", wtype) if weight else None)
            for side in self._sides_of(on)))

    def rope(self, *, theta: float | None = None, style: str | None = None, rotary_dim: int | None = None,
             offset: int | None = None, scaling: str | None = None, factor: float | None = None,
             low_freq_factor: float | None = None, high_freq_factor: float | None = None,
             original_max_position: int | None = None, beta_fast: float | None = None,
             beta_slow: float | None = None, truncate: int | None = None, attention_factor: float | None = None,
             placement: str | None = None, positions: bool = False, align: str | None = None,
             on: str = "qk") -> ProgramBuilder:
        """Rotary embedding of Q and/or K (`attn.rope`, options as in docs/dialect.md);
        `positions=True` adds a `[B, S]` int32 position-ids argument `pos`, shared by both
        sides; `align="bottom_right"` (with `on="q"`) puts the queries at the end of the
        keys, as a decode step's new tokens."""
        options = _options(RopeOp, {
            "theta": theta, "style": style, "rotary_dim": rotary_dim, "offset": offset, "scaling": scaling,
            "factor": factor, "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
            "original_max_position": original_max_position, "beta_fast": beta_fast, "beta_slow": beta_slow,
            "truncate": truncate, "attention_factor": attention_factor, "placement": placement, "align": align})
        pos = _Operand("pos", TensorType(i32, [DYNAMIC, DYNAMIC])) if positions else None
        return self._add(*(_Step(RopeOp, side, options, keyword_operand=pos) for side in self._sides_of(on)))

    def scale(self, value: float) -> ProgramBuilder:
        """The scores' scale (default `1/sqrt(head_dim)`)."""
        _options(ScoresOp, {"scale": value})
        return replace(self, scale_value=float(value))

    # ---------------------------------------------------------------- score ops

    def alibi(self, *, slopes: bool = False, max_bias: float | None = None) -> ProgramBuilder:
        """ALiBi bias `slope[h] * (kv_idx - q_idx)`; `slopes=True` adds an `[H]` f32 argument."""
        operand = _Operand("slopes", TensorType(f32, [self.heads])) if slopes else None
        return self._add(_Step(BiasOp, "scores", _options(BiasOp, {"max_bias": max_bias}), "alibi",
                               keyword_operand=operand))

    def bias(self, *, broadcast: Sequence[str] = ("batch",), dtype: object = "f32") -> ProgramBuilder:
        """An additive bias argument `bias` of shape `[B, H, Sq, Skv]`, with size 1 for the
        dims named in `broadcast` ("batch", "heads", "q", "kv")."""
        if unknown := set(broadcast) - set(_BROADCAST_DIMS):
            raise ValueError(f"broadcast names dims among {', '.join(_BROADCAST_DIMS)}, got {sorted(unknown)}")
        full = (DYNAMIC, self.heads, DYNAMIC, DYNAMIC)
        dims = [1 if d in broadcast else n for d, n in zip(_BROADCAST_DIMS, full)]
        operand = _Operand("bias", TensorType(element_type(dtype, "bias dtype"), dims))
        return self._add(_Step(BiasOp, "scores", kind="tensor", operands=(operand,)))

    def softcap(self, cap: float) -> ProgramBuilder:
        """`cap * tanh(score / cap)` (Gemma 2)."""
        return self._add(_Step(SoftcapOp, "scores", _options(SoftcapOp, {"cap": cap})))

    def causal(self, *, align: str | None = None) -> ProgramBuilder:
        """Keep `kv_idx <= q_idx` (`align="bottom_right"` shifts the diagonal by `Skv - Sq`)."""
        return self._mask("causal", align=align)

    def sliding_window(self, *, left: int | None = None, right: int | None = None,
                       align: str | None = None) -> ProgramBuilder:
        """Keep `q_idx - left <= kv_idx <= q_idx + right`; a model's window W with `causal()`
        is `left=W - 1`."""
        return self._mask("sliding_window", left=left, right=right, align=align)

    def document(self, *, separate_kv: bool = False) -> ProgramBuilder:
        """Keep keys of the query's document: a `[B, S]` int32 ids argument `doc`, or
        `q_doc` and `kv_doc` with `separate_kv=True`."""
        ids = TensorType(i32, [DYNAMIC, DYNAMIC])
        names = ("q_doc", "kv_doc") if separate_kv else ("doc",)
        return self._add(_Step(MaskOp, "scores", kind="document", operands=tuple(_Operand(n, ids) for n in names)))

    def prefix_lm(self, prefix: int | None = None) -> ProgramBuilder:
        """Causal plus a fully visible prefix: `prefix` keys, or a `[B]` int32 argument
        `prefix_len` when None."""
        if prefix is not None:
            return self._mask("prefix_lm", prefix=prefix)
        operand = _Operand("prefix_len", TensorType(i32, [DYNAMIC]))
        return self._add(_Step(MaskOp, "scores", kind="prefix_lm", operands=(operand,)))

    def mask_mod(self, fn: Callable[..., Any], **captures: Capture | Any) -> ProgramBuilder:
        """A custom mask `fn(b, h, q_idx, kv_idx, **captures) -> bool`, traced into an
        `attn.mask custom` region; each capture becomes an argument of its name."""
        return self._region(MaskOp, "custom", fn, captures, "bool")

    def score_mod(self, fn: Callable[..., Any], **captures: Capture | Any) -> ProgramBuilder:
        """`score = fn(score, b, h, q_idx, kv_idx, **captures)`, traced into an
        `attn.score_mod` region; each capture becomes an argument of its name."""
        return self._region(ScoreModOp, None, fn, captures, "float")

    # ---------------------------------------------------------------- softmax and after

    def sinks(self, *, dtype: object = "f32") -> ProgramBuilder:
        """Per-head sink logits (gpt-oss): an `[H]` argument `sinks`."""
        return replace(self, sink_type=TensorType(element_type(dtype, "sinks dtype"), [self.heads]))

    def dropout(self, p: float) -> ProgramBuilder:
        """Dropout on the probabilities with an i64 `seed` argument."""
        _options(DropoutOp, {"p": p})
        return replace(self, dropout_p=float(p))

    def lse(self) -> ProgramBuilder:
        """Return `(out, lse)`."""
        return replace(self, returns_lse=True)

    def packed(self, *, shared: bool = False) -> ProgramBuilder:
        """A packed batch: q, k, v are `[1, heads, total_tokens, head_dim]` and int32
        `[N + 1]` arguments `cu_seqlens_q`, `cu_seqlens_k` (one `cu_seqlens` when
        `shared`) cut them into N sequences, each attended on its own."""
        return replace(self, cu_seqlens=("cu_seqlens",) if shared else ("cu_seqlens_q", "cu_seqlens_k"))

    def cache_lengths(self) -> ProgramBuilder:
        """k and v are a KV cache `[B, kv_heads, capacity, head_dim]` of which sequence `b`
        holds its first `kv_lens[b]` keys (an int32 `[B]` argument `kv_lens`): decoding
        against a cache allocated once. Inference only (docs/inference.md)."""
        return replace(self, kv_lens=True)

    # ---------------------------------------------------------------- building

    def _add(self, *steps: _Step) -> ProgramBuilder:
        return replace(self, steps=self.steps + steps)

    def _mask(self, kind: str, **options: OptionValue | None) -> ProgramBuilder:
        return self._add(_Step(MaskOp, "scores", _options(MaskOp, options), kind))

    def _region(self, op_type: type[AttnSyntaxOp], kind: str | None, fn: Callable[..., Any],
                captures: dict[str, Any], result: str) -> ProgramBuilder:
        from attnfuse.tracing import trace_region

        what = f"{'mask_mod' if result == 'bool' else 'score_mod'} {getattr(fn, '__name__', repr(fn))!r}"
        if not callable(fn):
            raise TypeError(f"{what}: expected a function, got {type(fn).__name__}")
        operands = tuple(_Operand(name, _capture_type(spec, f"{what} capture {name!r}"))
                         for name, spec in captures.items())
        index_args = [IndexType()] * 4
        arg_types: list[Attribute] = index_args if result == "bool" else [f32, *index_args]
        block = trace_region(fn, arg_types, [(o.name, o.type) for o in operands], result, what)
        return self._add(_Step(op_type, "scores", kind=kind, operands=operands, region=Region(block)))

    def build(self) -> Program:
        """The program: its IR verified and printed in the text format."""
        return Program(self.name, _print(self.function()))

    def function(self) -> func.FuncOp:
        """The program as a `func.func` of attn ops (verified)."""
        function = _Emitter(self).run()
        try:
            ModuleOp([function]).verify()
        except VerifyException as error:
            raise ValueError(f"attnfuse.attention @{self.name}: {error}") from None
        function.detach()
        return function


def _capture_type(spec: object, what: str) -> Attribute:
    if isinstance(spec, Capture):
        return spec.to_type(what)
    shape, dtype = getattr(spec, "shape", None), getattr(spec, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"{what}: expected attnfuse.builder.Capture(shape, dtype) or a tensor, "
                        f"got {type(spec).__name__}")
    return Capture(tuple(shape), dtype).to_type(what)


class _Emitter:
    """Emits the ops of a builder into one function body."""

    def __init__(self, builder: ProgramBuilder) -> None:
        self.b = builder
        self.batch = 1 if builder.cu_seqlens else DYNAMIC
        qkv = [_qkv(builder.dtype, builder.heads, builder.head_dim, self.batch),
               _qkv(builder.dtype, builder.kv_heads, builder.head_dim, self.batch),
               _qkv(builder.dtype, builder.kv_heads, builder.v_head_dim, self.batch)]
        self.block = Block(arg_types=qkv)
        self.args: dict[str, SSAValue] = {}
        for name, arg in zip("qkv", self.block.args):
            arg.name_hint = name
            self.args[name] = arg
        self.cu = [self.arg(_Operand(name, TensorType(i32, [DYNAMIC]))) for name in builder.cu_seqlens]
        self.lens = self.arg(_Operand("kv_lens", TensorType(i32, [DYNAMIC]))) if builder.kv_lens else None

    def arg(self, operand: _Operand) -> SSAValue:
        existing = self.args.get(operand.name)
        if existing is not None and existing.type == operand.type:
            return existing
        name, n = operand.name, 2
        while name in self.args:
            name, n = f"{operand.name}_{n}", n + 1
        arg = self.block.insert_arg(operand.type, len(self.block.args))
        arg.name_hint = name
        self.args[name] = arg
        return arg

    def emit(self, op: Operation, name: str) -> SSAValue:
        self.block.add_op(op)
        op.results[0].name_hint = name
        return op.results[0]

    def step(self, step: _Step, value: SSAValue, name: str) -> SSAValue:
        properties: dict[str, Attribute] = {}
        if step.kind is not None:
            properties["kind"] = StringAttr(step.kind)
        declared = {o.name: o for o in step.op_type.OPTIONS}
        for key, option_value in step.options:
            properties[key] = declared[key].to_attr(option_value)
        operands = [self.arg(o) for o in step.operands]
        regions: list[Region] = []
        if step.region is not None:
            regions.append(step.region.clone())
        elif step.op_type is MaskOp:
            regions.append(Region())
        groups: list[Any] = [value]
        if step.op_type is BiasOp:
            keyword = [self.arg(step.keyword_operand)] if step.keyword_operand else []
            groups += [operands, keyword]
        elif step.op_type in (MaskOp, ScoreModOp):
            groups.append(operands)
        elif step.op_type in (RopeOp, QKNormOp):
            groups.append([self.arg(step.keyword_operand)] if step.keyword_operand else [])
        op = step.op_type.build(operands=groups, result_types=[value.type], properties=properties, regions=regions)
        return self.emit(op, name)

    def run(self) -> func.FuncOp:
        b = self.b
        sides = {"q": self.args["q"], "k": self.args["k"]}
        suffix = {QKNormOp: "n", RopeOp: "r"}
        for step in b.steps:
            if step.side in sides:
                sides[step.side] = self.step(step, sides[step.side], step.side + suffix[step.op_type])
        dims = [DYNAMIC, b.heads, DYNAMIC, DYNAMIC]
        scale = {"scale": ScoresOp.OPTIONS[0].to_attr(b.scale_value)} if b.scale_value is not None else {}
        cu = [[self.cu[0]], [self.cu[-1]]] if self.cu else [[], []]
        cu += [[], [] if self.lens is None else [self.lens]]  # block_table (never: no paged cache), kv_lens
        s = self.emit(ScoresOp.build(operands=[sides["q"], sides["k"], *cu], result_types=[ScoresType(dims)],
                                     properties=scale), "s")
        for n, step in enumerate((st for st in b.steps if st.side == "scores"), start=1):
            s = self.step(step, s, f"s{n}")
        sinks = [self.arg(_Operand("sinks", b.sink_type))] if b.sink_type is not None else []
        lse_type = TensorType(f32, [self.batch, b.heads, DYNAMIC])
        softmax = SoftmaxOp.build(operands=[s, sinks], result_types=[ProbsType(dims), [lse_type] if b.returns_lse else []])
        p = self.emit(softmax, "p")
        if b.dropout_p is not None:
            seed = self.arg(_Operand("seed", i64))
            p = self.emit(DropoutOp.build(operands=[p, seed], result_types=[p.type],
                                          properties={"p": DropoutOp.OPTIONS[0].to_attr(b.dropout_p)}), "pd")
        out_type = _qkv(b.dtype, b.heads, b.v_head_dim, self.batch)
        o = self.emit(WeightedSumOp.build(operands=[p, self.args["v"]], result_types=[out_type]), "o")
        results = [o]
        if b.returns_lse:
            softmax.results[1].name_hint = "lse"
            results.append(softmax.results[1])
        self.block.add_op(func.ReturnOp(*results))
        types = [r.type for r in results]
        return func.FuncOp(b.name, ([a.type for a in self.block.args], types), Region(self.block))


def _qkv(dtype: Attribute, heads: int, dim: int, batch: int) -> TensorType:
    return TensorType(dtype, [batch, heads, DYNAMIC, dim])  # type: ignore[arg-type]


def _print(op: Operation) -> str:
    buf = io.StringIO()
    Printer(stream=buf).print_op(op)
    return buf.getvalue() + "\n"


def attention(heads: int, head_dim: int, *, kv_heads: int | None = None, v_head_dim: int | None = None,
            dtype: object = "bf16", name: str = "attention") -> ProgramBuilder:
    """Start an attention program: `heads` query heads (`kv_heads` key/value heads, GQA
    when fewer; default `heads`) of `head_dim` (`v_head_dim` for V, default `head_dim`),
    in `dtype` ("f16", "bf16", "f32" or a torch dtype)."""
    for what, value in (("heads", heads), ("head_dim", head_dim), ("kv_heads", kv_heads),
                        ("v_head_dim", v_head_dim)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"attnfuse.attention: {what} must be a positive int, got {value!r}")
    if not name.isidentifier():
        raise ValueError(f"attnfuse.attention: name must be an identifier, got {name!r}")
    return ProgramBuilder(heads, head_dim, heads if kv_heads is None else kv_heads,
                          head_dim if v_head_dim is None else v_head_dim, element_type(dtype), name)
