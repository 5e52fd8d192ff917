"""Lower the arith/math ops of `attn.mask custom` / `attn.score_mod` regions to tiles.

Each region op becomes the matching `TileBuilder` call on broadcast tiles: the index
arguments are i32 (`q_idx` a [BM, 1] tile, `kv_idx` a [1, BN] tile, `b` and `h` scalars),
and `tensor.extract` from a captured tensor becomes a gather load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects import arith, math, tensor
from xdsl.dialects.builtin import FloatAttr, IndexType, IntegerAttr, IntegerType, f32, i1, i32
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects.attn import YieldOp
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.lowering.signature import ScalarArg, TensorArg

CMPI = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]
CMPF = ["false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult", "ule", "une", "uno", "true"]
_PRED = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}


class RegionLoweringError(DiagnosticException):
    def __init__(self, op: Operation, reason: str) -> None:
        self.op = op
        super().__init__(f"cannot lower {op.name} in a region: {reason}")


def _pred_name(pred: str) -> str:
    core = pred[1:] if pred[0] in "osu" and pred not in ("eq", "ne") else pred
    if core not in _PRED:
        raise ValueError(pred)
    return _PRED[core]


def _tile_type(ty: Attribute) -> Attribute:
    return i32 if isinstance(ty, IndexType) else ty


_BINARY: dict[type[Operation], str] = {
    arith.AddfOp: "add", arith.SubfOp: "sub", arith.MulfOp: "mul", arith.DivfOp: "div",
    arith.MaximumfOp: "maximum", arith.MinimumfOp: "minimum",
    arith.AddiOp: "add", arith.SubiOp: "sub", arith.MuliOp: "mul", arith.DivSIOp: "div",
    arith.RemSIOp: "rem", arith.AndIOp: "and_", arith.OrIOp: "or_", arith.XOrIOp: "xor",
    arith.MaxSIOp: "maximum", arith.MinSIOp: "minimum",
}
_UNARY: dict[type[Operation], str] = {
    math.ExpOp: "exp", math.Exp2Op: "exp2", math.LogOp: "log", math.Log2Op: "log2",
    math.TanhOp: "tanh", math.SqrtOp: "sqrt", math.RsqrtOp: "rsqrt", math.AbsFOp: "abs",
    math.SinOp: "sin", math.CosOp: "cos", arith.NegfOp: "neg", math.ErfOp: "erf",
    math.FloorOp: "floor", math.CeilOp: "ceil",
}


def lower_region(
    b: TileBuilder,
    block: Block,
    args: Sequence[SSAValue],
    captures: Sequence[TensorArg | ScalarArg],
    valid: SSAValue,
) -> SSAValue:
    """Emit the ops of `block` with its leading args bound to `args` and the rest to
    `captures`; return the tile of the yielded value. `valid` masks gather loads."""
    return lower_region_env(b, block, args, captures, valid)[0]


def lower_region_env(
    b: TileBuilder,
    block: Block,
    args: Sequence[SSAValue],
    captures: Sequence[TensorArg | ScalarArg],
    valid: SSAValue,
) -> tuple[SSAValue, dict[SSAValue, SSAValue]]:
    """`lower_region`, also returning every region value's tile (for differentiation)."""
    env: dict[SSAValue, SSAValue] = {}
    n_fixed = len(args)
    for arg, value in zip(block.args, args):
        env[arg] = value
    captured: dict[SSAValue, TensorArg] = {}
    for arg, cap in zip(block.args[n_fixed:], captures):
        if isinstance(cap, TensorArg):
            captured[arg] = cap
        else:
            assert cap.value is not None
            env[arg] = cap.value

    def get(v: SSAValue) -> SSAValue:
        return env[v]

    for op in block.ops:
        if isinstance(op, YieldOp):
            return get(op.values[0]), env
        env[op.results[0]] = _lower_op(b, op, get, captured, valid)
    raise RegionLoweringError(block.parent_op() or block.last_op, "region has no attn.yield")  # type: ignore[arg-type]


def _lower_op(
    b: TileBuilder,
    op: Operation,
    get: Callable[[SSAValue], SSAValue],
    captured: dict[SSAValue, TensorArg],
    valid: SSAValue,
) -> SSAValue:
    name = op.results[0].name_hint if op.results else None
    if isinstance(op, arith.ConstantOp):
        value = op.value
        if isinstance(value, FloatAttr):
            return b.constant(value.value.data, _tile_type(value.type), name=name)
        if isinstance(value, IntegerAttr):
            ty = _tile_type(value.type)
            return b.constant(value.value.data, ty, name=name)
        raise RegionLoweringError(op, "only scalar constants are supported")
    if type(op) in _BINARY:
        return getattr(b, _BINARY[type(op)])(get(op.operands[0]), get(op.operands[1]), name=name)
    if type(op) in _UNARY:
        return getattr(b, _UNARY[type(op)])(get(op.operands[0]), name=name)
    if isinstance(op, arith.CmpiOp):
        pred = CMPI[op.predicate.value.data]
        if pred.startswith("u"):
            raise RegionLoweringError(op, "unsigned comparisons are not supported; use signed ones")
        return b._compare(_pred_name(pred), get(op.lhs), get(op.rhs), name)  # noqa: SLF001
    if isinstance(op, arith.CmpfOp):
        pred = CMPF[op.predicate.value.data]
        try:
            return b._compare(_pred_name(pred), get(op.lhs), get(op.rhs), name)  # noqa: SLF001
        except ValueError:
            raise RegionLoweringError(op, f"predicate {pred} is not supported") from None
    if isinstance(op, arith.SelectOp):
        return b.where(get(op.cond), get(op.lhs), get(op.rhs), name=name)
    if isinstance(op, (arith.IndexCastOp, arith.ExtSIOp, arith.TruncIOp, arith.SIToFPOp,
                       arith.FPToSIOp, arith.ExtFOp, arith.TruncFOp)):
        target = _tile_type(op.results[0].type)
        if isinstance(target, IntegerType) and target.width.data == 64:
            target = i32  # index-like arithmetic stays i32 in kernels
        return b.cast(get(op.operands[0]), target, name=name)
    if isinstance(op, math.PowFOp):
        return powf(b, get(op.lhs), get(op.rhs), name=name)
    if isinstance(op, arith.FloorDivSIOp):  # Triton's // truncates: step down when signs differ
        lhs, rhs = get(op.lhs), get(op.rhs)
        rem = b.rem(lhs, rhs)
        down = b.and_(b.ne(rem, 0), b.xor(b.lt(rem, 0), b.lt(rhs, 0)))
        return b.sub(b.div(lhs, rhs), b.where(down, 1, 0), name=name)
    if isinstance(op, tensor.ExtractOp):
        source = captured.get(op.tensor)
        if source is None or source.ptr is None:
            raise RegionLoweringError(op, "tensor.extract must read a captured tensor operand")
        offset = None
        for index, stride in zip(op.indices, source.strides):
            term = b.mul(get(index), stride)
            offset = term if offset is None else b.add(offset, term)
        assert offset is not None
        result_type = op.results[0].type
        if isinstance(offset.type, IntegerType):  # scalar index: a scalar load
            loaded = b.load(source.ptr, offset, name=name)
        else:
            loaded = b.load(source.ptr, offset, mask=valid, other=0, name=name)
        return b.cast(loaded, f32 if result_type == f32 else _tile_type(result_type))
    if op.results and op.results[0].type == i1 and isinstance(op, arith.XOrIOp):
        return b.xor(get(op.operands[0]), get(op.operands[1]), name=name)
    raise RegionLoweringError(op, "this op has no tile lowering")


def powf(b: TileBuilder, x: SSAValue, y: SSAValue, *, name: str | None = None) -> SSAValue:
    """`math.powf` with its real-number meaning: `|x|^y` as `exp2(y log2 |x|)`, negated
    for a negative base and an odd integer exponent, NaN for a negative base and a
    non-integer exponent, 1 for a zero exponent. (`exp2(y log2 x)` alone is NaN for every
    negative base, e.g. `s ** 2.0` of a negative score.)"""
    magnitude = b.exp2(b.mul(y, b.log2(b.abs(x))))
    big = b.ge(b.abs(y), 16777216.0)  # |y| >= 2^24: every such f32 is an even integer
    y_int = b.cast(b.where(big, 0.0, y), i32)  # 0 (even) when big
    integral = b.or_(b.eq(b.cast(y_int, f32), y), big)
    odd = b.ne(b.rem(y_int, 2), 0)
    negative_base = b.where(integral, b.where(odd, b.neg(magnitude), magnitude), float("nan"))
    result = b.where(b.lt(x, 0.0), negative_base, magnitude)
    return b.where(b.eq(y, 0.0), 1.0, result, name=name)
