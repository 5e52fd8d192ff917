"""The `attn` dialect: attention as a composition of ten building blocks.

Tensors use the `[batch, heads, seq, head_dim]` layout; batch and sequence dims may be
dynamic (`?`). Grouped-query attention is implied by head counts (`Hq % Hkv == 0`).
See docs/dialect.md for the full reference.

```mlir
func.func @llama3(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>,
                  %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %qr = attn.rope %q {theta = 500000.0} : tensor<?x32x?x128xbf16>
  %kr = attn.rope %k {theta = 500000.0} : tensor<?x8x?x128xbf16>
  %s = attn.scores %qr, %kr : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
```
"""

from __future__ import annotations

import math
from typing import ClassVar

from xdsl.dialects.builtin import (
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    f32,
    i1,
)
from xdsl.ir import Attribute, Dialect, Region
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    base,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    opt_result_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import HasParent, IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn_online import OnlineSoftmaxOp, TilePlanAttr
from attnfuse.dialects.attn_paged import verify_paged_operands
from attnfuse.dialects.attn_split_kv import SplitKVAttr
from attnfuse.dialects.attn_syntax import AttnSyntaxOp
from attnfuse.dialects.attn_types import (
    DYNAMIC,
    F32_MAX,
    Option,
    ProbsType,
    ScoresType,
    cu_seqlens_type,
    dims_compatible,
    format_dims,
    int_tensor,
    qkv_shape,
    vector_shape,
)

PLACEMENT = Option(
    "placement",
    str,
    "auto",
    ("auto", "kernel", "prekernel"),
    "where the transform runs: chosen by rope-fusion, inside the attention kernel, "
    "or in a generated pre-kernel",
)


def _check_same_type(op: IRDLOperation, a: Attribute, b: Attribute, what: str) -> None:
    if a != b:
        raise VerifyException(f"{op.name}: {what} must have type {a}, got {b}")


def _check_region_args(region: Region, expected: list[Attribute], op_name: str, what: str) -> None:
    if not region.blocks:
        raise VerifyException(f"{op_name}: {what} needs a region")
    if len(region.blocks) != 1:
        raise VerifyException(f"{op_name}: {what} region must have a single block")
    got = [a.type for a in region.block.args]
    if got != expected:
        shown = ", ".join(str(t) for t in expected)
        raise VerifyException(
            f"{op_name}: {what} region arguments must be ({shown}), got "
            f"({', '.join(str(t) for t in got)})"
        )
    last = region.block.last_op
    if not isinstance(last, YieldOp):
        raise VerifyException(f"{op_name}: {what} region must end with attn.yield")


def _check_yield(region: Region, expected: Attribute, op_name: str) -> None:
    last = region.block.last_op
    assert isinstance(last, YieldOp)
    types = [v.type for v in last.values]
    if types != [expected]:
        raise VerifyException(f"{op_name}: region must yield one {expected}, got {types}")


# =============================================================================== ops


@irdl_op_definition
class RopeOp(AttnSyntaxOp):
    """Rotary position embedding of Q or K over head_dim.

    Positions are `index + offset`, or an explicit `positions` operand (`[S]` or `[B, S]`).

    ```mlir
    %qr = attn.rope %q {theta = 500000.0, scaling = "llama3", factor = 8.0} : tensor<?x32x?x128xbf16>
    %kr = attn.rope %k positions %pos {style = "interleaved"} : tensor<?x8x?x64xf16>, tensor<?x?xi32>
    ```
    """

    name = "attn.rope"
    input = operand_def(TensorType)
    positions = opt_operand_def(TensorType)
    output = result_def(TensorType)
    theta = opt_prop_def(FloatAttr)
    style = opt_prop_def(StringAttr)
    rotary_dim = opt_prop_def(IntegerAttr)
    offset = opt_prop_def(IntegerAttr)
    scaling = opt_prop_def(StringAttr)
    factor = opt_prop_def(FloatAttr)
    low_freq_factor = opt_prop_def(FloatAttr)
    high_freq_factor = opt_prop_def(FloatAttr)
    original_max_position = opt_prop_def(IntegerAttr)
    beta_fast = opt_prop_def(FloatAttr)
    beta_slow = opt_prop_def(FloatAttr)
    truncate = opt_prop_def(IntegerAttr)
    attention_factor = opt_prop_def(FloatAttr)
    placement = opt_prop_def(StringAttr)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("input",)
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("positions",)
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("theta", float, 10000.0, doc="base of the rotation frequencies"),
        Option("style", str, "half", ("half", "interleaved"), "pair layout: Llama/HF or GPT-J"),
        Option("rotary_dim", int, None, doc="rotate only the first rotary_dim dims (even)"),
        Option("offset", int, 0, doc="added to the sequence index to form positions"),
        Option("scaling", str, "none", ("none", "linear", "llama3", "yarn")),
        Option("factor", float, 1.0, doc="context-extension factor of the scaling"),
        Option("low_freq_factor", float, 1.0, doc="llama3 scaling"),
        Option("high_freq_factor", float, 4.0, doc="llama3 scaling"),
        Option("original_max_position", int, 8192, doc="llama3 / yarn pre-training context"),
        Option("beta_fast", float, 32.0, doc="yarn ramp bound (rotations)"),
        Option("beta_slow", float, 1.0, doc="yarn ramp bound (rotations)"),
        Option("truncate", int, 1, doc="yarn: round the ramp bounds to integers (1) or not (0, gpt-oss)"),
        Option("attention_factor", float, None, doc="yarn cos/sin scale, default 0.1 ln(factor) + 1"),
        PLACEMENT,
    )

    def head_dim(self) -> int:
        return qkv_shape(self.input.type, "rope input")[3]

    def rotary_width(self) -> int:
        """Number of rotated dims (all of head_dim unless `rotary_dim` is given)."""
        width = self.option("rotary_dim")
        return self.head_dim() if width is None else int(width)

    def max_log10_frequency(self) -> float:
        """log10 of a bound on the inverse frequencies, theta^(-2i/w) / factor (the
        kernels keep them in f32)."""
        width = self.rotary_width()
        bound = max(0.0, -(width - 2) / width * math.log10(self.float_option("theta")))
        if self.str_option("scaling") != "none":
            bound += max(0.0, -math.log10(self.float_option("factor")))
        return bound

    def verify_(self) -> None:
        d = qkv_shape(self.input.type, "rope input")[3]
        _check_same_type(self, self.input.type, self.output.type, "result")
        width = self.rotary_width()
        if width % 2 or width < 2 or width > d:
            raise VerifyException(
                f"attn.rope: rotary_dim must be even and in [2, {d}], got {width}"
            )
        if self.float_option("theta") <= 0:
            raise VerifyException("attn.rope: theta must be positive")
        if self.float_option("factor") <= 0:
            raise VerifyException("attn.rope: factor must be positive")
        if self.max_log10_frequency() > math.log10(F32_MAX):
            raise VerifyException(
                "attn.rope: theta and factor give rotation frequencies beyond the f32 "
                "range (theta^(-2i/rotary_dim) / factor > 3.4e38)"
            )
        if self.str_option("scaling") == "llama3" and not (
            self.float_option("high_freq_factor") > self.float_option("low_freq_factor") > 0
        ):
            raise VerifyException("attn.rope: llama3 scaling needs high_freq_factor > low_freq_factor > 0")
        if self.str_option("scaling") in ("llama3", "yarn") and self.int_option("original_max_position") <= 0:
            raise VerifyException("attn.rope: original_max_position must be positive")
        if self.str_option("scaling") == "yarn":
            # (the yarn ramp takes log(original_max_position / (2 pi beta)) / log(theta))
            if not (self.float_option("beta_fast") > 0 and self.float_option("beta_slow") > 0):
                raise VerifyException("attn.rope: yarn scaling needs beta_fast > 0 and beta_slow > 0")
            if self.float_option("theta") <= 1:
                raise VerifyException("attn.rope: yarn scaling needs theta > 1")
            if self.int_option("truncate") not in (0, 1):
                raise VerifyException("attn.rope: truncate must be 0 or 1")
        if self.positions is not None:
            pos_type = self.positions.type
            if not isinstance(pos_type, TensorType) or len(pos_type.get_shape()) not in (1, 2):
                raise VerifyException("attn.rope: positions must be tensor<?xi32> or tensor<?x?xi32>")
            int_tensor(pos_type, "attn.rope positions", len(pos_type.get_shape()))
            if self.int_option("offset"):
                raise VerifyException("attn.rope: give either positions or offset, not both")


@irdl_op_definition
class QKNormOp(AttnSyntaxOp):
    """RMS normalisation of each Q or K row over head_dim, with an optional weight.

    `y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset)` (Qwen3, OLMo2; Gemma3 uses
    `weight_offset = 1.0`).

    ```mlir
    %qn = attn.qk_norm %q weight %wq {eps = 1e-06} : tensor<?x32x?x128xbf16>, tensor<128xf32>
    ```
    """

    name = "attn.qk_norm"
    input = operand_def(TensorType)
    weight = opt_operand_def(TensorType)
    output = result_def(TensorType)
    eps = opt_prop_def(FloatAttr)
    weight_offset = opt_prop_def(FloatAttr)
    placement = opt_prop_def(StringAttr)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("input",)
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("weight",)
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("eps", float, 1e-6, doc="added to the mean square"),
        Option("weight_offset", float, 0.0, doc="added to the weight (Gemma: 1.0)"),
        PLACEMENT,
    )

    def verify_(self) -> None:
        d = qkv_shape(self.input.type, "qk_norm input")[3]
        _check_same_type(self, self.input.type, self.output.type, "result")
        if self.weight is not None:
            vector_shape(self.weight.type, "attn.qk_norm weight", d)
        if self.float_option("eps") < 0:
            raise VerifyException("attn.qk_norm: eps must be >= 0")


@irdl_op_definition
class ScoresOp(AttnSyntaxOp):
    """`S = Q K^T * scale`; query head h reads key head `h // (Hq / Hkv)` (GQA).

    With `cu_seqlens_q` and `cu_seqlens_k` the batch is *packed*: q is
    `[1, Hq, total_q, D]`, k `[1, Hkv, total_k, D]`, sequence `i` holds tokens
    `cu[i] <= t < cu[i + 1]` of each, and the scores are one `[len_q(i), len_k(i)]` block
    per sequence (the result's batch dim counts sequences). The program then runs on
    every sequence alone: Q/K transforms and score ops see indices within the sequence.

    With `block_table` and `kv_lens` K (and V) are *paged*: page pools
    `[?, Hkv, page_size, D]`, and sequence `b` has `kv_lens[b]` keys, key `j` in page
    `block_table[b, j / page_size]` (`attnfuse.dialects.attn_paged`).

    ```mlir
    %s = attn.scores %q, %k {scale = 0.0625} : tensor<?x16x?x256xbf16>, tensor<?x8x?x256xbf16> -> !attn.scores<?x16x?x?xf32>
    %p = attn.scores %q1, %k1 cu_seqlens_q %cq cu_seqlens_k %ck : tensor<1x32x?x128xbf16>, tensor<1x8x?x128xbf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
    %c = attn.scores %q2, %pool block_table %bt kv_lens %lens : tensor<?x32x?x128xbf16>, tensor<?x8x16x128xbf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
    ```
    """

    name = "attn.scores"
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    cu_seqlens_q = opt_operand_def(TensorType)
    cu_seqlens_k = opt_operand_def(TensorType)
    block_table = opt_operand_def(TensorType)
    kv_lens = opt_operand_def(TensorType)
    output = result_def(ScoresType)
    scale = opt_prop_def(FloatAttr)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("q", "k")
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("cu_seqlens_q", "cu_seqlens_k", "block_table", "kv_lens")
    EXPLICIT_RESULTS: ClassVar[bool] = True
    OPTIONS: ClassVar[tuple[Option, ...]] = (Option("scale", float, None, doc="default 1/sqrt(head_dim)"),)

    def scale_value(self) -> float:
        scale = self.option("scale")
        if scale is None:
            return 1.0 / math.sqrt(qkv_shape(self.q.type, "q")[3])
        return float(scale)

    def verify_(self) -> None:
        bq, hq, sq, dq = qkv_shape(self.q.type, "attn.scores q")
        bk, hk, sk, dk = qkv_shape(self.k.type, "attn.scores k")
        assert isinstance(self.q.type, TensorType) and isinstance(self.k.type, TensorType)
        if self.q.type.element_type != self.k.type.element_type:
            raise VerifyException("attn.scores: q and k must have the same element type")
        if dq != dk:
            raise VerifyException(f"attn.scores: q head_dim {dq} != k head_dim {dk}")
        if hq % hk:
            raise VerifyException(
                f"attn.scores: query heads ({hq}) must be a multiple of key heads ({hk})"
            )
        paged = self.block_table is not None or self.kv_lens is not None
        if not paged and not dims_compatible(bq, bk):
            raise VerifyException(f"attn.scores: batch dims differ ({bq} vs {bk})")
        assert isinstance(self.output.type, ScoresType)
        expect = (bq, hq, sq, DYNAMIC if paged else sk)
        for got, want, what in zip(self.output.type.dims, expect, ("batch", "heads", "q_len", "kv_len")):
            if not dims_compatible(got, want):
                raise VerifyException(f"attn.scores: result {what} dim {got} != {want}")
        if self.option("scale") is not None and self.float_option("scale") <= 0:
            raise VerifyException("attn.scores: scale must be positive")
        if paged:
            if self.block_table is None or self.kv_lens is None:
                raise VerifyException("attn.scores: a paged KV cache needs both block_table and kv_lens")
            if self.cu_seqlens_q is not None or self.cu_seqlens_k is not None:
                raise VerifyException("attn.scores: a paged KV cache (block_table) and a packed batch "
                                      "(cu_seqlens) do not combine")
            verify_paged_operands(self.q.type, self.k.type, self.block_table.type, self.kv_lens.type,
                                  self.output.type.dims[3])
        if (self.cu_seqlens_q is None) != (self.cu_seqlens_k is None):
            raise VerifyException("attn.scores: a packed batch needs both cu_seqlens_q and cu_seqlens_k")
        if self.cu_seqlens_q is not None and self.cu_seqlens_k is not None:
            cu_seqlens_type(self.cu_seqlens_q.type, "attn.scores cu_seqlens_q")
            cu_seqlens_type(self.cu_seqlens_k.type, "attn.scores cu_seqlens_k")
            if (bq, bk) != (1, 1):
                raise VerifyException(
                    "attn.scores: packed q and k have batch dim 1 ([1, heads, total_tokens, head_dim]), "
                    f"got q {format_dims(self.q.type.get_shape())} and k {format_dims(self.k.type.get_shape())}")
            if any(d != DYNAMIC for d in (*self.output.type.dims[:1], *self.output.type.dims[2:])):
                raise VerifyException("attn.scores: packed scores have dynamic batch, q_len and kv_len dims "
                                      "(one [len_q, len_k] block per sequence)")


class _ScoresToScoresOp(AttnSyntaxOp):
    """Ops that map scores to scores of the same type."""

    def scores_type(self) -> ScoresType:
        ty = self.operands[0].type
        assert isinstance(ty, ScoresType)
        return ty

    def _check_result(self) -> None:
        _check_same_type(self, self.operands[0].type, self.results[0].type, "result")


@irdl_op_definition
class BiasOp(_ScoresToScoresOp):
    """Additive bias: ALiBi (`S += slope[h] * (kv_idx - q_idx)`) or a bias tensor.

    The tensor is broadcast over `[B, H, Sq, Skv]` (each dim 1 or full). ALiBi slopes are
    the standard geometric ones of `max_bias`, or a `slopes` operand (learnable).

    ```mlir
    %s1 = attn.bias alibi %s : !attn.scores<?x16x?x?xf32>
    %s2 = attn.bias tensor %s, %b : !attn.scores<?x8x?x?xf32>, tensor<1x8x?x?xf32>
    ```
    """

    name = "attn.bias"
    input = operand_def(ScoresType)
    bias = var_operand_def(TensorType)
    slopes = opt_operand_def(TensorType)
    output = result_def(ScoresType)
    kind = opt_prop_def(StringAttr)
    max_bias = opt_prop_def(FloatAttr)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(Pure())

    KINDS: ClassVar[tuple[str, ...]] = ("alibi", "tensor")
    POSITIONAL: ClassVar[tuple[str, ...]] = ("input",)
    VARIADIC: ClassVar[str | None] = "bias"
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("slopes",)
    OPTIONS: ClassVar[tuple[Option, ...]] = (Option("max_bias", float, 8.0, doc="ALiBi: slopes 2^(-max_bias * i / H)"),)

    def verify_(self) -> None:
        self._check_result()
        b, h, sq, skv = self.scores_type().dims
        if "kind" not in self.properties:
            raise VerifyException("attn.bias: kind must be given (alibi or tensor)")
        if self.kind_name == "alibi":
            if self.bias:
                raise VerifyException("attn.bias alibi takes no bias tensor")
            if self.slopes is not None:
                vector_shape(self.slopes.type, "attn.bias slopes", h)
            return
        if len(self.bias) != 1 or self.slopes is not None:
            raise VerifyException("attn.bias tensor takes exactly one bias tensor operand")
        ty = self.bias[0].type
        if not isinstance(ty, TensorType) or len(ty.get_shape()) != 4:
            raise VerifyException(
                f"attn.bias: bias must be a rank-4 tensor broadcast over [B, H, Sq, Skv], got {ty}"
            )
        for got, full, what in zip(ty.get_shape(), (b, h, sq, skv), ("batch", "heads", "q_len", "kv_len")):
            if got != 1 and not dims_compatible(got, full):
                raise VerifyException(f"attn.bias: bias {what} dim must be 1 or {full}, got {got}")


@irdl_op_definition
class SoftcapOp(_ScoresToScoresOp):
    """Logit soft-capping `S = cap * tanh(S / cap)` (Gemma 2, Grok).

    ```mlir
    %c = attn.softcap %s {cap = 50.0} : !attn.scores<?x16x?x?xf32>
    ```
    """

    name = "attn.softcap"
    input = operand_def(ScoresType)
    output = result_def(ScoresType)
    cap = opt_prop_def(FloatAttr)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("input",)
    OPTIONS: ClassVar[tuple[Option, ...]] = (Option("cap", float, None, doc="the cap (> 0), required"),)

    def verify_(self) -> None:
        self._check_result()
        cap = self.option("cap")
        if cap is None or float(cap) <= 0:
            raise VerifyException("attn.softcap: option cap must be given and positive")


@irdl_op_definition
class MaskOp(_ScoresToScoresOp):
    """`S = keep(b, h, q_idx, kv_idx) ? S : -inf`.

    Kinds: `causal`, `sliding_window` (keep `q - left <= kv <= q + right`), `document`
    (same segment id; one `[B, S]` ids operand, or one for queries and one for keys),
    `prefix_lm` (causal, plus the first `prefix` keys are visible to all; a static option
    or a `[B]` operand), `custom` (a predicate region over `(b, h, q_idx, kv_idx, captures...)`).
    `align = "bottom_right"` shifts the diagonal by `kv_len - q_len` (causal, windows).

    ```mlir
    %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x32x?x?xf32>
    %w = attn.mask sliding_window %s {left = 4095, right = 0} : !attn.scores<?x16x?x?xf32>
    %d = attn.mask document %s, %ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
    %c = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
    ^bb0(%b: index, %h: index, %qi: index, %ki: index):
      %keep = arith.cmpi sge, %qi, %ki : index
      attn.yield %keep : i1
    }
    ```
    """

    name = "attn.mask"
    input = operand_def(ScoresType)
    args = var_operand_def()
    output = result_def(ScoresType)
    predicate = region_def()
    kind = opt_prop_def(StringAttr)
    align = opt_prop_def(StringAttr)
    left = opt_prop_def(IntegerAttr)
    right = opt_prop_def(IntegerAttr)
    prefix = opt_prop_def(IntegerAttr)
    traits = traits_def(Pure())

    KINDS: ClassVar[tuple[str, ...]] = ("causal", "sliding_window", "document", "prefix_lm", "custom")
    POSITIONAL: ClassVar[tuple[str, ...]] = ("input",)
    VARIADIC: ClassVar[str | None] = "args"
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("align", str, "top_left", ("top_left", "bottom_right")),
        Option("left", int, None, doc="sliding_window: keys visible before the query"),
        Option("right", int, None, doc="sliding_window: keys visible after the query"),
        Option("prefix", int, None, doc="prefix_lm: static prefix length"),
    )

    def verify_(self) -> None:
        self._check_result()
        kind = self.kind_name
        if "kind" not in self.properties:
            raise VerifyException("attn.mask: kind must be given")
        has_region = bool(self.predicate.blocks)
        if has_region != (kind == "custom"):
            raise VerifyException(
                "attn.mask: only the custom kind has a predicate region"
                if has_region
                else "attn.mask custom needs a predicate region"
            )
        given = {o.name for o in self.OPTIONS if o.name in self.properties}
        allowed = {
            "causal": {"align"},
            "sliding_window": {"align", "left", "right"},
            "document": set(),
            "prefix_lm": {"prefix"},
            "custom": set(),
        }[kind]
        if extra := given - allowed:
            raise VerifyException(f"attn.mask {kind} does not take option(s) {', '.join(sorted(extra))}")
        b = self.scores_type().dims[0]
        if kind in ("causal", "sliding_window") and self.args:
            raise VerifyException(f"attn.mask {kind} takes no operands")
        if kind == "sliding_window":
            if not {"left", "right"} & given:
                raise VerifyException("attn.mask sliding_window needs left and/or right")
            for side in ("left", "right"):
                if side in given and self.int_option(side) < 0:
                    raise VerifyException(f"attn.mask sliding_window: {side} must be >= 0")
        elif kind == "document":
            if len(self.args) not in (1, 2):
                raise VerifyException("attn.mask document takes one or two [B, S] segment-id tensors")
            for arg in self.args:
                shape = int_tensor(arg.type, "attn.mask document ids", 2)
                if not dims_compatible(shape[0], b):
                    raise VerifyException("attn.mask document: ids batch dim must match scores")
        elif kind == "prefix_lm":
            if ("prefix" in given) == bool(self.args):
                raise VerifyException("attn.mask prefix_lm needs either {prefix = N} or one [B] operand")
            if self.args:
                if len(self.args) != 1:
                    raise VerifyException("attn.mask prefix_lm takes one [B] prefix-length operand")
                int_tensor(self.args[0].type, "attn.mask prefix lengths", 1)
            elif self.int_option("prefix") < 0:
                raise VerifyException("attn.mask prefix_lm: prefix must be >= 0")
        elif kind == "custom":
            expected: list[Attribute] = [IndexType()] * 4 + [a.type for a in self.args]
            _check_region_args(self.predicate, expected, self.name, "custom mask")
            _check_yield(self.predicate, i1, self.name)


@irdl_op_definition
class ScoreModOp(_ScoresToScoresOp):
    """`S = f(S, b, h, q_idx, kv_idx, captures...)`: an elementwise region of arith/math ops.

    Captured tensors are region arguments, read with `tensor.extract`.

    ```mlir
    %t = attn.score_mod %s, %tab : !attn.scores<?x8x?x?xf32>, tensor<8xf32> {
    ^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index, %tb: tensor<8xf32>):
      %w = tensor.extract %tb[%h] : tensor<8xf32>
      %y = arith.mulf %x, %w : f32
      attn.yield %y : f32
    }
    ```
    """

    name = "attn.score_mod"
    input = operand_def(ScoresType)
    captures = var_operand_def()
    output = result_def(ScoresType)
    body = region_def("single_block")
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("input",)
    VARIADIC: ClassVar[str | None] = "captures"

    def verify_(self) -> None:
        self._check_result()
        expected: list[Attribute] = [f32] + [IndexType()] * 4 + [a.type for a in self.captures]
        _check_region_args(self.body, expected, self.name, "score_mod")
        _check_yield(self.body, f32, self.name)


@irdl_op_definition
class SoftmaxOp(AttnSyntaxOp):
    """Row softmax over kv; optional per-head sink logits and log-sum-exp result.

    With sinks, `P = exp(S - lse)` where `lse = log(sum(exp(S)) + exp(sink[h]))`.
    A fully masked row gives `P = 0` and `lse = -inf`.

    ```mlir
    %p, %lse = attn.softmax %s sinks %sk : !attn.scores<?x64x?x?xf32>, tensor<64xf32> -> !attn.probs<?x64x?x?xf32>, tensor<?x64x?xf32>
    ```
    """

    name = "attn.softmax"
    input = operand_def(ScoresType)
    sinks = opt_operand_def(TensorType)
    output = result_def(ProbsType)
    lse = opt_result_def(TensorType)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("input",)
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("sinks",)
    EXPLICIT_RESULTS: ClassVar[bool] = True

    def verify_(self) -> None:
        assert isinstance(self.input.type, ScoresType) and isinstance(self.output.type, ProbsType)
        dims = self.input.type.dims
        if self.output.type.dims != dims:
            raise VerifyException(f"attn.softmax: result must be !attn.probs with dims {format_dims(dims)}")
        if self.sinks is not None:
            vector_shape(self.sinks.type, "attn.softmax sinks", dims[1])
        if self.lse is not None:
            ty = self.lse.type
            if not isinstance(ty, TensorType) or ty.element_type != f32 or len(ty.get_shape()) != 3:
                raise VerifyException("attn.softmax: lse must be tensor<BxHxSqxf32>")
            for got, want in zip(ty.get_shape(), dims[:3]):
                if not dims_compatible(got, want):
                    raise VerifyException(f"attn.softmax: lse shape must be {format_dims(dims[:3])}")


@irdl_op_definition
class DropoutOp(AttnSyntaxOp):
    """Dropout on probabilities: `P * keep / (1 - p)`, keep drawn from a counter-based RNG.

    Element `(b, h, q, kv)` is kept when `u >= p`, with `u` Triton's `tl.rand(key, q * Skv + kv)`
    (Philox-4x32-10) and `key = seed + ((b * H + h) << 32)`: a pure function of the seed and
    the element's indices, so the backward regenerates the same mask.

    ```mlir
    %pd = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x32x?x?xf32>, i64
    ```
    """

    name = "attn.dropout"
    input = operand_def(ProbsType)
    seed = operand_def(IntegerType)
    output = result_def(ProbsType)
    p = opt_prop_def(FloatAttr)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("input", "seed")
    OPTIONS: ClassVar[tuple[Option, ...]] = (Option("p", float, None, doc="drop probability in [0, 1), required"),)

    def verify_(self) -> None:
        _check_same_type(self, self.input.type, self.output.type, "result")
        assert isinstance(self.seed.type, IntegerType)
        if self.seed.type.width.data != 64:
            raise VerifyException("attn.dropout: seed must be i64")
        p = self.option("p")
        if p is None or not 0.0 <= float(p) < 1.0:
            raise VerifyException("attn.dropout: option p must be given, in [0, 1)")


@irdl_op_definition
class WeightedSumOp(AttnSyntaxOp):
    """`O = P V`; V may have fewer heads (GQA) and another head dim than Q.

    ```mlir
    %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
    ```
    """

    name = "attn.weighted_sum"
    probs = operand_def(ProbsType)
    v = operand_def(TensorType)
    output = result_def(TensorType)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("probs", "v")
    EXPLICIT_RESULTS: ClassVar[bool] = True

    def verify_(self) -> None:
        assert isinstance(self.probs.type, ProbsType)
        b, h, _sq, skv = self.probs.type.dims
        bv, hv, sv, dv = qkv_shape(self.v.type, "attn.weighted_sum v")
        if h % hv:
            raise VerifyException(f"attn.weighted_sum: heads ({h}) must be a multiple of v heads ({hv})")
        if not dims_compatible(skv, sv) or not dims_compatible(b, bv):
            raise VerifyException("attn.weighted_sum: v batch/seq dims must match the probabilities")
        out = self.output.type
        assert isinstance(self.v.type, TensorType)
        if not isinstance(out, TensorType) or out.element_type != self.v.type.element_type:
            raise VerifyException("attn.weighted_sum: result must be a tensor of v's element type")
        ob, oh, osq, od = qkv_shape(out, "attn.weighted_sum result")
        for got, want in ((ob, b), (oh, h), (osq, _sq), (od, dv)):
            if not dims_compatible(got, want):
                raise VerifyException(
                    f"attn.weighted_sum: result must be {format_dims((b, h, _sq, dv))}"
                )


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Terminator of `attn.mask custom` and `attn.score_mod` regions.

    ```mlir
    attn.yield %keep : i1
    ```
    """

    name = "attn.yield"
    values = var_operand_def()
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(MaskOp, ScoreModOp), Pure()))
    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, *values: object) -> None:
        super().__init__(operands=[list(values)])


SCORE_OPS = (BiasOp, SoftcapOp, MaskOp, ScoreModOp)
"""Ops that map scores to scores, in any order between attn.scores and attn.softmax."""

Attn = Dialect(
    "attn",
    [
        RopeOp,
        QKNormOp,
        ScoresOp,
        BiasOp,
        SoftcapOp,
        MaskOp,
        ScoreModOp,
        SoftmaxOp,
        DropoutOp,
        WeightedSumOp,
        YieldOp,
        OnlineSoftmaxOp,
    ],
    [ScoresType, ProbsType, TilePlanAttr, SplitKVAttr],
)

__all__ = [
    "Attn",
    "BiasOp",
    "DropoutOp",
    "MaskOp",
    "OnlineSoftmaxOp",
    "ProbsType",
    "QKNormOp",
    "RopeOp",
    "SCORE_OPS",
    "ScoreModOp",
    "ScoresOp",
    "ScoresType",
    "SoftcapOp",
    "SoftmaxOp",
    "SplitKVAttr",
    "TilePlanAttr",
    "WeightedSumOp",
    "YieldOp",
    "DYNAMIC",
    "base",
]
