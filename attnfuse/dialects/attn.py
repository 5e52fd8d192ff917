"""The `attn` dialect: attention as a composition of ten building blocks.

Tensors use the `[batch, heads, seq, head_dim]` layout; batch and sequence dims may be
dynamic (`?`). Grouped-query attention is implied by head counts (`Hq % Hkv == 0`).
See docs/dialect.md for the full reference.

This module defines `attn.scores`, `attn.softmax`, `attn.dropout` and
`attn.weighted_sum`, and the dialect; the other ops live beside it and are re-exported
here: `attn.rope` and `attn.qk_norm` in `attn_qk`, the score ops and `attn.yield` in
`attn_score_ops`, `attn.online_softmax` in `attn_online`.

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

from xdsl.dialects.builtin import FloatAttr, IntegerType, TensorType, f32
from xdsl.ir import Dialect
from xdsl.irdl import (
    AttrSizedOperandSegments,
    base,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    opt_result_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn_online import OnlineSoftmaxOp, TilePlanAttr
from attnfuse.dialects.attn_paged import verify_cache_lengths, verify_paged_operands
from attnfuse.dialects.attn_split_kv import SplitKVAttr
from attnfuse.dialects.attn_syntax import AttnSyntaxOp, check_same_type
from attnfuse.dialects.attn_types import (
    DYNAMIC,
    Option,
    ProbsType,
    ScoresType,
    cu_seqlens_type,
    dims_compatible,
    format_dims,
    qkv_shape,
    vector_shape,
)
from attnfuse.dialects.attn_qk import QKNormOp, RopeOp
from attnfuse.dialects.attn_score_ops import SCORE_OPS, BiasOp, MaskOp, ScoreModOp, SoftcapOp, YieldOp

# =============================================================================== ops


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
    `block_table[b, j / page_size]` (`attnfuse.dialects.attn_paged`). With `kv_lens`
    alone K and V are a contiguous cache `[B, Hkv, capacity, D]` of which sequence `b`
    holds its first `kv_lens[b]` keys.

    ```mlir
    %s = attn.scores %q, %k {scale = 0.0625} : tensor<?x16x?x256xbf16>, tensor<?x8x?x256xbf16> -> !attn.scores<?x16x?x?xf32>
    %p = attn.scores %q1, %k1 cu_seqlens_q %cq cu_seqlens_k %ck : tensor<1x32x?x128xbf16>, tensor<1x8x?x128xbf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
    %c = attn.scores %q2, %pool block_table %bt kv_lens %lens : tensor<?x32x?x128xbf16>, tensor<?x8x16x128xbf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
    %d = attn.scores %q3, %cache kv_lens %lens : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
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
        paged = self.block_table is not None
        if not paged and not dims_compatible(bq, bk):
            raise VerifyException(f"attn.scores: batch dims differ ({bq} vs {bk})")
        assert isinstance(self.output.type, ScoresType)
        expect = (bq, hq, sq, DYNAMIC if paged else sk)
        for got, want, what in zip(self.output.type.dims, expect, ("batch", "heads", "q_len", "kv_len")):
            if not dims_compatible(got, want):
                raise VerifyException(f"attn.scores: result {what} dim {got} != {want}")
        if self.option("scale") is not None and self.float_option("scale") <= 0:
            raise VerifyException("attn.scores: scale must be positive")
        if self.kv_lens is not None and (self.cu_seqlens_q is not None or self.cu_seqlens_k is not None):
            what = "a paged KV cache (block_table)" if paged else "a KV cache with kv_lens"
            raise VerifyException(f"attn.scores: {what} and a packed batch (cu_seqlens) do not combine")
        if self.block_table is not None:
            if self.kv_lens is None:
                raise VerifyException("attn.scores: a paged KV cache (block_table) needs kv_lens")
            verify_paged_operands(self.q.type, self.k.type, self.block_table.type, self.kv_lens.type,
                                  self.output.type.dims[3])
        elif self.kv_lens is not None:
            verify_cache_lengths(self.q.type, self.kv_lens.type)
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
        check_same_type(self, self.input.type, self.output.type, "result")
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
