"""`attn.online_softmax`: the streaming form of softmax + weighted_sum.

Not written by users: the `online-softmax` pass produces it from `attn.softmax`
(+ `attn.dropout`) + `attn.weighted_sum`, and `mask-tiling` records the tile plan on it.
It computes exactly what the ops it replaces compute, but states the algorithm the kernel
uses: KV is visited in blocks of `block_n` keys with a running row max `m`, a running
sum `l` and an fp32 accumulator; sink logits, when present, start the state at
`m = sink, l = 1`.

```mlir
%o, %lse = attn.online_softmax %s, %v sinks %sk {block_m = 128, block_n = 64}
    : !attn.scores<?x64x?x?xf32>, tensor<?x8x?x64xbf16>, tensor<64xf32>
    -> tensor<?x64x?x64xbf16>, tensor<?x64x?xf32>
```

The tile plan options (set by `mask-tiling`) describe which (q block, kv block) tiles
are visited and which need no mask code:

* `band_lower`/`band_upper`: every kept element satisfies
  `band_lower <= kv_idx - q_idx - diag <= band_upper`, where `diag` is 0 (`band_align =
  "top_left"`) or `kv_len - q_len` (`"bottom_right"`); a missing bound is unbounded.
* `prefix`: keys `< prefix` are also kept (prefix-lm), a static length or `-1` for the
  per-batch prefix operand of the mask.
* `band_exact = 1`: the band (plus prefix) *is* the whole mask, so tiles inside it are
  full and run without mask code.
* `block_map = "runtime"`: a data-dependent mask (document ids, non-affine predicates):
  tiles are classified empty / partial / full on the GPU at run time.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, IntegerType, StringAttr, TensorType
from xdsl.irdl import (
    AttrSizedOperandSegments,
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

from attnfuse.dialects.attn_syntax import AttnSyntaxOp
from attnfuse.dialects.attn_types import Option, ScoresType, qkv_shape, vector_shape


@irdl_op_definition
class OnlineSoftmaxOp(AttnSyntaxOp):
    """Streaming softmax + weighted sum over KV blocks (see the module docstring)."""

    name = "attn.online_softmax"
    input = operand_def(ScoresType)
    v = operand_def(TensorType)
    sinks = opt_operand_def(TensorType)
    dropout_seed = opt_operand_def(IntegerType)
    output = result_def(TensorType)
    lse = opt_result_def(TensorType)
    block_m = opt_prop_def(IntegerAttr)
    block_n = opt_prop_def(IntegerAttr)
    dropout_p = opt_prop_def(FloatAttr)
    band_lower = opt_prop_def(IntegerAttr)
    band_upper = opt_prop_def(IntegerAttr)
    band_align = opt_prop_def(StringAttr)
    band_exact = opt_prop_def(IntegerAttr)
    prefix = opt_prop_def(IntegerAttr)
    block_map = opt_prop_def(StringAttr)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("input", "v")
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("sinks", "dropout_seed")
    EXPLICIT_RESULTS: ClassVar[bool] = True
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("block_m", int, None, doc="query rows per program (set by mask-tiling)"),
        Option("block_n", int, None, doc="keys per KV block"),
        Option("dropout_p", float, 0.0, doc="dropout probability, with dropout_seed"),
        Option("band_lower", int, None, doc="lowest kept kv - q - diag"),
        Option("band_upper", int, None, doc="highest kept kv - q - diag"),
        Option("band_align", str, "top_left", ("top_left", "bottom_right")),
        Option("band_exact", int, 0, doc="1 when band + prefix is the whole mask"),
        Option("prefix", int, None, doc="keys below it are always kept; -1: operand"),
        Option("block_map", str, "none", ("none", "runtime")),
    )

    def verify_(self) -> None:
        assert isinstance(self.input.type, ScoresType)
        b, h, sq, skv = self.input.type.dims
        qkv_shape(self.v.type, "attn.online_softmax v")
        if self.sinks is not None:
            vector_shape(self.sinks.type, "attn.online_softmax sinks", h)
        if (self.dropout_seed is None) != (self.float_option("dropout_p") == 0.0):
            raise VerifyException("attn.online_softmax: dropout_p and dropout_seed go together")
        for name in ("block_m", "block_n"):
            value = self.option(name)
            if value is not None and (int(value) < 16 or int(value) & (int(value) - 1)):
                raise VerifyException(f"attn.online_softmax: {name} must be a power of two >= 16")
