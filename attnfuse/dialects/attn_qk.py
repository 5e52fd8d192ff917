"""The Q/K side of the `attn` dialect: `attn.rope` and `attn.qk_norm`, the transforms
applied to queries and keys before `attn.scores` (each in place, or in a pre-kernel:
the `placement` option that `rope-fusion` fills in).

```mlir
%qr = attn.rope %q {theta = 500000.0} : tensor<?x32x?x128xbf16>
%kn = attn.qk_norm %k weight %wk {eps = 1e-06} : tensor<?x8x?x128xbf16>, tensor<128xf32>
```
"""

from __future__ import annotations


import math
from typing import ClassVar

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, StringAttr, TensorType
from xdsl.irdl import irdl_op_definition, operand_def, opt_operand_def, opt_prop_def, result_def, traits_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn_syntax import AttnSyntaxOp, check_same_type
from attnfuse.dialects.attn_types import F32_MAX, Option, int_tensor, qkv_shape, vector_shape

PLACEMENT = Option(
    "placement",
    str,
    "auto",
    ("auto", "kernel", "prekernel"),
    "where the transform runs: chosen by rope-fusion, inside the attention kernel, "
    "or in a generated pre-kernel",
)


@irdl_op_definition
class RopeOp(AttnSyntaxOp):
    """Rotary position embedding of Q or K over head_dim.

    Positions are `index + offset`, or an explicit `positions` operand (`[S]` or `[B, S]`);
    with `align = "bottom_right"` (Q only) the queries are the last of the keys they
    attend to: query `i` of sequence `b` is at `kv_len(b) - Sq + i + offset`, `kv_len(b)`
    being the scores op's `Skv` or `kv_lens[b]` (a decode step's new tokens).

    ```mlir
    %qr = attn.rope %q {theta = 500000.0, scaling = "llama3", factor = 8.0} : tensor<?x32x?x128xbf16>
    %kr = attn.rope %k positions %pos {style = "interleaved"} : tensor<?x8x?x64xf16>, tensor<?x?xi32>
    %qd = attn.rope %q {theta = 500000.0, align = "bottom_right"} : tensor<?x32x?x128xbf16>
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
    align = opt_prop_def(StringAttr)
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
        Option("align", str, "top_left", ("top_left", "bottom_right"),
               "positions from the sequence's start, or (Q) ending where the keys end"),
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

    def bottom_right(self) -> bool:
        """Whether positions end where the keys end (`align = "bottom_right"`)."""
        return self.str_option("align") == "bottom_right"

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
        check_same_type(self, self.input.type, self.output.type, "result")
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
            if self.bottom_right():
                raise VerifyException('attn.rope: give either positions or align = "bottom_right", not both')


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
        check_same_type(self, self.input.type, self.output.type, "result")
        if self.weight is not None:
            vector_shape(self.weight.type, "attn.qk_norm weight", d)
        if self.float_option("eps") < 0:
            raise VerifyException("attn.qk_norm: eps must be >= 0")


__all__ = ["PLACEMENT", "QKNormOp", "RopeOp"]
