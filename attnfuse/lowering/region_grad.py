"""Reverse-mode differentiation of `attn.score_mod` regions on tiles.

The region is recomputed (`lower_region_env`), then its ops are walked backwards,
accumulating adjoints with one rule per differentiable arith/math op. Integer and index
values, comparisons and `tensor.extract` carry no gradient (captured tables are
constants in the backward); an op without a rule is a clear compile error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects import arith, math, tensor
from xdsl.ir import Block, Operation, SSAValue

from attnfuse.dialects.attn import YieldOp
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.dialects.tile_types import element_type_of, is_float_type
from attnfuse.lowering.regions import RegionLoweringError, lower_region_env, powf
from attnfuse.lowering.signature import ScalarArg, TensorArg

Adjoint = Callable[[TileBuilder, Operation, dict[SSAValue, SSAValue], SSAValue], list[SSAValue | None]]
"""(builder, op, forward values, d result) -> d operand, per operand (None: no gradient)."""

LN2 = 0.6931471805599453


def _v(env: dict[SSAValue, SSAValue], op: Operation, i: int) -> SSAValue:
    return env[op.operands[i]]


RULES: dict[type[Operation], Adjoint] = {
    arith.AddfOp: lambda b, op, env, g: [g, g],
    arith.SubfOp: lambda b, op, env, g: [g, b.neg(g)],
    arith.MulfOp: lambda b, op, env, g: [b.mul(g, _v(env, op, 1)), b.mul(g, _v(env, op, 0))],
    arith.DivfOp: lambda b, op, env, g: [
        b.div(g, _v(env, op, 1)),
        b.neg(b.div(b.mul(g, env[op.results[0]]), _v(env, op, 1))),
    ],
    arith.NegfOp: lambda b, op, env, g: [b.neg(g)],
    arith.MaximumfOp: lambda b, op, env, g: [
        b.where(b.ge(_v(env, op, 0), _v(env, op, 1)), g, 0.0),
        b.where(b.ge(_v(env, op, 0), _v(env, op, 1)), 0.0, g),
    ],
    arith.MinimumfOp: lambda b, op, env, g: [
        b.where(b.le(_v(env, op, 0), _v(env, op, 1)), g, 0.0),
        b.where(b.le(_v(env, op, 0), _v(env, op, 1)), 0.0, g),
    ],
    arith.SelectOp: lambda b, op, env, g: [None, b.where(_v(env, op, 0), g, 0.0), b.where(_v(env, op, 0), 0.0, g)],
    math.ExpOp: lambda b, op, env, g: [b.mul(g, env[op.results[0]])],
    math.Exp2Op: lambda b, op, env, g: [b.mul(b.mul(g, env[op.results[0]]), LN2)],
    math.LogOp: lambda b, op, env, g: [b.div(g, _v(env, op, 0))],
    math.Log2Op: lambda b, op, env, g: [b.div(g, b.mul(_v(env, op, 0), LN2))],
    math.TanhOp: lambda b, op, env, g: [
        b.mul(g, b.sub(1.0, b.mul(env[op.results[0]], env[op.results[0]])))
    ],
    math.SqrtOp: lambda b, op, env, g: [b.div(b.mul(g, 0.5), env[op.results[0]])],
    math.RsqrtOp: lambda b, op, env, g: [
        b.mul(b.mul(g, -0.5), b.div(env[op.results[0]], _v(env, op, 0)))
    ],
    math.AbsFOp: lambda b, op, env, g: [b.where(b.ge(_v(env, op, 0), 0.0), g, b.neg(g))],
    math.SinOp: lambda b, op, env, g: [b.mul(g, b.cos(_v(env, op, 0)))],
    math.PowFOp: lambda b, op, env, g: [  # r = x^y: dr/dx = y x^(y-1), dr/dy = r ln x
        b.mul(b.mul(g, _v(env, op, 1)), powf(b, _v(env, op, 0), b.sub(_v(env, op, 1), 1.0))),
        b.where(b.eq(env[op.results[0]], 0.0), 0.0, b.mul(b.mul(g, env[op.results[0]]), b.log(_v(env, op, 0)))),
    ],
    math.CosOp: lambda b, op, env, g: [b.neg(b.mul(g, b.sin(_v(env, op, 0))))],
    math.ErfOp: lambda b, op, env, g: [  # d erf(x) = 2 / sqrt(pi) exp(-x^2)
        b.mul(g, b.mul(1.1283791670955126, b.exp(b.neg(b.mul(_v(env, op, 0), _v(env, op, 0))))))
    ],
    math.FloorOp: lambda b, op, env, g: [b.mul(g, 0.0)],  # piecewise constant
    math.CeilOp: lambda b, op, env, g: [b.mul(g, 0.0)],
    # Captured tables are constants of the backward: no gradient flows into them.
    tensor.ExtractOp: lambda b, op, env, g: [None] * len(op.operands),
    arith.ExtFOp: lambda b, op, env, g: [g],
    arith.TruncFOp: lambda b, op, env, g: [g],
}


def _is_float(value: SSAValue) -> bool:
    return is_float_type(element_type_of(value.type))


def region_backward(
    b: TileBuilder,
    block: Block,
    args: Sequence[SSAValue],
    captures: Sequence[TensorArg | ScalarArg],
    valid: SSAValue,
    d_out: SSAValue,
) -> SSAValue:
    """The gradient of a score_mod region's result with respect to its score argument."""
    _, env = lower_region_env(b, block, args, captures, valid)
    ops = [op for op in block.ops if not isinstance(op, YieldOp)]
    terminator = block.last_op
    assert isinstance(terminator, YieldOp)
    adjoint: dict[SSAValue, SSAValue] = {terminator.values[0]: d_out}
    for op in reversed(ops):
        if not op.results or op.results[0] not in adjoint:
            continue
        if not _is_float(op.results[0]) or not any(_is_float(v) for v in op.operands):
            continue  # constants, casts from integers, table reads: no gradient flows back
        rule = RULES.get(type(op))
        if rule is None:
            raise RegionLoweringError(op, "the backward has no derivative rule for it")
        for operand, grad in zip(op.operands, rule(b, op, env, adjoint[op.results[0]])):
            if grad is None or not _is_float(operand):
                continue
            adjoint[operand] = b.add(adjoint[operand], grad) if operand in adjoint else grad
    score = block.args[0]
    return adjoint.get(score, b.mul(d_out, 0.0))
