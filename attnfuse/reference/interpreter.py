"""The executable reference semantics of the attn dialect, in torch float64.

`interpret` walks a `func.func` body and runs one implementation per op, registered in
`IMPLS` (op class -> function) with `@impl`, like xDSL's interpreter. Every function is
built from differentiable torch ops without in-place updates, so a program run is
differentiable end to end; masked entries are `-inf` and the softmax is written so that a
fully masked row gives probabilities 0 with zero (never NaN) gradients.

Values: tensors are float64 (float element types) or int64 (integer element types);
`i64` scalars (dropout seeds) are Python ints. A packed batch (cu_seqlens on
`attn.scores`) is evaluated densely with its segments kept beside the scores
(`attnfuse.reference.packing`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Operation, SSAValue

from attnfuse.dialects.attn import (
    SCORE_OPS,
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
from attnfuse.reference.packing import Packing, PackingError, Segments, segments, transform_segments
from attnfuse.reference.paging import Paging, PagingError, paging
from attnfuse.reference.regions import evaluate_region
from attnfuse.reference.rope import RopeParams, apply_rope
from attnfuse.rng import dropout_keep

__all__ = ["IMPLS", "Frame", "ReferenceError", "Value", "alibi_slopes", "impl", "interpret"]

Value = torch.Tensor | int | float
NEG_INF = float("-inf")


class ReferenceError(ValueError):
    """Inputs the reference cannot run on (shape mismatches, unknown ops)."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ReferenceError(message)


class Frame:
    """The values of the SSA names of one function evaluation."""

    def __init__(self) -> None:
        self.values: dict[SSAValue, Value] = {}
        self.packing: dict[SSAValue, Packing | Paging] = {}
        """Scores and probabilities of a packed batch -> its segments (of a paged KV
        cache -> its pages)."""
        self.segments_of: dict[Operation, SSAValue] = {}
        """Q/K transforms of a packed batch -> the cu_seqlens of their side."""

    def __getitem__(self, value: SSAValue) -> Value:
        return self.values[value]

    def __setitem__(self, value: SSAValue, data: Value) -> None:
        self.values[value] = data

    def tensor(self, value: SSAValue) -> torch.Tensor:
        data = self.values[value]
        if isinstance(data, torch.Tensor):
            return data
        return torch.tensor(data, dtype=torch.float64 if isinstance(data, float) else torch.int64)

    def optional(self, value: SSAValue | None) -> torch.Tensor | None:
        return None if value is None else self.tensor(value)


OpImpl = Callable[[Operation, Frame], tuple[Value, ...]]
IMPLS: dict[type[Operation], OpImpl] = {}


def impl(op_type: type[Operation]) -> Callable[[Callable[..., tuple[Value, ...]]], OpImpl]:
    """Register the reference implementation of an op class."""

    def register(fn: Callable[..., tuple[Value, ...]]) -> OpImpl:
        IMPLS[op_type] = fn
        return fn

    return register


def interpret(func: FuncOp, args: Sequence[Value]) -> tuple[list[Value], Frame]:
    """Run `func` on already checked and cast arguments; return its results and frame."""
    frame = Frame()
    frame.segments_of = transform_segments(func)
    for block_arg, data in zip(func.body.block.args, args, strict=True):
        frame[block_arg] = data
    for op in func.body.block.ops:
        if isinstance(op, ReturnOp):
            return [frame[v] for v in op.arguments], frame
        fn = IMPLS.get(type(op))
        if fn is None:
            raise ReferenceError(f"reference: no semantics for '{op.name}' in a program body")
        for result, data in zip(op.results, fn(op, frame), strict=True):
            frame[result] = data
        if isinstance(op, (*SCORE_OPS, SoftmaxOp)) and op.operands[0] in frame.packing:
            frame.packing[op.results[0]] = frame.packing[op.operands[0]]
    raise ReferenceError(f"reference: @{func.sym_name.data} has no func.return")


def _grid(
    s: torch.Tensor, packing: Packing | Paging | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index tensors b, h, q, kv (int64) shaped to broadcast over `[B, H, Sq, Skv]`; in a
    packed batch b is the sequence and q, kv count within it."""
    b, h, sq, skv = s.shape
    dev = s.device
    heads = torch.arange(h, device=dev).view(1, h, 1, 1)
    if packing is not None:
        seq, q, kv = packing.grid()
        return seq, heads, q, kv
    return (
        torch.arange(b, device=dev).view(b, 1, 1, 1),
        heads,
        torch.arange(sq, device=dev).view(1, 1, sq, 1),
        torch.arange(skv, device=dev).view(1, 1, 1, skv),
    )


def _segments(cu: torch.Tensor, total: int, what: str) -> Segments:
    try:
        return segments(cu, total, what)
    except PackingError as error:
        raise ReferenceError(str(error)) from None


def _unpacked(op: Operation, frame: Frame, what: str) -> None:
    _require(op.operands[0] not in frame.packing, f"{what} indexes a padded batch: not defined on a packed batch or a paged KV cache")


def _expand_heads(x: torch.Tensor, heads: int, what: str) -> torch.Tensor:
    """GQA: repeat each of x's heads so query head h reads head `h // (heads / Hkv)`."""
    _require(heads % x.shape[1] == 0, f"{what}: {heads} heads is not a multiple of {x.shape[1]}")
    return x.repeat_interleave(heads // x.shape[1], dim=1)


# ------------------------------------------------------------------------ Q/K prep


@impl(RopeOp)
def run_rope(op: RopeOp, frame: Frame) -> tuple[Value, ...]:
    """Rotary embedding: see `attnfuse.reference.rope.apply_rope`.

    Positions are `arange(S) + offset`, or the positions operand (`[S]` or `[B, S]`), or
    with `align = "bottom_right"` `kv_len(b) - S + arange(S) + offset` (`_keys_length`).
    """
    x = frame.tensor(op.input)
    batch, _, seq, _ = x.shape
    positions = frame.optional(op.positions)
    packed = frame.segments_of.get(op)
    if op.bottom_right():
        _require(packed is None, 'attn.rope: align = "bottom_right" is not defined on a packed batch')
        start = _keys_length(op, frame).to(device=x.device, dtype=torch.int64) - seq + op.int_option("offset")
        positions = start.view(-1, 1) + torch.arange(seq, dtype=torch.int64, device=x.device)
    elif packed is not None:  # a side of a packed batch: positions restart in every sequence
        _require(positions is None, "attn.rope: positions are not defined on a packed batch")
        positions = _segments(frame.tensor(packed), seq, "attn.rope cu_seqlens").local + op.int_option("offset")
    elif positions is None:
        positions = torch.arange(seq, dtype=torch.int64, device=x.device) + op.int_option("offset")
    else:
        _require(
            positions.shape[-1] == seq,
            f"attn.rope: positions cover {positions.shape[-1]} tokens, input has {seq}",
        )
        _require(
            positions.dim() == 1 or positions.shape[0] in (1, batch),
            "attn.rope: positions batch dim must be 1 or the input's",
        )
    params = RopeParams.of(op)
    return (apply_rope(x, params, positions),)


def _keys_length(rope: RopeOp, frame: Frame) -> torch.Tensor:
    """The key count of each sequence ([B], or [1]) of the `attn.scores` whose Q `rope`
    feeds: its `kv_lens`, else K's length."""
    value: SSAValue = rope.output
    while True:
        users = [use.operation for use in value.uses]
        scores = next((u for u in users if isinstance(u, ScoresOp) and u.q is value), None)
        if scores is not None:
            break
        chain = next((u for u in users if isinstance(u, (RopeOp, QKNormOp))), None)
        _require(chain is not None, 'attn.rope: align = "bottom_right" needs the rope to feed the Q of an attn.scores')
        assert chain is not None
        value = chain.output
    if scores.kv_lens is not None:
        return frame.tensor(scores.kv_lens).view(-1)
    k = scores.k
    while isinstance(k.owner, (RopeOp, QKNormOp)) and k not in frame.values:  # K's transforms keep its shape
        k = k.owner.input
    keys = frame.tensor(k)
    return torch.tensor([keys.shape[2]], dtype=torch.int64, device=keys.device)


@impl(QKNormOp)
def run_qk_norm(op: QKNormOp, frame: Frame) -> tuple[Value, ...]:
    """`x / sqrt(mean(x^2 over head_dim) + eps) * (weight + weight_offset)`.

    Without a weight operand the factor is 1 (weight_offset is then unused).
    """
    x = frame.tensor(op.input)
    y = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + op.float_option("eps"))
    weight = frame.optional(op.weight)
    if weight is None:
        return (y,)
    _require(
        weight.shape == (x.shape[-1],), f"attn.qk_norm: weight must have shape ({x.shape[-1]},)"
    )
    return (y * (weight + op.float_option("weight_offset")),)


@impl(ScoresOp)
def run_scores(op: ScoresOp, frame: Frame) -> tuple[Value, ...]:
    """`S = q @ k^T * scale`; query head h uses kv head `h // (Hq // Hkv)`."""
    q, k = frame.tensor(op.q), frame.tensor(op.k)
    if op.kv_lens is not None:  # a paged cache (gather each sequence's keys) or a contiguous one with lengths
        _require(not isinstance(op.k.owner, (RopeOp, QKNormOp)),
                 "attn.scores: K transforms are not defined on a KV cache read through kv_lens (it holds transformed keys)")
        lens = frame.tensor(op.kv_lens)
        # A contiguous cache is a pool of one page of its whole capacity per sequence.
        table = (frame.tensor(op.block_table) if op.block_table is not None
                 else torch.arange(k.shape[0], dtype=lens.dtype, device=lens.device).view(-1, 1))
        try:
            pages = paging(table, lens, q.shape[2], k.shape[0], k.shape[2])
        except PagingError as error:
            raise ReferenceError(f"attn.scores: {error}") from None
        _require(q.shape[0] == pages.kv_lens.shape[0],
                 f"attn.scores: q batch {q.shape[0]} != {pages.kv_lens.shape[0]} rows of block_table / kv_lens")
        frame.packing[op.output] = pages
        k = pages.gather(k)
    _require(q.shape[0] == k.shape[0], f"attn.scores: q batch {q.shape[0]} != k batch {k.shape[0]}")
    _require(
        q.shape[3] == k.shape[3], f"attn.scores: q head_dim {q.shape[3]} != k head_dim {k.shape[3]}"
    )
    k = _expand_heads(k, q.shape[1], "attn.scores")
    if op.cu_seqlens_q is not None and op.cu_seqlens_k is not None:
        _require(q.shape[0] == 1, f"attn.scores: a packed batch has batch dim 1, got {q.shape[0]}")
        frame.packing[op.output] = Packing(
            _segments(frame.tensor(op.cu_seqlens_q), q.shape[2], "attn.scores cu_seqlens_q"),
            _segments(frame.tensor(op.cu_seqlens_k), k.shape[2], "attn.scores cu_seqlens_k"))
    return (torch.matmul(q, k.transpose(-1, -2)) * op.scale_value(),)


# -------------------------------------------------------------------------- scores


def alibi_slopes(heads: int, max_bias: float = 8.0) -> torch.Tensor:
    """Standard ALiBi slopes (float64) generalised to `max_bias`.

    With `n = 2^floor(log2(H))`: head `i < n` gets `2^(-max_bias (i+1) / n)`; the
    remaining `H - n` heads get the odd powers `2^(-max_bias (2j+1) / (2n))`, j = 0, 1, ...
    (the ALiBi paper / HF `build_alibi_tensor` interleave; for `max_bias = 8` exactly
    theirs, and llama.cpp's `m0`/`m1` rule for any max_bias).
    """
    n = 1 << (heads.bit_length() - 1)
    slopes = [2.0 ** (-max_bias * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-max_bias * (2 * j + 1) / (2 * n)) for j in range(heads - n)]
    return torch.tensor(slopes, dtype=torch.float64)


@impl(BiasOp)
def run_bias(op: BiasOp, frame: Frame) -> tuple[Value, ...]:
    """ALiBi `S + slope[h] * (kv_idx - q_idx)`, or `S + bias` broadcast over `[B, H, Sq, Skv]`."""
    s = frame.tensor(op.input)
    if op.kind_name == "alibi":
        slopes = frame.optional(op.slopes)
        heads = s.shape[1]
        if slopes is None:
            slopes = alibi_slopes(heads, op.float_option("max_bias")).to(s.device)
        _require(slopes.shape == (heads,), f"attn.bias: slopes must have shape ({heads},)")
        _, _, q, kv = _grid(s, frame.packing.get(op.input))
        return (s + slopes.view(1, heads, 1, 1) * (kv - q).to(torch.float64),)
    _unpacked(op, frame, "attn.bias tensor")
    bias = frame.tensor(op.bias[0])
    for dim, (got, full) in enumerate(zip(bias.shape, s.shape)):
        _require(got in (1, full), f"attn.bias: bias dim {dim} is {got}, must be 1 or {full}")
    return (s + bias,)


@impl(SoftcapOp)
def run_softcap(op: SoftcapOp, frame: Frame) -> tuple[Value, ...]:
    """`cap * tanh(S / cap)`."""
    cap = op.float_option("cap")
    return (cap * torch.tanh(frame.tensor(op.input) / cap),)


def _window_offset(op: MaskOp, s: torch.Tensor, packing: Packing | Paging | None) -> int | torch.Tensor:
    if op.str_option("align") != "bottom_right":
        return 0
    if packing is not None:
        q_len, kv_len = packing.lengths()
        return kv_len - q_len
    return s.shape[3] - s.shape[2]


def _document_keep(op: MaskOp, frame: Frame, s: torch.Tensor) -> torch.Tensor:
    batch, _, sq, skv = s.shape
    ids = [frame.tensor(a) for a in op.args]
    if len(ids) == 1:
        _require(sq == skv, "attn.mask document: one ids operand needs q_len == kv_len (give two)")
    ids_q, ids_kv = ids[0], ids[-1]
    for t, seq, what in ((ids_q, sq, "query"), (ids_kv, skv, "key")):
        _require(
            t.shape[0] in (1, batch) and t.shape[1] == seq,
            f"attn.mask document: {what} ids must be [{batch}, {seq}], got {tuple(t.shape)}",
        )
    return ids_q[:, None, :, None] == ids_kv[:, None, None, :]


def _prefix_keep(op: MaskOp, frame: Frame, s: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    if op.args:
        _unpacked(op, frame, "attn.mask prefix_lm with prefix lengths")
        prefix = frame.tensor(op.args[0])
        _require(
            prefix.shape == (s.shape[0],),
            f"attn.mask prefix_lm: prefix lengths must be [{s.shape[0]}]",
        )
        prefix = prefix.view(-1, 1, 1, 1)
    else:
        prefix = torch.tensor(op.int_option("prefix"))
    return (kv <= q) | (kv < prefix)


def _captures(frame: Frame, values: Sequence[SSAValue]) -> list[torch.Tensor]:
    return [frame.tensor(v) for v in values]


@impl(MaskOp)
def run_mask(op: MaskOp, frame: Frame) -> tuple[Value, ...]:
    """`S = keep ? S : -inf` (masks compose by AND).

    offset = 0 (top_left) or Skv - Sq (bottom_right). causal: `kv <= q + offset`;
    sliding_window: `q + offset - left <= kv <= q + offset + right` (a missing side is
    unbounded); document: `ids_q[b, q] == ids_kv[b, kv]`; prefix_lm: `kv <= q or
    kv < prefix` (option, or operand[b]); custom: the region's i1 result.
    """
    s = frame.tensor(op.input)
    packing = frame.packing.get(op.input)
    b, h, q, kv = _grid(s, packing)
    kind = op.kind_name
    if kind in ("causal", "sliding_window"):
        diag = q + _window_offset(op, s, packing)
        if kind == "causal":
            keep = kv <= diag
        else:
            keep = torch.ones_like(kv <= diag)
            if (left := op.option("left")) is not None:
                keep = keep & (kv >= diag - int(left))
            if (right := op.option("right")) is not None:
                keep = keep & (kv <= diag + int(right))
    elif kind == "document":
        _unpacked(op, frame, "attn.mask document")
        keep = _document_keep(op, frame, s)
    elif kind == "prefix_lm":
        keep = _prefix_keep(op, frame, s, q, kv)
    elif kind == "custom":
        args = [b, h, q, kv, *_captures(frame, op.args)]
        (keep,) = evaluate_region(op.predicate, args, "attn.mask custom")
    else:
        raise ReferenceError(f"attn.mask: unknown kind '{kind}'")
    return (torch.where(keep, s, NEG_INF),)


@impl(ScoreModOp)
def run_score_mod(op: ScoreModOp, frame: Frame) -> tuple[Value, ...]:
    """`S = f(S, b, h, q_idx, kv_idx, captures...)`, the region evaluated elementwise."""
    s = frame.tensor(op.input)
    args = [s, *_grid(s, frame.packing.get(op.input)), *_captures(frame, op.captures)]
    (out,) = evaluate_region(op.body, args, "attn.score_mod")
    return (out.to(torch.float64).expand(s.shape),)


# --------------------------------------------------------------------------- probs


@impl(SoftmaxOp)
def run_softmax(op: SoftmaxOp, frame: Frame) -> tuple[Value, ...]:
    """Row softmax over kv, optionally with a per-head sink logit in the denominator.

    `lse = log(sum_kv exp(S) + exp(sink[h]))` (natural log), `P = exp(S - lse)`. A row
    with no finite score gives `P = 0` and `lse = -inf` (with sinks: `lse = sink[h]`).
    A `+inf` sink outweighs every score: `P = 0` and `lse = +inf` (its gradient is the
    limit, 1 for the lse, 0 for P). The stabilising row max is detached (the result does
    not depend on it).
    """
    s = frame.tensor(op.input)
    packing = frame.packing.get(op.input)
    if packing is not None:  # scores pairing two sequences belong to neither
        s = torch.where(packing.same_sequence(), s, NEG_INF)
    row_max = s.detach().amax(dim=-1, keepdim=True)
    sinks = frame.optional(op.sinks)
    dominant = None
    if sinks is not None:
        _require(
            sinks.shape == (s.shape[1],), f"attn.softmax: sinks must have shape ({s.shape[1]},)"
        )
        sinks = sinks.view(1, -1, 1, 1)
        dominant = torch.isposinf(sinks.detach())
        infinite_sinks, sinks = sinks, torch.where(dominant, 0.0, sinks)
        row_max = torch.maximum(row_max, sinks.detach())
    row_max = torch.where(row_max == NEG_INF, torch.zeros_like(row_max), row_max)
    e = torch.exp(s - row_max)
    total = e.sum(dim=-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sinks - row_max)
    positive = total > 0
    safe = torch.where(positive, total, torch.ones_like(total))
    probs = e / safe
    lse = torch.where(positive, row_max + torch.log(safe), NEG_INF)
    if dominant is not None:
        probs = torch.where(dominant, 0.0, probs)
        lse = torch.where(dominant, infinite_sinks, lse)
    if op.lse is None:
        return (probs,)
    return probs, lse.squeeze(-1)


def _seed(data: Value) -> int:
    if isinstance(data, torch.Tensor):
        _require(
            data.numel() == 1 and not data.is_floating_point(),
            "attn.dropout: seed must be an integer",
        )
        return int(data.item())
    return int(data)


@impl(DropoutOp)
def run_dropout(op: DropoutOp, frame: Frame) -> tuple[Value, ...]:
    """`P * keep / (1 - p)`, keep from `attnfuse.rng.dropout_keep` (Triton's Philox stream)."""
    _unpacked(op, frame, "attn.dropout")
    probs = frame.tensor(op.input)
    p = op.float_option("p")
    keep = dropout_keep(_seed(frame[op.seed]), *probs.shape, p, device=probs.device)
    return (probs * keep.to(torch.float64) / (1.0 - p),)


@impl(WeightedSumOp)
def run_weighted_sum(op: WeightedSumOp, frame: Frame) -> tuple[Value, ...]:
    """`O = P @ V` with the GQA head mapping, in float64."""
    probs, v = frame.tensor(op.probs), frame.tensor(op.v)
    pages = frame.packing.get(op.probs)
    if isinstance(pages, Paging):
        _require(v.shape[2] == pages.page_size, f"attn.weighted_sum: v page size {v.shape[2]} != k's {pages.page_size}")
        v = pages.gather(v)
    _require(
        probs.shape[0] == v.shape[0],
        f"attn.weighted_sum: batch {probs.shape[0]} != v batch {v.shape[0]}",
    )
    _require(
        probs.shape[3] == v.shape[2],
        f"attn.weighted_sum: kv_len {probs.shape[3]} != v seq {v.shape[2]}",
    )
    return (torch.matmul(probs, _expand_heads(v, probs.shape[1], "attn.weighted_sum")),)
