"""Elementwise float math for `TileBuilder` (the `math` dialect's ops on tiles and
scalars; `abs` also on integers).

```python
e = b.exp2(b.sub(s, m))        # math.exp2 on a [BM, BN] tile
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects import math as xmath
from xdsl.ir import Operation, SSAValue

from attnfuse.dialects.tile_types import element_type_of, is_float_type

if TYPE_CHECKING:
    from attnfuse.dialects.tile_builder import TileBuilder, Value


class MathOps:
    """The math methods of `TileBuilder`."""

    def _unary_float(
        self: TileBuilder, op: type[Operation], x: SSAValue, name: str | None
    ) -> SSAValue:
        if not is_float_type(element_type_of(x.type)):
            raise TypeError(f"{op.name} needs a float operand, got {x.type}")  # pyright: ignore
        return self._emit(op(x), name)  # pyright: ignore[reportCallIssue]

    def exp(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.ExpOp, x, name)

    def exp2(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.Exp2Op, x, name)

    def erf(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.ErfOp, x, name)

    def floor(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.FloorOp, x, name)

    def ceil(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.CeilOp, x, name)

    def log(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.LogOp, x, name)

    def log2(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.Log2Op, x, name)

    def tanh(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.TanhOp, x, name)

    def sqrt(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.SqrtOp, x, name)

    def rsqrt(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.RsqrtOp, x, name)

    def sin(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.SinOp, x, name)

    def cos(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        return self._unary_float(xmath.CosOp, x, name)

    def fma(self: TileBuilder, x: Value, y: Value, z: Value, *, name: str | None = None) -> SSAValue:
        """`x * y + z` rounded once (`math.fma`; the Triton interpreter rounds twice),
        broadcasting; floats only."""
        a, b, c = self._unify(x, y, z)
        if not is_float_type(element_type_of(a.type)):
            raise TypeError(f"math.fma needs float operands, got {a.type}")
        return self._emit(xmath.FmaOp(a, b, c), name)

    def abs(self: TileBuilder, x: SSAValue, *, name: str | None = None) -> SSAValue:
        if is_float_type(element_type_of(x.type)):
            return self._emit(xmath.AbsFOp(x), name)
        return self.maximum(x, self.neg(x), name=name)
