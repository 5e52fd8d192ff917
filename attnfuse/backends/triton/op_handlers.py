"""
Triton spellings of every op the emitter knows, one handler per op (or op family),
registered in `source._HANDLERS` with `@_emits`: arith and math, scf, then the tile
dialect. Importing `attnfuse.backends.triton.emitter` registers them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects import arith, scf
from xdsl.dialects import math as xmath
from xdsl.dialects.builtin import BFloat16Type, Float32Type, IntegerType
from xdsl.ir import Attribute, Operation, SSAValue

from attnfuse.backends.triton.metadata import tl_dtype
from attnfuse.backends.triton.source import (
    _ARITH_CMPF,
    _ARITH_CMPI,
    _BINARY_CALLS,
    _CASTS,
    _CDIV,
    _CMP_OPERATORS,
    _MATH_CALLS,
    _OPERATORS,
    _REDUCE_COMBINERS,
    TritonEmitter,
    _emits,
    _literal,
    _shape_text,
    _splat_value,
)
from attnfuse.dialects import tile
from attnfuse.dialects.tile import FLATTEN
from attnfuse.dialects.tile_types import bit_width, element_type_of, shape_of


# ---------------------------------------------------------------------------
# Handlers: arith and math
# ---------------------------------------------------------------------------


def _is_bf16(t: Attribute) -> bool:
    return isinstance(element_type_of(t), BFloat16Type)


def _full(shape: Sequence[int], value: str, t: Attribute) -> str:
    """`tl.full`; bf16 goes through f32 (the interpreter has no bf16 constants)."""
    if _is_bf16(t):
        return (
            f"tl.cast(tl.full({_shape_text(shape)}, {value}, tl.float32), tl.bfloat16)"
        )
    return f"tl.full({_shape_text(shape)}, {value}, {tl_dtype(t)})"


def _compute(
    e: TritonEmitter,
    op: Operation,
    operands: Sequence[SSAValue],
    build: Callable[..., str],
) -> None:
    """Assign `build(*operand_exprs)` to the result of `op`. bf16 is computed in f32
    and rounded back: the Triton interpreter stores bf16 as uint16 and has no bf16
    arithmetic (`TritonEmitter.native_bf16` emitters skip the round trip)."""
    bf16 = not e.native_bf16 and any(_is_bf16(v.type) for v in operands)
    args = [
        f"tl.cast({e.expr(v)}, tl.float32)"
        if bf16 and _is_bf16(v.type) and not e.is_literal(v)
        else e.expr(v)
        for v in operands
    ]
    text = build(*args)
    if bf16 and _is_bf16(op.results[0].type):
        text = f"tl.cast({text}, tl.bfloat16)"
    e.assign(op, text)


@_emits(arith.ConstantOp)
def _constant(e: TritonEmitter, op: arith.ConstantOp) -> None:
    if op.result in e.inlined:
        return
    value = _splat_value(op)
    if value is None:
        raise NotImplementedError("only scalar and splat constants can be emitted")
    t = op.result.type
    e.assign(op, _full(shape_of(t), _literal(value, element_type_of(t)), t))


@_emits(*_OPERATORS)
def _operator(e: TritonEmitter, op: Operation) -> None:
    symbol = _OPERATORS[type(op)]
    _compute(e, op, op.operands, lambda a, b: f"{a} {symbol} {b}")


def _at_least(value: SSAValue, bound: int) -> bool:
    """Whether `value` is provably >= `bound` (0 or 1): a constant, a program id or count."""
    owner = value.owner
    if isinstance(owner, arith.ConstantOp):
        splat = _splat_value(owner)
        return splat is not None and splat >= bound
    return isinstance(owner, tile.NumProgramsOp) or (isinstance(owner, tile.ProgramIdOp) and bound <= 0)


@_emits(*_BINARY_CALLS)
def _binary_call(e: TritonEmitter, op: Operation) -> None:
    form = _BINARY_CALLS[type(op)]
    if isinstance(op, arith.CeilDivSIOp) and _at_least(op.lhs, 0) and _at_least(op.rhs, 1):
        form = _CDIV
    _compute(e, op, op.operands, form.format)


@_emits(arith.CmpiOp, arith.CmpfOp, tile.CmpOp)
def _compare(e: TritonEmitter, op: arith.CmpiOp | arith.CmpfOp | tile.CmpOp) -> None:
    if isinstance(op, tile.CmpOp):
        pred = op.predicate.data.value
    else:
        names = _ARITH_CMPI if isinstance(op, arith.CmpiOp) else _ARITH_CMPF
        pred = names[op.predicate.value.data]
    if pred not in _CMP_OPERATORS:
        raise NotImplementedError(f"{op.name} predicate {pred} has no Triton operator")
    symbol = _CMP_OPERATORS[pred]
    _compute(e, op, op.operands, lambda a, b: f"{a} {symbol} {b}")


@_emits(arith.SelectOp, tile.WhereOp)
def _select(e: TritonEmitter, op: arith.SelectOp | tile.WhereOp) -> None:
    _compute(e, op, op.operands, lambda c, a, b: f"tl.where({c}, {a}, {b})")


@_emits(arith.NegfOp)
def _negf(e: TritonEmitter, op: arith.NegfOp) -> None:
    _compute(e, op, op.operands, lambda a: f"-{a}")


@_emits(*_CASTS)
def _cast(e: TritonEmitter, op: Operation) -> None:
    (src,) = op.operands
    src_elem, dst = element_type_of(src.type), op.results[0].type
    is_bool = src_elem == IntegerType(1)
    if isinstance(op, arith.ExtUIOp | arith.UIToFPOp) and not is_bool:
        raise NotImplementedError(f"{op.name} is only supported from i1")
    x = e.expr(src)
    # The interpreter converts bf16 only to and from f32: route other pairs via f32.
    via_f32 = (_is_bf16(src_elem) or _is_bf16(dst)) and Float32Type() not in (
        src_elem,
        element_type_of(dst),
    )
    if via_f32:
        x = f"tl.cast({x}, tl.float32)"
    text = f"tl.cast({x}, {tl_dtype(dst)})"
    if isinstance(op, arith.ExtSIOp) and is_bool:  # sign-extending true gives -1
        text = "-" + text
    e.assign(op, text)


def _f32_math(e: TritonEmitter, op: Operation, fn: Callable[[str], str]) -> None:
    """Apply `fn` in f32 (or f64); f16/bf16 operands are widened and rounded back."""
    x = e.expr(op.operands[0])
    t = op.results[0].type
    if bit_width(t) >= 32:
        e.assign(op, fn(x))
    else:
        e.assign(op, f"tl.cast({fn(f'tl.cast({x}, tl.float32)')}, {tl_dtype(t)})")


@_emits(*_MATH_CALLS)
def _math_call(e: TritonEmitter, op: Operation) -> None:
    _f32_math(e, op, lambda x: f"{_MATH_CALLS[type(op)]}({x})")


@_emits(xmath.SqrtOp)
def _sqrt(e: TritonEmitter, op: xmath.SqrtOp) -> None:
    fn = "tl.sqrt" if bit_width(op.result.type) == 64 else "tl.sqrt_rn"
    _f32_math(e, op, lambda x: f"{fn}({x})")


@_emits(xmath.TanhOp)
def _tanh(e: TritonEmitter, op: xmath.TanhOp) -> None:
    # exp overflows to inf for large x (-> 1) and underflows to 0 for very negative x
    # (-> -1): no NaN anywhere, unlike (e^x - e^-x) / (e^x + e^-x).
    _f32_math(e, op, lambda x: f"1.0 - 2.0 / (tl.exp(2.0 * {x}) + 1.0)")


@_emits(xmath.AbsFOp)
def _absf(e: TritonEmitter, op: xmath.AbsFOp) -> None:
    _compute(e, op, op.operands, lambda a: f"tl.abs({a})")


@_emits(xmath.FmaOp)
def _fma(e: TritonEmitter, op: xmath.FmaOp) -> None:
    _compute(e, op, op.operands, lambda a, b, c: f"tl.fma({a}, {b}, {c})")


# ---------------------------------------------------------------------------
# Handlers: scf
# ---------------------------------------------------------------------------


@_emits(scf.ForOp)
def _for(e: TritonEmitter, op: scf.ForOp) -> None:
    body = op.body.block
    for arg, init, result in zip(body.args[1:], op.iter_args, op.results):
        owner = init.owner
        reuse = (
            isinstance(owner, Operation)
            and owner.parent_block() is op.parent_block()
            and init.has_one_use()
            and init not in e.inlined
        )
        if reuse:
            e.names[arg] = e.name(init)
        else:
            e.names[arg] = e.fresh(arg.name_hint or init.name_hint)
            e.line(f"{e.names[arg]} = {e.expr(init)}")
        e.names[result] = e.names[arg]
    iv = e.name(body.args[0])
    bounds = f"{e.expr(op.lb)}, {e.expr(op.ub)}, {e.expr(op.step)}"
    if FLATTEN in op.attributes:
        e.line(f"for {iv} in tl.range({bounds}, flatten=True):")
    else:
        e.line(f"for {iv} in range({bounds}):")
    e.depth += 1
    e.block(body.ops)
    e.depth -= 1


@_emits(scf.IfOp)
def _if(e: TritonEmitter, op: scf.IfOp) -> None:
    for result in op.results:
        e.name(result)
    e.line(f"if {e.expr(op.cond)}:")
    e.depth += 1
    e.block(op.true_region.block.ops)
    e.depth -= 1
    else_ops = op.false_region.block.ops if op.false_region.blocks else ()
    if op.results or any(not isinstance(o, scf.YieldOp) for o in else_ops):
        e.line("else:")
        e.depth += 1
        e.block(else_ops)
        e.depth -= 1


@_emits(scf.YieldOp)
def _yield(e: TritonEmitter, op: scf.YieldOp) -> None:
    parent = op.parent_op()
    if isinstance(parent, scf.ForOp):
        targets = [e.names[a] for a in parent.body.block.args[1:]]
    else:
        assert parent is not None
        targets = [e.name(r) for r in parent.results]
    pairs = [(t, e.expr(v)) for t, v in zip(targets, op.operands) if t != e.expr(v)]
    if pairs:
        lhs = ", ".join(t for t, _ in pairs)
        rhs = ", ".join(v for _, v in pairs)
        e.line(f"{lhs} = {rhs}")


@_emits(tile.ReturnOp)
def _return(e: TritonEmitter, op: tile.ReturnOp) -> None:
    pass


# ---------------------------------------------------------------------------
# Handlers: tile
# ---------------------------------------------------------------------------


@_emits(tile.ProgramIdOp)
def _program_id(e: TritonEmitter, op: tile.ProgramIdOp) -> None:
    e.assign(op, f"tl.program_id({op.axis.value.data})")


@_emits(tile.NumProgramsOp)
def _num_programs(e: TritonEmitter, op: tile.NumProgramsOp) -> None:
    e.assign(op, f"tl.num_programs({op.axis.value.data})")


@_emits(tile.ArangeOp)
def _arange(e: TritonEmitter, op: tile.ArangeOp) -> None:
    e.assign(op, f"tl.arange({op.start.value.data}, {op.end.value.data})")


@_emits(tile.SplatOp)
def _splat(e: TritonEmitter, op: tile.SplatOp) -> None:
    if op.result in e.aliases:
        return
    t = op.result.type
    if _is_bf16(t) and not e.is_literal(op.value):  # a bf16 scalar tensor: bits copied
        e.assign(
            op, f"tl.full({_shape_text(shape_of(t))}, {e.expr(op.value)}, tl.bfloat16)"
        )
    else:
        e.assign(op, _full(shape_of(t), e.expr(op.value), t))


@_emits(tile.ExpandDimsOp)
def _expand_dims(e: TritonEmitter, op: tile.ExpandDimsOp) -> None:
    index = [":"] * len(shape_of(op.input.type))
    index.insert(op.axis.value.data, "None")
    e.assign(op, f"{e.expr(op.input)}[{', '.join(index)}]")


@_emits(tile.BroadcastOp)
def _broadcast_to(e: TritonEmitter, op: tile.BroadcastOp) -> None:
    if op.result in e.aliases:
        return
    shape = _shape_text(shape_of(op.result.type))
    e.assign(op, f"tl.broadcast_to({e.expr(op.input)}, {shape})")


@_emits(tile.ReshapeOp)
def _reshape(e: TritonEmitter, op: tile.ReshapeOp) -> None:
    e.assign(
        op, f"tl.reshape({e.expr(op.input)}, {_shape_text(shape_of(op.result.type))})"
    )


@_emits(tile.TransOp)
def _trans(e: TritonEmitter, op: tile.TransOp) -> None:
    e.assign(op, f"tl.trans({e.expr(op.input)})")


@_emits(tile.PtrAddOp)
def _ptr_add(e: TritonEmitter, op: tile.PtrAddOp) -> None:
    e.assign(op, f"{e.expr(op.ptr)} + {e.expr(op.offset)}")


def _masked(e: TritonEmitter, mask: SSAValue | None) -> str:
    return "" if mask is None else f", mask={e.expr(mask)}"


@_emits(tile.LoadOp)
def _load(e: TritonEmitter, op: tile.LoadOp) -> None:
    other = "" if op.other is None else f", other={e.expr(op.other)}"
    address = f"{e.expr(op.ptr)} + {e.expr(op.offsets)}"
    e.assign(op, f"tl.load({address}{_masked(e, op.mask)}{other})")


@_emits(tile.StoreOp, tile.AtomicAddOp)
def _store(e: TritonEmitter, op: tile.StoreOp | tile.AtomicAddOp) -> None:
    address = f"{e.expr(op.ptr)} + {e.expr(op.offsets)}"
    if isinstance(op, tile.StoreOp):
        e.line(f"tl.store({address}, {e.expr(op.value)}{_masked(e, op.mask)})")
    else:
        e.line(f"tl.atomic_add({address}, {e.expr(op.value)}{_masked(e, op.mask)}, sem=\"relaxed\")")


@_emits(tile.AtomicFetchAddOp)
def _atomic_fetch_add(e: TritonEmitter, op: tile.AtomicFetchAddOp) -> None:
    address = f"{e.expr(op.ptr)} + {e.expr(op.offset)}"
    e.assign(op, f"tl.atomic_add({address}, {e.expr(op.value)}, sem=\"acq_rel\")")


@_emits(tile.BarrierOp)
def _barrier(e: TritonEmitter, op: tile.BarrierOp) -> None:
    e.line("tl.debug_barrier()")


@_emits(tile.DotOp)
def _dot(e: TritonEmitter, op: tile.DotOp) -> None:
    args = [e.expr(op.lhs), e.expr(op.rhs)]
    if op.acc is not None:
        args.append(e.expr(op.acc))
    in_elem = element_type_of(op.lhs.type)
    if isinstance(in_elem, Float32Type):
        precision = op.precision.data if op.precision is not None else "ieee"
        args.append(f'input_precision="{precision}"')
    elif isinstance(in_elem, IntegerType):
        args.append("out_dtype=tl.int32")
    e.assign(op, f"tl.dot({', '.join(args)})")


@_emits(tile.ReduceOp)
def _reduce(e: TritonEmitter, op: tile.ReduceOp) -> None:
    combiner = _REDUCE_COMBINERS[op.kind.data.value]
    e.helpers.add(combiner)
    axis = op.axis.value.data
    _compute(e, op, op.operands, lambda x: f"tl.reduce({x}, {axis}, {combiner})")


@_emits(tile.RandOp)
def _rand(e: TritonEmitter, op: tile.RandOp) -> None:
    e.helpers.add("_philox_rand")
    e.assign(op, f"_philox_rand({e.expr(op.seed)}, {e.expr(op.offsets)})")


