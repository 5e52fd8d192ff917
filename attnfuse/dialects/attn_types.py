"""Types and shared syntax helpers of the `attn` dialect.

`!attn.scores<BxHxSqxSkvxf32>` is the type of attention logits (before softmax),
`!attn.probs<BxHxSqxSkvxf32>` the type of attention probabilities (after softmax).
Keeping them apart from `tensor` makes misuse unrepresentable: a mask cannot be applied
to a query tensor, and `attn.weighted_sum` only accepts probabilities.

```mlir
%s = attn.scores %q, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
```
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    f32,
    f64,
    i64,
)
from xdsl.ir import Attribute, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

DYNAMIC = DYNAMIC_INDEX
"""Marker of a dynamic (`?`) dimension: xDSL's own (`TensorType.get_shape()` gives it for `?`)."""
F32_MAX = 3.4028234663852886e38
"""The largest finite f32: float options become f32 constants in the kernels."""
I32_MAX = 2**31 - 1
"""The largest static dim: kernels compute sizes and indices in i32."""
MAX_HEADS = 65535
"""The most heads: CUDA's limit on the grid's y axis, where kernels put batch x heads."""
MAX_HEAD_DIM = 1 << 16
"""The largest head dim: kernels hold [rows >= 16, head_dim] tiles, and Triton caps a
block at 2^20 elements."""

FLOAT_TYPES = (Float16Type, BFloat16Type, Float32Type)


class _LogitsShapeType(ParametrizedAttribute, TypeAttribute):
    """Base of the rank-4 `[batch, heads, q_len, kv_len]` logits types."""

    shape: ArrayAttr[IntAttr]
    element_type: Attribute

    def __init__(self, shape: Sequence[int], element_type: Attribute = f32):
        super().__init__(ArrayAttr(IntAttr(d) for d in shape), element_type)

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(d.data for d in self.shape.data)

    def verify(self) -> None:
        if len(self.shape.data) != 4:
            raise VerifyException(
                f"{self.name} must have 4 dims [batch, heads, q_len, kv_len], "
                f"got {len(self.shape.data)}"
            )
        if not isinstance(self.element_type, Float32Type):
            raise VerifyException(f"{self.name} element type must be f32")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            start = parser.pos
            dims, element_type = parser.parse_ranked_shape()
            # Checked here too (not only in verify) so the error points at the type.
            if len(dims) != 4 or not isinstance(element_type, Float32Type):
                parser.raise_error(
                    f"{cls.name} must be <BxHxSqxSkvxf32> (4 dims, f32)", start, parser.pos
                )
        return (ArrayAttr(IntAttr(DYNAMIC if d < 0 else d) for d in dims), element_type)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            dims = ("?" if d == DYNAMIC else str(d) for d in self.dims)
            printer.print_string("x".join(dims) + "x")
            printer.print_attribute(self.element_type)


@irdl_attr_definition
class ScoresType(_LogitsShapeType):
    """Attention logits `S[b, h, q, kv]` (fp32), before softmax."""

    name = "attn.scores"
    # Redeclared here: the dataclass `__eq__`/`__hash__` xDSL generates only see fields of
    # the decorated class, so without them every ScoresType compared equal to every other.
    shape: ArrayAttr[IntAttr]
    element_type: Attribute


@irdl_attr_definition
class ProbsType(_LogitsShapeType):
    """Attention probabilities `P[b, h, q, kv]` (fp32), after softmax."""

    name = "attn.probs"
    # Redeclared here: the dataclass `__eq__`/`__hash__` xDSL generates only see fields of
    # the decorated class, so without them every ProbsType compared equal to every other.
    shape: ArrayAttr[IntAttr]
    element_type: Attribute


# --------------------------------------------------------------------------- shapes


def format_dims(dims: Sequence[int]) -> str:
    """`[?, 8, ?, 64]`: a shape for messages, dynamic dims as `?`."""
    return "[" + ", ".join("?" if d == DYNAMIC else str(d) for d in dims) + "]"


def dims_compatible(a: int, b: int) -> bool:
    """Two dims agree when equal or when either is dynamic."""
    return a == b or a == DYNAMIC or b == DYNAMIC


def merge_dim(a: int, b: int) -> int:
    return b if a == DYNAMIC else a


def qkv_shape(value_type: Attribute, what: str) -> tuple[int, int, int, int]:
    """Check a `[batch, heads, seq, head_dim]` float tensor type; return its shape."""
    if not isinstance(value_type, TensorType):
        raise VerifyException(f"{what} must be a tensor, got {value_type}")
    shape = tuple(value_type.get_shape())
    if len(shape) != 4:
        raise VerifyException(
            f"{what} must be rank 4 [batch, heads, seq, head_dim], got rank {len(shape)}"
        )
    if not isinstance(value_type.element_type, FLOAT_TYPES):
        raise VerifyException(
            f"{what} element type must be f16, bf16 or f32, got {value_type.element_type}"
        )
    for name, d in (("heads", shape[1]), ("head_dim", shape[3])):
        if d == DYNAMIC:
            raise VerifyException(f"{what} {name} dim must be static")
        if d < 1:
            raise VerifyException(f"{what} {name} dim must be positive, got {d}")
    for name, d in zip(("batch", "heads", "seq", "head_dim"), shape):
        if d > I32_MAX:
            raise VerifyException(f"{what} {name} dim {d} is larger than {I32_MAX}")
    if shape[1] > MAX_HEADS:
        raise VerifyException(
            f"{what} heads {shape[1]} is more than {MAX_HEADS} (kernels launch batch x "
            "heads programs on the grid's y axis)"
        )
    if shape[3] > MAX_HEAD_DIM:
        raise VerifyException(
            f"{what} head_dim {shape[3]} is larger than {MAX_HEAD_DIM} (a 16-row tile "
            "of it must fit Triton's 2^20-element block)"
        )
    return shape[0], shape[1], shape[2], shape[3]


def vector_shape(value_type: Attribute, what: str, length: int) -> None:
    """Check a rank-1 float tensor of the given length (per-head or per-dim params)."""
    if not isinstance(value_type, TensorType) or len(value_type.get_shape()) != 1:
        raise VerifyException(f"{what} must be a rank-1 tensor<{length}xf32>, got {value_type}")
    if not isinstance(value_type.element_type, (*FLOAT_TYPES, Float64Type)):
        raise VerifyException(f"{what} must have a float element type")
    if not dims_compatible(value_type.get_shape()[0], length):
        raise VerifyException(
            f"{what} must have {length} elements, got {value_type.get_shape()[0]}"
        )


def int_tensor(value_type: Attribute, what: str, rank: int) -> tuple[int, ...]:
    if (
        not isinstance(value_type, TensorType)
        or len(value_type.get_shape()) != rank
        or not isinstance(value_type.element_type, IntegerType)
    ):
        raise VerifyException(f"{what} must be a rank-{rank} integer tensor, got {value_type}")
    return tuple(value_type.get_shape())


def cu_seqlens_type(value_type: Attribute, what: str) -> None:
    """Check the type of cumulative sequence lengths: `tensor<?xi32>` (`N + 1` entries)."""
    if (
        not isinstance(value_type, TensorType)
        or len(value_type.get_shape()) != 1
        or not isinstance(value_type.element_type, IntegerType)
        or value_type.element_type.width.data != 32
    ):
        raise VerifyException(f"{what} must be tensor<?xi32> (cumulative sequence lengths), got {value_type}")
    if value_type.get_shape()[0] == 0:
        raise VerifyException(f"{what} needs at least one entry (N + 1 for N sequences)")


# --------------------------------------------------------------------------- options


OptionValue = float | int | str | Attribute
"""The value of an option: a Python number or string, or an attribute."""


@dataclass(frozen=True)
class Option:
    """One `{key = value}` option of an attn op: stored as a property when given."""

    name: str
    kind: type[float] | type[int] | type[str] | type[Attribute]
    """A Python value kind, or an attribute class (written in full: `#attn.tile_plan<...>`)."""
    default: float | int | str | None
    choices: tuple[str, ...] = ()
    doc: str = ""

    def to_attr(self, value: OptionValue) -> Attribute:
        if isinstance(value, Attribute):
            return value
        if self.kind is float:
            return FloatAttr(float(value), f64)
        if self.kind is int:
            return IntegerAttr(int(value), i64)
        return StringAttr(str(value))


def option_value(attr: Attribute) -> OptionValue:
    if isinstance(attr, FloatAttr):
        return float(attr.value.data)
    if isinstance(attr, IntegerAttr):
        return int(attr.value.data)
    if isinstance(attr, StringAttr):
        return attr.data
    return attr


def format_option_value(value: OptionValue) -> str:
    if isinstance(value, Attribute):
        return str(value)
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        text = repr(value)  # shortest exact form; MLIR floats need a '.' before 'e'
        if "e" in text and "." not in text:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    return str(value)


def parse_options(parser: Parser, op_name: str, options: Sequence[Option]) -> dict[str, Attribute]:
    """Parse `{key = value, ...}`, checking keys, value kinds and choices."""
    by_name = {o.name: o for o in options}
    result: dict[str, Attribute] = {}
    if parser.parse_optional_punctuation("{") is None:
        return result
    if parser.parse_optional_punctuation("}") is not None:
        return result
    while True:
        start = parser.pos
        key = parser.parse_optional_identifier()
        if key is None:
            key = parser.parse_optional_str_literal()
        if key is None:
            parser.raise_error("expected an option name")
        option = by_name.get(key)
        if option is None:
            known = ", ".join(by_name) or "none"
            parser.raise_error(
                f"unknown option '{key}' for {op_name} (known options: {known})",
                start,
                parser.pos,
            )
        if key in result:
            parser.raise_error(f"option '{key}' given twice", start, parser.pos)
        parser.parse_punctuation("=")
        value_start = parser.pos
        value: OptionValue | None
        if option.kind not in (float, int, str):
            value = parser.parse_attribute()
            if not isinstance(value, option.kind):
                parser.raise_error(
                    f"option '{key}' expects #{option.kind.name}<...>", value_start, parser.pos
                )
        elif option.kind is str:
            value = parser.parse_optional_str_literal()
            if value is None:
                value = parser.parse_optional_identifier()
            if value is None:
                parser.raise_error(f"option '{key}' expects a string")
            if option.choices and value not in option.choices:
                parser.raise_error(
                    f"option '{key}' must be one of {', '.join(option.choices)}, got '{value}'",
                    value_start,
                    parser.pos,
                )
        else:
            negative = parser.parse_optional_punctuation("-") is not None
            number = parser.parse_optional_number()
            if number is None:
                parser.raise_error(f"option '{key}' expects a number")
            if parser.parse_optional_punctuation(":") is not None:
                parser.parse_type()  # tolerate `1.0 : f64` spelled out
            if option.kind is int and not isinstance(number, int):
                parser.raise_error(
                    f"option '{key}' expects an integer, got {number}", value_start, parser.pos
                )
            value = -number if negative else number
            if isinstance(value, float) and not math.isfinite(value):
                parser.raise_error(f"option '{key}' must be finite", value_start, parser.pos)
            if isinstance(value, float) and abs(value) > F32_MAX:
                parser.raise_error(
                    f"option '{key}' is out of the f32 range (|x| <= {F32_MAX:.7g})",
                    value_start,
                    parser.pos,
                )
            if isinstance(value, int) and not -(2**63) <= value < 2**63:
                parser.raise_error(
                    f"option '{key}' is out of the i64 range", value_start, parser.pos
                )
        result[key] = option.to_attr(value)
        if parser.parse_optional_punctuation("}") is not None:
            return result
        if parser.parse_optional_punctuation(",") is None:
            parser.raise_error(
                f"expected ',' or '}}' after option '{key}' (floats are written like 1.0e-05)"
            )


def print_options(printer: Printer, values: Sequence[tuple[str, OptionValue]]) -> None:
    if not values:
        return
    body = ", ".join(f"{k} = {format_option_value(v)}" for k, v in values)
    printer.print_string(" {" + body + "}")
