"""The score ops of the `attn` dialect: maps from scores to scores between
`attn.scores` and `attn.softmax`, in any order (`SCORE_OPS`): `attn.bias`,
`attn.softcap`, `attn.mask` and `attn.score_mod`, and `attn.yield`, the terminator of
their regions.

```mlir
%b = attn.bias alibi %s : !attn.scores<?x16x?x?xf32>
%m = attn.mask causal %b : !attn.scores<?x16x?x?xf32>
```
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import FloatAttr, IndexType, IntegerAttr, StringAttr, TensorType, f32, i1
from xdsl.ir import Attribute, Region
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import HasParent, IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn_syntax import AttnSyntaxOp, check_same_type
from attnfuse.dialects.attn_types import Option, ScoresType, dims_compatible, int_tensor, vector_shape

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


class _ScoresToScoresOp(AttnSyntaxOp):
    """Ops that map scores to scores of the same type."""

    def scores_type(self) -> ScoresType:
        ty = self.operands[0].type
        assert isinstance(ty, ScoresType)
        return ty

    def _check_result(self) -> None:
        check_same_type(self, self.operands[0].type, self.results[0].type, "result")


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


__all__ = ["SCORE_OPS", "BiasOp", "MaskOp", "ScoreModOp", "SoftcapOp", "YieldOp"]
