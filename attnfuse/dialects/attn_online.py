"""`attn.online_softmax`: the streaming form of softmax + weighted_sum, and its tile plan.

Not written by users: the `online-softmax` pass produces it from `attn.softmax`
(+ `attn.dropout`) + `attn.weighted_sum`, `mask-tiling` records a `#attn.tile_plan`
on it, and `split-kv` may record a `#attn.split_kv` (`attn_split_kv.py`). It computes exactly what the ops it replaces compute, but states the algorithm the
kernel uses: KV is visited in blocks of `block_n` keys with a running row max `m`, a
running sum `l` and an fp32 accumulator; sink logits, when present, start the state at
`m = sink, l = 1`.

```mlir
%o, %lse = attn.online_softmax %s, %v sinks %sk {tile_plan = #attn.tile_plan<128x64>}
    : !attn.scores<?x64x?x?xf32>, tensor<?x8x?x64xbf16>, tensor<64xf32>
    -> tensor<?x64x?x64xbf16>, tensor<?x64x?xf32>
```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import BoolAttr, FloatAttr, IntAttr, IntegerType, NoneAttr, StringAttr, TensorType
from xdsl.ir import Attribute, ParametrizedAttribute
from xdsl.irdl import (
    AttrSizedOperandSegments,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    opt_result_def,
    result_def,
    traits_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn_split_kv import SplitKVAttr
from attnfuse.dialects.attn_syntax import AttnSyntaxOp
from attnfuse.dialects.attn_types import Option, ScoresType, qkv_shape, vector_shape

_ALIGNS = ("top_left", "bottom_right")
_CLAUSES = ("band", "exact", "prefix", "runtime_block_map")


def _opt_int(value: int | None) -> IntAttr | NoneAttr:
    return NoneAttr() if value is None else IntAttr(value)


def _parameters(
    block_m: int, block_n: int, lower: int | None, upper: int | None, align: str, exact: bool,
    prefix: int | None, runtime_block_map: bool,
) -> tuple[Attribute, ...]:
    """The parameters of a `TilePlanAttr`, in order."""
    return (
        IntAttr(block_m), IntAttr(block_n), _opt_int(lower), _opt_int(upper), StringAttr(align),
        BoolAttr.from_bool(exact), _opt_int(prefix), BoolAttr.from_bool(runtime_block_map),
    )


def _int_or_none(attr: IntAttr | NoneAttr) -> int | None:
    return attr.data if isinstance(attr, IntAttr) else None


def _parse_bound(parser: AttrParser) -> int | None:
    """A band bound: an integer, or `?` for an unbounded side."""
    if parser.parse_optional_punctuation("?") is not None:
        return None
    return parser.parse_integer(allow_boolean=False)


def _format_bound(value: int | None) -> str:
    return "?" if value is None else str(value)


@irdl_attr_definition
class TilePlanAttr(ParametrizedAttribute):
    """
    Which (q block, kv block) tiles the kernels of an `attn.online_softmax` visit, and
    which run without mask code (set by `mask-tiling`).

    * `block_m x block_n`: query rows x keys of a tile;
    * `band [lower, upper]`: every kept element satisfies
      `lower <= kv_idx - q_idx - diag <= upper` (`?`: unbounded), where `diag` is 0, or
      `kv_len - q_len` when `bottom_right` follows;
    * `prefix`: keys below it are also kept (prefix-lm), `-1` for the mask's operand;
    * `exact`: the band (plus prefix) *is* the whole mask, so tiles inside it are full;
    * `runtime_block_map`: a data-dependent mask (document ids, non-affine predicates):
      tiles are classified empty / partial / full on the GPU at run time.

    ```mlir
    #attn.tile_plan<128x64>
    #attn.tile_plan<128x64, band [-4095, 0], exact>
    #attn.tile_plan<64x32, band [?, 0] bottom_right, exact, prefix 100>
    #attn.tile_plan<128x64, band [?, 0], runtime_block_map>
    ```
    """

    name = "attn.tile_plan"

    block_m: IntAttr
    block_n: IntAttr
    band_lower: IntAttr | NoneAttr
    band_upper: IntAttr | NoneAttr
    band_align: StringAttr
    exact: BoolAttr
    prefix: IntAttr | NoneAttr
    runtime_block_map: BoolAttr

    def __init__(
        self,
        block_m: int,
        block_n: int,
        *,
        lower: int | None = None,
        upper: int | None = None,
        align: str = "top_left",
        exact: bool = False,
        prefix: int | None = None,
        runtime_block_map: bool = False,
    ) -> None:
        super().__init__(*_parameters(block_m, block_n, lower, upper, align, exact, prefix, runtime_block_map))

    def verify(self) -> None:
        for name, size in (("block_m", self.block_m.data), ("block_n", self.block_n.data)):
            if size < 16 or size & (size - 1):
                raise VerifyException(f"#attn.tile_plan: {name} must be a power of two >= 16, got {size}")
        if self.band_align.data not in _ALIGNS:
            raise VerifyException(f"#attn.tile_plan: band alignment must be one of {', '.join(_ALIGNS)}")

    # ------------------------------------------------------------------ accessors

    def get_band(self) -> tuple[int | None, int | None]:
        """(lowest, highest) kept `kv_idx - q_idx - diag`; None: unbounded."""
        return _int_or_none(self.band_lower), _int_or_none(self.band_upper)

    def is_bottom_right(self) -> bool:
        """Whether `diag` is `kv_len - q_len` (else 0)."""
        return self.band_align.data == "bottom_right"

    def get_prefix(self) -> int | None:
        return _int_or_none(self.prefix)

    def is_exact(self) -> bool:
        return bool(self.exact.value.data)

    def has_runtime_block_map(self) -> bool:
        return bool(self.runtime_block_map.value.data)

    # ------------------------------------------------------------------ syntax

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            block_m = parser.parse_shape_dimension(allow_dynamic=False)
            parser.parse_shape_delimiter()
            block_n = parser.parse_shape_dimension(allow_dynamic=False)
            lower = upper = prefix = None
            align = "top_left"
            given: set[str] = set()
            while parser.parse_optional_punctuation(",") is not None:
                start = parser.pos
                clause = parser.parse_keyword_in(_CLAUSES, " in #attn.tile_plan")
                if clause in given:
                    parser.raise_error(f"'{clause}' given twice", start, parser.pos)
                given.add(clause)
                if clause == "band":
                    parser.parse_punctuation("[")
                    lower = _parse_bound(parser)
                    parser.parse_punctuation(",")
                    upper = _parse_bound(parser)
                    parser.parse_punctuation("]")
                    align = parser.parse_optional_keyword_in(_ALIGNS) or "top_left"
                elif clause == "prefix":
                    prefix = parser.parse_integer(allow_boolean=False)
        exact, runtime_block_map = "exact" in given, "runtime_block_map" in given
        return _parameters(block_m, block_n, lower, upper, align, exact, prefix, runtime_block_map)

    def print_parameters(self, printer: Printer) -> None:
        clauses = [f"{self.block_m.data}x{self.block_n.data}"]
        lower, upper = self.get_band()
        if (lower, upper) != (None, None) or self.is_bottom_right():
            band = f"band [{_format_bound(lower)}, {_format_bound(upper)}]"
            clauses.append(band + (" bottom_right" if self.is_bottom_right() else ""))
        if self.is_exact():
            clauses.append("exact")
        if (prefix := self.get_prefix()) is not None:
            clauses.append(f"prefix {prefix}")
        if self.has_runtime_block_map():
            clauses.append("runtime_block_map")
        with printer.in_angle_brackets():
            printer.print_string(", ".join(clauses))


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
    dropout_p = opt_prop_def(FloatAttr)
    tile_plan = opt_prop_def(TilePlanAttr)
    split_kv = opt_prop_def(SplitKVAttr)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(Pure())

    POSITIONAL: ClassVar[tuple[str, ...]] = ("input", "v")
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("sinks", "dropout_seed")
    EXPLICIT_RESULTS: ClassVar[bool] = True
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("dropout_p", float, 0.0, doc="dropout probability, with dropout_seed"),
        Option("tile_plan", TilePlanAttr, None, doc="set by mask-tiling"),
        Option("split_kv", SplitKVAttr, None, doc="set by split-kv"),
    )

    @property
    def plan(self) -> TilePlanAttr:
        """The tile plan (`mask-tiling` must have run)."""
        assert self.tile_plan is not None, "attn.online_softmax has no tile plan (run mask-tiling)"
        return self.tile_plan

    def verify_(self) -> None:
        assert isinstance(self.input.type, ScoresType)
        b, h, sq, skv = self.input.type.dims
        qkv_shape(self.v.type, "attn.online_softmax v")
        if self.sinks is not None:
            vector_shape(self.sinks.type, "attn.online_softmax sinks", h)
        if (self.dropout_seed is None) != (self.float_option("dropout_p") == 0.0):
            raise VerifyException("attn.online_softmax: dropout_p and dropout_seed go together")
