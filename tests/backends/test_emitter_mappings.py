"""Every op mapping of the Triton emitter, run under the Triton interpreter.

The attention kernels exercise only part of the emitter's tables (`_OPERATORS`,
`_BINARY_CALLS`, `_MATH_CALLS`, `_CASTS`, the comparison predicates and the single ops
with their own handler); a wrong entry that no kernel emits today would surface only when
a new lowering uses it. Each entry here gets a one-op kernel on scalar arguments: the op
is applied to kernel arguments, the result stored through a pointer, and compared with
the MLIR semantics of the op computed in Python (signed division truncates toward zero,
`remsi` takes the dividend's sign, `maximumf` propagates NaN, ...). The tests also check
that the tables hold exactly the ops tested here, so a new entry needs a case.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from xdsl.dialects import arith
from xdsl.dialects import math as xmath
from xdsl.dialects.builtin import Attribute, IndexType, f32, f64, i32, i64
from xdsl.ir import Operation, SSAValue

from attnfuse.backends.triton import source as emitter
from attnfuse.backends.triton.emitter import emit_module
from attnfuse.runtime.loader import load_kernels
from attnfuse.dialects import tile
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.dialects.tile_types import PtrType

TORCH = {f32: torch.float32, f64: torch.float64, i32: torch.int32, i64: torch.int64}


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("ATTNFUSE_CACHE_DIR")
    os.environ["ATTNFUSE_CACHE_DIR"] = str(tmp_path_factory.mktemp("attnfuse_cache"))
    yield
    if old is None:
        del os.environ["ATTNFUSE_CACHE_DIR"]
    else:
        os.environ["ATTNFUSE_CACHE_DIR"] = old


@dataclass(frozen=True)
class Case:
    """One op on scalar kernel arguments of `in_types`, its result type and its
    semantics (`want`, on Python numbers), checked on each tuple of `inputs`."""

    op: type[Operation]
    build: Callable[[Sequence[SSAValue]], Operation]
    in_types: tuple[Attribute, ...]
    out_type: Attribute
    want: Callable[..., float | int]
    inputs: tuple[tuple[float | int, ...], ...]


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _trunc_rem(a: int, b: int) -> int:
    return a - b * _trunc_div(a, b)


def _wrap(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


INTS = ((7, 2), (-7, 2), (7, -2), (-7, -2), (6, 3), (0, 5))
FLOATS = ((1.5, -2.25), (-0.75, 0.5), (3.0, 3.0))
NAN_PAIRS = ((float("nan"), 1.0), (2.0, float("nan")))


def _binary(op: type[Operation], types: Attribute, want: Callable[..., float | int],
            inputs: tuple[tuple[float | int, ...], ...]) -> Case:
    return Case(op, lambda v: op(v[0], v[1]), (types, types), types, want, inputs)  # type: ignore[call-arg]


CASES: dict[str, Case] = {
    # _OPERATORS
    "addf": _binary(arith.AddfOp, f32, lambda a, b: a + b, FLOATS),
    "addi": _binary(arith.AddiOp, i32, lambda a, b: a + b, INTS),
    "subf": _binary(arith.SubfOp, f32, lambda a, b: a - b, FLOATS),
    "subi": _binary(arith.SubiOp, i32, lambda a, b: a - b, INTS),
    "mulf": _binary(arith.MulfOp, f32, lambda a, b: a * b, FLOATS),
    "muli": _binary(arith.MuliOp, i32, lambda a, b: a * b, INTS),
    "divf": _binary(arith.DivfOp, f32, lambda a, b: a / b, FLOATS),
    "divsi": _binary(arith.DivSIOp, i32, _trunc_div, INTS),
    "remsi": _binary(arith.RemSIOp, i32, _trunc_rem, INTS),
    "andi": _binary(arith.AndIOp, i32, lambda a, b: a & b, INTS),
    "ori": _binary(arith.OrIOp, i32, lambda a, b: a | b, INTS),
    "xori": _binary(arith.XOrIOp, i32, lambda a, b: a ^ b, INTS),
    "shli": _binary(arith.ShLIOp, i32, lambda a, b: _wrap(a << b, 32), ((7, 2), (-7, 3), (1, 30))),
    "shrsi": _binary(arith.ShRSIOp, i32, lambda a, b: a >> b, ((7, 1), (-7, 1), (-1, 5), (1 << 30, 29))),
    # _BINARY_CALLS
    "maximumf": _binary(arith.MaximumfOp, f32, lambda a, b: math.nan if math.isnan(a) or math.isnan(b) else max(a, b),
                        FLOATS + NAN_PAIRS),
    "minimumf": _binary(arith.MinimumfOp, f32, lambda a, b: math.nan if math.isnan(a) or math.isnan(b) else min(a, b),
                        FLOATS + NAN_PAIRS),
    "maxnumf": _binary(arith.MaxnumfOp, f32, max, FLOATS),
    "minnumf": _binary(arith.MinnumfOp, f32, min, FLOATS),
    "maxsi": _binary(arith.MaxSIOp, i32, max, INTS),
    "minsi": _binary(arith.MinSIOp, i32, min, INTS),
    "ceildivsi": _binary(arith.CeilDivSIOp, i32, lambda a, b: -((-a) // b),
                         ((7, 2), (6, 3), (0, 5), (1, 16), (17, 16))),
    # single handlers
    "negf": Case(arith.NegfOp, lambda v: arith.NegfOp(v[0]), (f32,), f32, lambda a: -a, ((1.5,), (-2.0,))),
    "absf": Case(xmath.AbsFOp, lambda v: xmath.AbsFOp(v[0]), (f32,), f32, abs, ((-1.5,), (2.0,))),
    "fma": Case(xmath.FmaOp, lambda v: xmath.FmaOp(v[0], v[1], v[2]), (f32, f32, f32), f32,
                lambda a, b, c: a * b + c, ((1.5, -2.0, 0.25), (3.0, 0.5, -1.0))),
    "sqrt": Case(xmath.SqrtOp, lambda v: xmath.SqrtOp(v[0]), (f32,), f32, math.sqrt, ((2.0,), (0.25,))),
    "tanh": Case(xmath.TanhOp, lambda v: xmath.TanhOp(v[0]), (f32,), f32, math.tanh,
                 ((0.5,), (-3.0,), (40.0,), (-100.0,))),
}

_MATH = {
    "exp": (xmath.ExpOp, math.exp, 1.25), "exp2": (xmath.Exp2Op, lambda x: 2.0**x, 1.25),
    "log": (xmath.LogOp, math.log, 2.5), "log2": (xmath.Log2Op, math.log2, 2.5),
    "rsqrt": (xmath.RsqrtOp, lambda x: 1 / math.sqrt(x), 2.5), "sin": (xmath.SinOp, math.sin, 1.25),
    "cos": (xmath.CosOp, math.cos, 1.25), "erf": (xmath.ErfOp, math.erf, 0.75),
    "floor": (xmath.FloorOp, math.floor, -1.25), "ceil": (xmath.CeilOp, math.ceil, -1.25),
}  # fmt: skip
for _name, (_op, _fn, _x) in _MATH.items():
    _second = 0.5 if _name in ("log", "log2", "rsqrt") else -_x
    CASES[_name] = Case(_op, lambda v, op=_op: op(v[0]), (f32,), f32, _fn, ((_x,), (_second,)))

_CASTS_CASES: dict[str, tuple[type[Operation], Attribute, Attribute, Callable[[Any], Any], tuple[Any, ...]]] = {
    "extf": (arith.ExtFOp, f32, f64, float, (1.5, -0.1)),
    "sitofp": (arith.SIToFPOp, i32, f32, float, (7, -3)),
    "fptosi": (arith.FPToSIOp, f32, i32, int, (2.75, -2.75)),
    "extsi": (arith.ExtSIOp, i32, i64, int, (7, -3)),
    "trunci": (arith.TruncIOp, i64, i32, lambda a: _wrap(a, 32), (7, -3, (1 << 32) + 5)),
    "convert": (tile.ConvertOp, i32, f32, float, (7, -3)),
}
for _name, (_op, _src, _dst, _fn, _xs) in _CASTS_CASES.items():
    CASES[_name] = Case(_op, lambda v, op=_op, dst=_dst: op(v[0], dst), (_src,), _dst, _fn, tuple((x,) for x in _xs))

# i1 sources: extui / uitofp / extsi from a comparison (the only source the emitter allows).
_BOOL_CASTS = {
    "extui_i1": (lambda c: arith.ExtUIOp(c, i32), i32, lambda a, b: int(a < b)),
    "uitofp_i1": (lambda c: arith.UIToFPOp(c, f32), f32, lambda a, b: float(a < b)),
    "extsi_i1": (lambda c: arith.ExtSIOp(c, i32), i32, lambda a, b: -int(a < b)),
}
CMPI = {"eq": int.__eq__, "ne": int.__ne__, "slt": int.__lt__, "sle": int.__le__, "sgt": int.__gt__, "sge": int.__ge__}
CMPF = {
    "oeq": lambda a, b: a == b, "une": lambda a, b: a != b, "olt": lambda a, b: a < b,
    "ole": lambda a, b: a <= b, "ogt": lambda a, b: a > b, "oge": lambda a, b: a >= b,
}  # fmt: skip


def _run(build: Callable[[TileBuilder, list[SSAValue]], SSAValue], in_types: Sequence[Attribute],
         out_type: Attribute, inputs: Sequence[float | int]) -> float | int:
    """Build `out[0] = build(args)` as a kernel, run it once, return out[0]."""
    b = TileBuilder.kernel("one_op", [*((f"x{i}", t) for i, t in enumerate(in_types)),
                                      ("out", PtrType(out_type))], launch={})
    *xs, out = b.args
    b.store(out, 0, build(b, list(xs)))
    kernel = b.finish()
    kernel.verify()
    fn = load_kernels(emit_module(kernel), interpret=True)["one_op"]
    result = torch.zeros(1, dtype=TORCH[out_type])
    fn[(1,)](*inputs, result)
    return result.item()


def _op_result(b: TileBuilder, op: Operation) -> SSAValue:
    b.insert(op)
    return op.results[0]


def _expect(got: float | int, want: float | int, what: str) -> None:
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), f"{what}: got {got}, want NaN"
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=2e-6, abs_tol=1e-6), f"{what}: got {got}, want {want}"
    else:
        assert got == want, f"{what}: got {got}, want {want}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_mapping(name: str) -> None:
    case = CASES[name]
    for inputs in case.inputs:
        got = _run(lambda b, xs: _op_result(b, case.build(xs)), case.in_types, case.out_type, inputs)
        _expect(got, case.want(*inputs), f"{name}{inputs}")


@pytest.mark.parametrize("name", sorted(_BOOL_CASTS))
def test_cast_from_i1(name: str) -> None:
    build, out_type, want = _BOOL_CASTS[name]

    def body(b: TileBuilder, xs: list[SSAValue]) -> SSAValue:
        cmp = arith.CmpiOp(xs[0], xs[1], "slt")
        b.insert(cmp)
        return _op_result(b, build(cmp.result))

    for a, c in ((1, 2), (2, 1)):
        _expect(_run(body, (i32, i32), out_type, (a, c)), want(a, c), f"{name}({a}, {c})")


@pytest.mark.parametrize("pred", sorted(CMPI))
def test_cmpi(pred: str) -> None:
    def body(b: TileBuilder, xs: list[SSAValue]) -> SSAValue:
        cmp = arith.CmpiOp(xs[0], xs[1], pred)
        b.insert(cmp)
        return b.cast(cmp.result, i32)

    for a, c in ((1, 2), (2, 1), (-3, -3)):
        _expect(_run(body, (i32, i32), i32, (a, c)), int(CMPI[pred](a, c)), f"cmpi {pred}({a}, {c})")


@pytest.mark.parametrize("pred", sorted(CMPF))
def test_cmpf(pred: str) -> None:
    def body(b: TileBuilder, xs: list[SSAValue]) -> SSAValue:
        cmp = arith.CmpfOp(xs[0], xs[1], pred)
        b.insert(cmp)
        return b.cast(cmp.result, i32)

    for a, c in ((1.0, 2.0), (2.0, 1.0), (-3.0, -3.0), (math.nan, 1.0)):
        _expect(_run(body, (f32, f32), i32, (a, c)), int(CMPF[pred](a, c)), f"cmpf {pred}({a}, {c})")


def test_select() -> None:
    def body(b: TileBuilder, xs: list[SSAValue]) -> SSAValue:
        cmp = arith.CmpiOp(xs[0], xs[1], "slt")
        b.insert(cmp)
        return _op_result(b, arith.SelectOp(cmp.result, xs[0], xs[1]))

    for a, c in INTS:
        _expect(_run(body, (i32, i32), i32, (a, c)), min(a, c), f"select({a}, {c})")


def test_truncf() -> None:
    """f32 -> f64 (extf), an exact f64 product, rounded back to f32 (truncf)."""

    def body(b: TileBuilder, xs: list[SSAValue]) -> SSAValue:
        wide = _op_result(b, arith.ExtFOp(xs[0], f64))
        return _op_result(b, arith.TruncFOp(_op_result(b, arith.MulfOp(wide, wide)), f32))

    for x in (1.0 + 2.0**-20, -3.1):
        x32 = float(torch.tensor(x, dtype=torch.float32))
        want = float(torch.tensor(x32 * x32, dtype=torch.float64).to(torch.float32))
        assert _run(body, (f32,), f32, (x,)) == want


def test_index_cast() -> None:
    """i32 -> index -> i32 (index is int64 in Triton)."""

    def body(b: TileBuilder, xs: list[SSAValue]) -> SSAValue:
        index = _op_result(b, arith.IndexCastOp(xs[0], IndexType()))
        return _op_result(b, arith.IndexCastOp(index, i32))

    for x in (7, -3):
        assert _run(body, (i32,), i32, (x,)) == x


@pytest.mark.parametrize("a,b", [(-4, 2), (7, -2), (-7, -2), (-1, 3), (1, -3)])
def test_ceildivsi_negative_operands(a: int, b: int) -> None:
    got = _run(lambda bb, xs: _op_result(bb, arith.CeilDivSIOp(xs[0], xs[1])), (i32, i32), i32, (a, b))
    assert got == -((-a) // b)


@pytest.mark.parametrize("a,b,want", [(7, 2, 4), (0, 5, 0), (-7, 2, -3)])
def test_ceildivsi_of_constants(a: int, b: int, want: int) -> None:
    """Constant operands: the `tl.cdiv` form when they are provably >= 0 and > 0, else
    the general one."""
    b_ = TileBuilder.kernel("one_op", [("out", PtrType(i32))], launch={})
    b_.store(b_.args[0], 0, b_.cdiv(b_.constant(a, i32), b_.constant(b, i32)))
    kernel = b_.finish()
    kernel.verify()
    source = emit_module(kernel)
    assert (" - 1) // " in source) == (a >= 0), source
    result = torch.zeros(1, dtype=torch.int32)
    load_kernels(source, interpret=True)["one_op"][(1,)](result)
    assert result.item() == want


@pytest.mark.parametrize("op", [arith.MaxnumfOp, arith.MinnumfOp], ids=["maxnumf", "minnumf"])
@pytest.mark.parametrize("nan_first", [True, False], ids=["nan_lhs", "nan_rhs"])
def test_numf_ignores_nan(op: type[Operation], nan_first: bool) -> None:
    inputs = (math.nan, 1.0) if nan_first else (1.0, math.nan)
    got = _run(lambda bb, xs: _op_result(bb, op(xs[0], xs[1])), (f32, f32), f32, inputs)
    assert got == 1.0


def test_tables_are_covered() -> None:
    """Every entry of the emitter's tables has a case here, and the comparison
    predicates with a Triton operator are exactly those tested."""
    tables = set(emitter._OPERATORS) | set(emitter._BINARY_CALLS) | set(emitter._MATH_CALLS) | set(emitter._CASTS)
    tested = {case.op for case in CASES.values()}
    tested |= {arith.ExtUIOp, arith.UIToFPOp, arith.TruncFOp, arith.IndexCastOp, arith.SelectOp}
    assert tables <= tested, f"untested emitter entries: {sorted(op.name for op in tables - tested)}"
    supported = {p for p in emitter._CMP_OPERATORS if p in emitter._ARITH_CMPI or p in emitter._ARITH_CMPF}
    assert supported == set(CMPI) | set(CMPF), sorted(supported ^ (set(CMPI) | set(CMPF)))
