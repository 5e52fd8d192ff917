"""Vectorised evaluation of `attn.mask custom` and `attn.score_mod` regions.

A region is a scalar function of one score element; the reference evaluates it once over
whole broadcast tensors (`[B, H, Sq, Skv]` after broadcasting the block arguments):

* float values (any width) are float64 tensors: `arith.extf` / `arith.truncf` are the
  identity, so float arithmetic is exact float64 math (the kernels compute in fp32);
* integer and index values are int64 tensors holding the signed value, wrapped to the
  type's width after every op (index is 64-bit); i1 values are bool tensors (signed
  value -1 for true, as in MLIR: `sitofp`/`extsi` of true give -1, `extui` gives 1);
* `tensor.extract %t[%i, ...]` gathers from the captured tensor by the index tensors
  (out-of-range indices are an error);
* division or remainder by zero is undefined in MLIR; here it yields 0 in that lane, so
  a `select` that guards the divisor evaluates cleanly.

Everything is differentiable through torch where the math is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from xdsl.dialects import arith, math, tensor
from xdsl.dialects.builtin import FloatAttr, IndexType, IntegerAttr, IntegerType
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from attnfuse.dialects.attn import YieldOp

__all__ = ["RegionEvaluationError", "evaluate_region", "supported_ops"]


class RegionEvaluationError(NotImplementedError):
    """An op the reference cannot evaluate inside an attn region (or a bad index)."""


RegionImpl = Callable[[Operation, list[torch.Tensor]], torch.Tensor]
_IMPLS: dict[type[Operation], RegionImpl] = {}


def impl(*op_types: type[Operation]) -> Callable[[RegionImpl], RegionImpl]:
    """Register a vectorised implementation for region ops of the given classes."""

    def register(fn: RegionImpl) -> RegionImpl:
        for op_type in op_types:
            _IMPLS[op_type] = fn
        return fn

    return register


def supported_ops() -> list[str]:
    """Names of the ops allowed in attn regions, sorted."""
    return sorted(t.name for t in _IMPLS)


# ------------------------------------------------------------------------- integers


def _width(ty: Attribute) -> int:
    if isinstance(ty, IndexType):
        return 64
    if isinstance(ty, IntegerType):
        return ty.width.data
    raise RegionEvaluationError(f"expected an integer or index type, got {ty}")


def _signed(x: torch.Tensor) -> torch.Tensor:
    """The signed int64 value of an integer tensor (i1 true is -1)."""
    return -x.to(torch.int64) if x.dtype == torch.bool else x


def _unsigned_key(x: torch.Tensor, ty: Attribute) -> torch.Tensor:
    """An int64 tensor ordered like the unsigned value of x."""
    if x.dtype == torch.bool:
        return x.to(torch.int64)
    width = _width(ty)
    if width == 64:
        return x ^ torch.iinfo(torch.int64).min
    return x & ((1 << width) - 1)


def _wrap(x: torch.Tensor, ty: Attribute) -> torch.Tensor:
    """Wrap an int64 tensor to the signed range of `ty` (bool for i1)."""
    width = _width(ty)
    if width == 1:
        return (x & 1).to(torch.bool)
    if width >= 64:
        return x
    half = 1 << (width - 1)
    return ((x + half) & ((1 << width) - 1)) - half


def _result_type(op: Operation) -> Attribute:
    return op.results[0].type


def _int_binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> RegionImpl:
    def run(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
        return _wrap(fn(_signed(args[0]), _signed(args[1])), _result_type(op))

    return run


def _safe_divisor(b: torch.Tensor) -> torch.Tensor:
    return torch.where(b == 0, torch.ones_like(b), b)


def _int_division(mode: str) -> RegionImpl:
    def run(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
        a, b = _signed(args[0]), _signed(args[1])
        safe = _safe_divisor(b)
        out = torch.fmod(a, safe) if mode == "rem" else torch.div(a, safe, rounding_mode=mode)
        return _wrap(torch.where(b == 0, torch.zeros_like(out), out), _result_type(op))

    return run


_IMPLS[arith.AddiOp] = _int_binary(torch.add)
_IMPLS[arith.SubiOp] = _int_binary(torch.sub)
_IMPLS[arith.MuliOp] = _int_binary(torch.mul)
_IMPLS[arith.MaxSIOp] = _int_binary(torch.maximum)
_IMPLS[arith.MinSIOp] = _int_binary(torch.minimum)
_IMPLS[arith.DivSIOp] = _int_division("trunc")
_IMPLS[arith.FloorDivSIOp] = _int_division("floor")
_IMPLS[arith.RemSIOp] = _int_division("rem")


def _bitwise(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> RegionImpl:
    def run(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
        return fn(args[0], args[1])  # bool stays bool; sign-extended ints stay wrapped

    return run


_IMPLS[arith.AndIOp] = _bitwise(torch.bitwise_and)
_IMPLS[arith.OrIOp] = _bitwise(torch.bitwise_or)
_IMPLS[arith.XOrIOp] = _bitwise(torch.bitwise_xor)

_CMPI: dict[int, tuple[bool, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
    0: (False, torch.eq),
    1: (False, torch.ne),
    2: (False, torch.lt),
    3: (False, torch.le),
    4: (False, torch.gt),
    5: (False, torch.ge),
    6: (True, torch.lt),
    7: (True, torch.le),
    8: (True, torch.gt),
    9: (True, torch.ge),
}


@impl(arith.CmpiOp)
def _cmpi(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
    assert isinstance(op, arith.CmpiOp)
    unsigned, fn = _CMPI[op.predicate.value.data]
    ty = op.lhs.type
    if unsigned:
        return fn(_unsigned_key(args[0], ty), _unsigned_key(args[1], ty))
    return fn(_signed(args[0]), _signed(args[1]))


@impl(arith.IndexCastOp, arith.ExtSIOp, arith.TruncIOp)
def _int_cast(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
    return _wrap(_signed(args[0]), _result_type(op))


@impl(arith.ExtUIOp)
def _extui(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
    source = op.operands[0].type
    value = (
        args[0].to(torch.int64)
        if args[0].dtype == torch.bool
        else args[0] & ((1 << _width(source)) - 1)
    )
    return _wrap(value, _result_type(op))


@impl(arith.SIToFPOp)
def _sitofp(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
    return _signed(args[0]).to(torch.float64)


# --------------------------------------------------------------------------- floats


def _float_op(fn: Callable[..., torch.Tensor]) -> RegionImpl:
    def run(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
        return fn(*args)

    return run


_FLOAT_OPS: dict[type[Operation], Callable[..., torch.Tensor]] = {
    arith.AddfOp: torch.add,
    arith.SubfOp: torch.sub,
    arith.MulfOp: torch.mul,
    arith.DivfOp: torch.div,
    arith.NegfOp: torch.neg,
    arith.MaximumfOp: torch.maximum,
    arith.MinimumfOp: torch.minimum,
    arith.ExtFOp: lambda x: x,
    arith.TruncFOp: lambda x: x,
    math.ExpOp: torch.exp,
    math.Exp2Op: torch.exp2,
    math.LogOp: torch.log,
    math.Log2Op: torch.log2,
    math.TanhOp: torch.tanh,
    math.SqrtOp: torch.sqrt,
    math.RsqrtOp: torch.rsqrt,
    math.AbsFOp: torch.abs,
    math.PowFOp: torch.pow,
    math.SinOp: torch.sin,
    math.CosOp: torch.cos,
    math.ErfOp: torch.erf,
    math.FloorOp: torch.floor,
    math.CeilOp: torch.ceil,
}
for _op_type, _fn in _FLOAT_OPS.items():
    _IMPLS[_op_type] = _float_op(_fn)


def _cmpf_fn(pred: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ordered = ~(torch.isnan(a) | torch.isnan(b))
    base = {
        1: torch.eq, 2: torch.gt, 3: torch.ge, 4: torch.lt, 5: torch.le, 6: torch.ne,
        8: torch.eq, 9: torch.gt, 10: torch.ge, 11: torch.lt, 12: torch.le, 13: torch.ne,
    }  # fmt: skip
    if pred == 0:
        return torch.zeros_like(ordered)
    if pred == 15:
        return torch.ones_like(ordered)
    if pred == 7:
        return ordered
    if pred == 14:
        return ~ordered
    result = base[pred](a, b)
    return result & ordered if pred <= 6 else result | ~ordered


@impl(arith.CmpfOp)
def _cmpf(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
    assert isinstance(op, arith.CmpfOp)
    return _cmpf_fn(op.predicate.value.data, args[0], args[1])


# ---------------------------------------------------------------------------- other


@impl(arith.SelectOp)
def _select(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
    return torch.where(args[0], args[1], args[2])


@impl(arith.ConstantOp)
def _constant(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
    assert isinstance(op, arith.ConstantOp)
    value = op.value
    if isinstance(value, FloatAttr):
        return torch.tensor(float(value.value.data), dtype=torch.float64)
    if isinstance(value, IntegerAttr):
        raw = torch.tensor(int(value.value.data), dtype=torch.int64)
        return _wrap(raw, _result_type(op))
    raise RegionEvaluationError(f"arith.constant: only scalar constants are supported, got {value}")


@impl(tensor.ExtractOp)
def _extract(op: Operation, args: list[torch.Tensor]) -> torch.Tensor:
    table, indices = args[0], [_signed(i) for i in args[1:]]
    if table.dim() != len(indices):
        raise RegionEvaluationError(
            f"tensor.extract: {len(indices)} indices for a rank-{table.dim()} tensor"
        )
    for dim, index in enumerate(indices):
        if bool(((index < 0) | (index >= table.shape[dim])).any()):
            raise RegionEvaluationError(
                f"tensor.extract: index out of range for dim {dim} of size {table.shape[dim]}"
            )
    if not indices:
        return table
    return table[tuple(indices)]


# ------------------------------------------------------------------------- walking


def _region_block(region: Region | Block) -> Block:
    if isinstance(region, Block):
        return region
    if len(region.blocks) != 1:
        raise RegionEvaluationError("attn regions must have exactly one block")
    return region.block


def evaluate_region(
    region: Region | Block, args: Sequence[torch.Tensor], where: str = "region"
) -> list[torch.Tensor]:
    """Evaluate a single-block region on broadcastable tensors; return the yielded values."""
    block = _region_block(region)
    if len(args) != len(block.args):
        raise RegionEvaluationError(
            f"{where}: expected {len(block.args)} arguments, got {len(args)}"
        )
    env: dict[SSAValue, torch.Tensor] = dict(zip(block.args, args))
    for op in block.ops:
        if isinstance(op, YieldOp):
            return [env[v] for v in op.values]
        fn = _IMPLS.get(type(op))
        if fn is None:
            raise RegionEvaluationError(
                f"reference: cannot evaluate '{op.name}' in {where} "
                f"(supported: {', '.join(supported_ops())})"
            )
        env[op.results[0]] = fn(op, [env[v] for v in op.operands])
    raise RegionEvaluationError(f"{where}: region does not end with attn.yield")
