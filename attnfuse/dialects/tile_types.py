"""
Types, attributes and type helpers of the `tile` dialect.

A tile-level value is either a *scalar* (a builtin integer or float type) or a
*tile*: a builtin `tensor` with a static shape whose dimensions are powers of two
(Triton's block shape rule). Global memory is reached through `!tile.ptr<T>`.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerType,
    Signedness,
    TensorType,
    f32,
    i1,
    i32,
    i64,
)
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import (
    Attribute,
    ParametrizedAttribute,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import irdl_attr_definition
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

MAX_TILE_NUMEL = 1 << 20
"""Triton's limit on the number of elements of one block (`TRITON_MAX_TENSOR_NUMEL`)."""


@irdl_attr_definition
class PtrType(ParametrizedAttribute, TypeAttribute):
    """
    A pointer into a global buffer whose elements have type `pointee`.

    ```mlir
    %q: !tile.ptr<bf16>
    ```
    """

    name = "tile.ptr"

    pointee: Attribute

    def __init__(self, pointee: Attribute):
        super().__init__(pointee)

    def verify(self) -> None:
        if not is_element_type(self.pointee):
            raise VerifyException(
                f"!tile.ptr pointee must be an integer or float element type, "
                f"got {self.pointee}"
            )


class ReduceKind(StrEnum):
    """The combining function of `tile.reduce`."""

    MAX = "max"
    MIN = "min"
    SUM = "sum"


@irdl_attr_definition
class ReduceKindAttr(EnumAttribute[ReduceKind], SpacedOpaqueSyntaxAttribute):
    """Generic form `#tile<reduce_kind max>`; printed as `max` inside `tile.reduce`."""

    name = "tile.reduce_kind"


class CmpPredicate(StrEnum):
    """
    Predicates of `tile.cmp`. Integers compare signed; floats compare ordered,
    except `ne`, which is unordered (true when either side is NaN), exactly as the
    Python/Triton operators `<`, `<=`, `>`, `>=`, `==`, `!=` do.
    """

    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"


@irdl_attr_definition
class CmpPredicateAttr(EnumAttribute[CmpPredicate], SpacedOpaqueSyntaxAttribute):
    """Generic form `#tile<cmp_predicate lt>`; printed as `lt` inside `tile.cmp`."""

    name = "tile.cmp_predicate"


# ---------------------------------------------------------------------------
# Type helpers shared by the verifiers, the builder and the emitter.
# ---------------------------------------------------------------------------

_INT_WIDTHS = (1, 8, 16, 32, 64)


def is_int_type(t: Attribute) -> bool:
    """A signless integer of a width Triton knows (i1, i8, i16, i32, i64)."""
    return (
        isinstance(t, IntegerType)
        and t.width.data in _INT_WIDTHS
        and t.signedness.data == Signedness.SIGNLESS
    )


def is_float_type(t: Attribute) -> bool:
    return isinstance(t, Float16Type | BFloat16Type | Float32Type | Float64Type)


def is_element_type(t: Attribute) -> bool:
    """Scalars a tile can hold: i1..i64, f16, bf16, f32, f64 (and `index`)."""
    return is_int_type(t) or is_float_type(t) or isinstance(t, IndexType)


def is_tile(t: Attribute) -> bool:
    return isinstance(t, TensorType)


def is_scalar(t: Attribute) -> bool:
    return is_element_type(t)


def shape_of(t: Attribute) -> tuple[int, ...]:
    """The tile shape of a value type; `()` for a scalar."""
    if isinstance(t, TensorType):
        return t.get_shape()
    return ()


def element_type_of(t: Attribute) -> Attribute:
    """The element type of a tile, or the scalar type itself."""
    if isinstance(t, TensorType):
        return t.element_type
    return t


def tile_type(shape: Sequence[int], element_type: Attribute) -> Attribute:
    """`tensor<shape x element_type>`, or `element_type` itself when `shape == ()`."""
    if len(shape) == 0:
        return element_type
    return TensorType(element_type, shape)


def bit_width(t: Attribute) -> int:
    """The bit width of an element type (`index` counts as 64)."""
    t = element_type_of(t)
    if isinstance(t, IntegerType):
        return t.width.data
    if isinstance(t, IndexType | Float64Type):
        return 64
    if isinstance(t, Float32Type):
        return 32
    if isinstance(t, Float16Type | BFloat16Type):
        return 16
    raise ValueError(f"no bit width for {t}")


def verify_tile_shape(t: Attribute, what: str) -> None:
    """A tile must be static, non-empty, power-of-two sized and not too large."""
    if not isinstance(t, TensorType):
        return
    shape = t.get_shape()
    if len(shape) == 0:
        raise VerifyException(f"{what}: 0-d tiles are not allowed, use a scalar type")
    numel = 1
    for dim in shape:
        if dim <= 0 or dim & (dim - 1) != 0:
            raise VerifyException(
                f"{what}: tile dimensions must be static powers of two, got {t}"
            )
        numel *= dim
    if numel > MAX_TILE_NUMEL:
        raise VerifyException(
            f"{what}: tile {t} has more than {MAX_TILE_NUMEL} elements"
        )
    if not is_element_type(t.element_type):
        raise VerifyException(f"{what}: unsupported tile element type in {t}")


def expect_int(t: Attribute, what: str) -> None:
    if not is_int_type(element_type_of(t)) or element_type_of(t) == IntegerType(1):
        raise VerifyException(f"{what} must be i8..i64 (scalar or tile), got {t}")


def expect_scalar(t: Attribute, what: str) -> None:
    if isinstance(t, TensorType) or not is_element_type(t):
        raise VerifyException(f"{what} must be a scalar, got {t}")


def expect_tile(t: Attribute, what: str) -> TensorType[Attribute]:
    if not isinstance(t, TensorType):
        raise VerifyException(f"{what} must be a tile (tensor), got {t}")
    return t


Literal = int | float | bool
Value = SSAValue | Literal
"""An operand of `TileBuilder` methods: an SSA value or a Python literal."""


def literal_type(value: Literal) -> Attribute:
    """The type a Python literal becomes: i1, i32 (or i64 when out of range), f32."""
    if isinstance(value, bool):
        return i1
    if isinstance(value, int):
        return i32 if -(2**31) <= value < 2**31 else i64
    return f32


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The NumPy broadcast of `shapes` (`()` is a scalar)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for shape in shapes:
        for i, dim in enumerate(shape, start=rank - len(shape)):
            if dim != 1 and out[i] not in (1, dim):
                raise ValueError(
                    f"shapes {[tuple(s) for s in shapes]} do not broadcast"
                )
            out[i] = dim if dim != 1 else out[i]
    return tuple(out)
