"""Trace Python `score_mod` / `mask_mod` functions into `attn` region blocks.

The functions are written as for flex_attention:

```python
def score_mod(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score - 0.1 * (q_idx - kv_idx), score)

def mask_mod(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx < 128) & (kv_idx <= q_idx)
```

`trace_region` calls the function once on `TracedValue` proxies of the region's block
arguments; every operator and supported torch function appends the matching `arith` /
`math` / `tensor.extract` op to the block. Values are f32 (the score and float
arithmetic), index (the indices and integer arithmetic) or i1 (comparisons). A Python
construct that needs a concrete value (`if`, `and`, `or`, `not`, `float()`, `math.*`)
raises a `TraceError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.dialects import arith
from xdsl.dialects import math as mathd
from xdsl.dialects import tensor
from xdsl.dialects.builtin import FloatAttr, IndexType, IntegerAttr, TensorType, f32, i1, i64
from xdsl.ir import Attribute, Block, Operation, SSAValue

from attnfuse.dialects.attn import YieldOp

__all__ = ["TraceError", "TracedValue", "trace_region"]


class TraceError(TypeError):
    """A Python construct that cannot be traced into a region."""


_FLOAT_UNARY: dict[Any, type[Operation]] = {
    torch.exp: mathd.ExpOp, torch.exp2: mathd.Exp2Op, torch.log: mathd.LogOp,
    torch.log2: mathd.Log2Op, torch.tanh: mathd.TanhOp, torch.sqrt: mathd.SqrtOp,
    torch.rsqrt: mathd.RsqrtOp, torch.sin: mathd.SinOp, torch.cos: mathd.CosOp,
}
_OTHER_FUNCTIONS = (torch.where, torch.abs, torch.maximum, torch.minimum, torch.pow)
_CMP = {"lt": ("slt", "olt"), "le": ("sle", "ole"), "gt": ("sgt", "ogt"), "ge": ("sge", "oge"),
        "eq": ("eq", "oeq"), "ne": ("ne", "une")}
_NEEDS_VALUE = (
    "Python `if`, `and`, `or`, `not` and chained comparisons need a concrete value, but a traced "
    "value is only known when the kernel runs; use torch.where(cond, a, b) and the operators & | ~"
)


class TracedValue:
    """A value of a region being traced: arithmetic on it records ops in the region."""

    __slots__ = ("_tracer", "ssa")
    __hash__ = None  # type: ignore[assignment]  # == builds a comparison

    def __init__(self, tracer: _Tracer, ssa: SSAValue) -> None:
        self._tracer = tracer
        self.ssa = ssa

    @property
    def kind(self) -> str:
        """"float", "index", "bool" or "tensor" (a captured tensor)."""
        ty = self.ssa.type
        if isinstance(ty, TensorType):
            return "tensor"
        return "index" if isinstance(ty, IndexType) else "bool" if ty == i1 else "float"

    def __repr__(self) -> str:
        return f"<traced {self.kind} value of {self._tracer.what}>"

    # -- arithmetic
    def __add__(self, other: object) -> TracedValue:
        return self._tracer.arith(self, other, arith.AddfOp, arith.AddiOp, "+")

    def __radd__(self, other: object) -> TracedValue:
        return self._tracer.arith(other, self, arith.AddfOp, arith.AddiOp, "+")

    def __sub__(self, other: object) -> TracedValue:
        return self._tracer.arith(self, other, arith.SubfOp, arith.SubiOp, "-")

    def __rsub__(self, other: object) -> TracedValue:
        return self._tracer.arith(other, self, arith.SubfOp, arith.SubiOp, "-")

    def __mul__(self, other: object) -> TracedValue:
        return self._tracer.arith(self, other, arith.MulfOp, arith.MuliOp, "*")

    def __rmul__(self, other: object) -> TracedValue:
        return self._tracer.arith(other, self, arith.MulfOp, arith.MuliOp, "*")

    def __truediv__(self, other: object) -> TracedValue:
        t = self._tracer
        return t.arith(t.to_float(self, "/"), other, arith.DivfOp, None, "/")

    def __rtruediv__(self, other: object) -> TracedValue:
        t = self._tracer
        return t.arith(other, t.to_float(self, "/"), arith.DivfOp, None, "/")

    def __floordiv__(self, other: object) -> TracedValue:
        return self._tracer.floordiv(self, other)

    def __rfloordiv__(self, other: object) -> TracedValue:
        return self._tracer.floordiv(other, self)

    def __mod__(self, other: object) -> TracedValue:
        return self._tracer.mod(self, other)

    def __rmod__(self, other: object) -> TracedValue:
        return self._tracer.mod(other, self)

    def __pow__(self, other: object) -> TracedValue:
        return self._tracer.pow(self, other)

    def __rpow__(self, other: object) -> TracedValue:
        return self._tracer.pow(other, self)

    def __neg__(self) -> TracedValue:
        return self._tracer.neg(self)

    def __pos__(self) -> TracedValue:
        return self

    def __abs__(self) -> TracedValue:
        return self._tracer.abs(self)

    # -- comparisons
    def __lt__(self, other: object) -> TracedValue:
        return self._tracer.compare(self, other, "lt")

    def __le__(self, other: object) -> TracedValue:
        return self._tracer.compare(self, other, "le")

    def __gt__(self, other: object) -> TracedValue:
        return self._tracer.compare(self, other, "gt")

    def __ge__(self, other: object) -> TracedValue:
        return self._tracer.compare(self, other, "ge")

    def __eq__(self, other: object) -> TracedValue:  # type: ignore[override]
        return self._tracer.compare(self, other, "eq")

    def __ne__(self, other: object) -> TracedValue:  # type: ignore[override]
        return self._tracer.compare(self, other, "ne")

    # -- logic (booleans) and bits (indices)
    def __and__(self, other: object) -> TracedValue:
        return self._tracer.logic(self, other, arith.AndIOp, "&")

    def __rand__(self, other: object) -> TracedValue:
        return self._tracer.logic(other, self, arith.AndIOp, "&")

    def __or__(self, other: object) -> TracedValue:
        return self._tracer.logic(self, other, arith.OrIOp, "|")

    def __ror__(self, other: object) -> TracedValue:
        return self._tracer.logic(other, self, arith.OrIOp, "|")

    def __xor__(self, other: object) -> TracedValue:
        return self._tracer.logic(self, other, arith.XOrIOp, "^")

    def __rxor__(self, other: object) -> TracedValue:
        return self._tracer.logic(other, self, arith.XOrIOp, "^")

    def __invert__(self) -> TracedValue:
        return self._tracer.logic(self, True if self.kind == "bool" else -1, arith.XOrIOp, "~")

    # -- captured tensors
    def __getitem__(self, index: object) -> TracedValue:
        return self._tracer.extract(self, index)

    # -- what needs a concrete value
    def __bool__(self) -> bool:
        raise TraceError(f"{self._tracer.what}: {_NEEDS_VALUE}")

    def __float__(self) -> float:
        raise TraceError(f"{self._tracer.what}: float() / math.* functions need a concrete value; "
                         "use torch functions (torch.exp, torch.tanh, ...) on traced values")

    def __int__(self) -> int:
        raise TraceError(f"{self._tracer.what}: int() needs a concrete value; index arithmetic "
                         "(+ - * // %) stays traced")

    __index__ = __int__

    def __iter__(self) -> Any:
        raise TraceError(f"{self._tracer.what}: iterating over a traced value is not supported")

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        tracer = next((a._tracer for a in [*args, *(kwargs or {}).values()] if isinstance(a, TracedValue)), None)
        if tracer is None:
            raise TraceError(f"torch.{getattr(func, '__name__', func)}: traced values inside lists or tuples "
                             "are not supported")
        return tracer.torch_function(func, args, kwargs or {})


class _Tracer:
    """Records the ops of one region block."""

    def __init__(self, block: Block, what: str) -> None:
        self.block = block
        self.what = what
        self.constants: dict[tuple[object, Attribute], TracedValue] = {}

    def emit(self, op: Operation) -> TracedValue:
        self.block.add_op(op)
        return TracedValue(self, op.results[0])

    def constant(self, attr: IntegerAttr | FloatAttr) -> TracedValue:
        key = (repr(attr.value.data), attr.type)
        if key not in self.constants:
            self.constants[key] = self.emit(arith.ConstantOp(attr))
        return self.constants[key]

    def value(self, x: object, construct: str) -> TracedValue:
        """A traced value of `x`: a traced value of this region, or a Python constant."""
        if isinstance(x, TracedValue):
            if x._tracer is not self:  # noqa: SLF001
                raise TraceError(f"{self.what}: a traced value of {x._tracer.what} is used here")  # noqa: SLF001
            return x
        if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.requires_grad:
            x = x.item()
        if isinstance(x, bool):
            return self.constant(IntegerAttr(int(x), i1))
        if isinstance(x, int):
            return self.constant(IntegerAttr(x, IndexType()))
        if isinstance(x, float):
            return self.constant(FloatAttr(x, f32))
        raise TraceError(f"{self.what}: {construct} with a {type(x).__name__} operand is not supported "
                         "(use traced values, Python numbers or captured tensors)")

    def to_float(self, x: object, construct: str) -> TracedValue:
        v = self.value(float(x) if isinstance(x, int) and not isinstance(x, bool) else x, construct)
        if v.kind == "float":
            return v
        if v.kind != "index":
            raise TraceError(f"{self.what}: {construct} needs numbers, got a {v.kind} value "
                             "(use torch.where(cond, a, b) to choose by a condition)")
        wide = self.emit(arith.IndexCastOp(v.ssa, i64))
        return self.emit(arith.SIToFPOp(wide.ssa, f32))

    def operands(self, a: object, b: object, construct: str) -> tuple[TracedValue, TracedValue]:
        """Two numbers of one kind: index if both are integers, else float."""
        x, y = self.value(a, construct), self.value(b, construct)
        if x.kind == y.kind == "index":
            return x, y
        return self.to_float(x, construct), self.to_float(y, construct)

    def arith(self, a: object, b: object, float_op: type[Operation], int_op: type[Operation] | None,
              construct: str) -> TracedValue:
        x, y = self.operands(a, b, construct)
        op = float_op if x.kind == "float" else int_op
        assert op is not None
        return self.emit(op(x.ssa, y.ssa))  # type: ignore[call-arg]

    def ints(self, a: object, b: object, construct: str) -> tuple[TracedValue, TracedValue]:
        x, y = self.value(a, construct), self.value(b, construct)
        if x.kind != "index" or y.kind != "index":
            raise TraceError(f"{self.what}: {construct} is supported on integers (indices) only, "
                             f"got {x.kind} and {y.kind}")
        return x, y

    def floordiv(self, a: object, b: object) -> TracedValue:
        """Python's floor division: truncating division, one less when the remainder is
        not zero and its sign differs from the divisor's."""
        x, y = self.ints(a, b, "//")
        quotient = self.emit(arith.DivSIOp(x.ssa, y.ssa))
        return self.select(self.wrong_sign(self.emit(arith.RemSIOp(x.ssa, y.ssa)), b), quotient - 1, quotient)

    def mod(self, a: object, b: object) -> TracedValue:
        """Python's modulo: the remainder takes the divisor's sign."""
        x, y = self.ints(a, b, "%")
        rem = self.emit(arith.RemSIOp(x.ssa, y.ssa))
        return self.select(self.wrong_sign(rem, b), rem + y, rem)

    def wrong_sign(self, rem: TracedValue, divisor: object) -> TracedValue:
        """Whether a truncated remainder is non-zero with the other sign than the divisor."""
        if isinstance(divisor, int) and divisor > 0:
            return rem < 0
        return (rem != 0) & ((rem < 0) ^ (divisor < 0))

    def pow(self, a: object, b: object) -> TracedValue:
        """`a ** n` for a Python int 1 <= n <= 8 as products (exact, any sign of `a`); else
        `math.powf`, which the kernels compute as exp2(b * log2(a)): for a > 0 only."""
        if isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 8:
            x = self.value(a, "**")
            result = x
            for _ in range(b - 1):
                result = self.arith(result, x, arith.MulfOp, arith.MuliOp, "**")
            return result
        x, y = self.to_float(a, "**"), self.to_float(b, "**")
        return self.emit(mathd.PowFOp(x.ssa, y.ssa))

    def neg(self, a: object) -> TracedValue:
        x = self.value(a, "-")
        if x.kind == "float":
            return self.emit(arith.NegfOp(x.ssa))
        return self.arith(0, x, arith.SubfOp, arith.SubiOp, "-")

    def abs(self, a: object) -> TracedValue:
        x = self.value(a, "abs()")
        if x.kind == "float":
            return self.emit(mathd.AbsFOp(x.ssa))
        return self.arith(x, self.neg(x), arith.MaximumfOp, arith.MaxSIOp, "abs()")

    def compare(self, a: object, b: object, predicate: str) -> TracedValue:
        x, y = self.value(a, "a comparison"), self.value(b, "a comparison")
        if x.kind == y.kind == "bool" and predicate in ("eq", "ne"):
            differ = self.emit(arith.XOrIOp(x.ssa, y.ssa))
            return differ if predicate == "ne" else ~differ
        x, y = self.operands(x, y, "a comparison")
        signed, ordered = _CMP[predicate]
        if x.kind == "index":
            return self.emit(arith.CmpiOp(x.ssa, y.ssa, signed))
        return self.emit(arith.CmpfOp(x.ssa, y.ssa, ordered))

    def logic(self, a: object, b: object, op: type[Operation], construct: str) -> TracedValue:
        x, y = self.value(a, construct), self.value(b, construct)
        if x.kind != y.kind or x.kind not in ("bool", "index"):
            raise TraceError(f"{self.what}: {construct} combines two booleans (comparisons) or two "
                             f"integers, got {x.kind} and {y.kind}")
        return self.emit(op(x.ssa, y.ssa))  # type: ignore[call-arg]

    def select(self, cond: object, a: object, b: object) -> TracedValue:
        c = self.value(cond, "torch.where")
        if c.kind != "bool":
            raise TraceError(f"{self.what}: torch.where needs a boolean condition, got a {c.kind} value")
        x, y = self.value(a, "torch.where"), self.value(b, "torch.where")
        if x.kind != y.kind:
            x, y = self.operands(x, y, "torch.where")
        return self.emit(arith.SelectOp(c.ssa, x.ssa, y.ssa))

    def extract(self, table: TracedValue, index: object) -> TracedValue:
        ty = table.ssa.type
        if not isinstance(ty, TensorType):
            raise TraceError(f"{self.what}: indexing ([]) a {table.kind} value; only captured tensors "
                             "can be indexed")
        indices = index if isinstance(index, tuple) else (index,)
        if len(indices) != len(ty.get_shape()):
            raise TraceError(f"{self.what}: a rank-{len(ty.get_shape())} captured tensor needs "
                             f"{len(ty.get_shape())} indices, got {len(indices)}")
        values = [self.value(i, "indexing a captured tensor") for i in indices]
        if any(v.kind != "index" for v in values):
            raise TraceError(f"{self.what}: captured tensors are indexed by integers (indices), got "
                             f"{', '.join(v.kind for v in values)}")
        ssa = [v.ssa for v in values]
        return self.emit(tensor.ExtractOp(table.ssa, ssa, ty.element_type))

    def torch_function(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> TracedValue:
        name = getattr(func, "__name__", str(func))
        if kwargs and (func in _FLOAT_UNARY or func in _OTHER_FUNCTIONS):
            raise TraceError(f"{self.what}: torch.{name} with keyword arguments is not supported")
        if func is torch.where and len(args) == 3:
            return self.select(*args)
        if func in _FLOAT_UNARY and len(args) == 1:
            return self.emit(_FLOAT_UNARY[func](self.to_float(args[0], f"torch.{name}").ssa))
        if func is torch.abs and len(args) == 1:
            return self.abs(args[0])
        if func in (torch.maximum, torch.minimum) and len(args) == 2:
            pair = (arith.MaximumfOp, arith.MaxSIOp) if func is torch.maximum else (arith.MinimumfOp, arith.MinSIOp)
            return self.arith(args[0], args[1], *pair, f"torch.{name}")
        if func is torch.pow and len(args) == 2:
            return self.pow(*args)
        known = "where, exp, exp2, log, log2, tanh, sqrt, rsqrt, sin, cos, abs, maximum, minimum, pow"
        raise TraceError(f"{self.what}: torch.{name} is not supported in a traced region (supported: {known})")


def trace_region(fn: Callable[..., Any], arg_types: Sequence[Attribute], captures: Sequence[tuple[str, Attribute]],
                 result: str, what: str) -> Block:
    """A block with `arg_types` then one argument per capture, whose body is `fn` traced on
    them (captures passed by keyword) and an `attn.yield` of its result, a "float"
    (score_mod) or a "bool" (mask_mod)."""
    block = Block(arg_types=[*arg_types, *(ty for _, ty in captures)])
    tracer = _Tracer(block, what)
    values = [TracedValue(tracer, a) for a in block.args]
    named = {name: v for (name, _), v in zip(captures, values[len(arg_types):])}
    out = fn(*values[: len(arg_types)], **named)
    if result == "float":
        if isinstance(out, bool) or (isinstance(out, TracedValue) and out.kind == "bool"):
            raise TraceError(f"{what} must return a number (the new score), got a boolean")
        value = tracer.to_float(out, "the returned value")
    else:
        value = tracer.value(out, "the returned value")
        if value.kind != "bool":
            raise TraceError(f"{what} must return a boolean (keep the score or not), got a {value.kind} value")
    block.add_op(YieldOp(value.ssa))
    return block

