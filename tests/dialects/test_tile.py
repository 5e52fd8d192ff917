"""The tile dialect: parsing/printing round trips, verifiers, and TileBuilder."""

from __future__ import annotations

import io
import math

import pytest
from xdsl.context import Context
from xdsl.dialects import arith, get_all_dialects, scf
from xdsl.dialects.builtin import (
    ModuleOp,
    TensorType,
    bf16,
    f16,
    f32,
    i1,
    i8,
    i32,
    i64,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError, VerifyException

from attnfuse.dialects import tile
from attnfuse.dialects.tile import PtrType, Tile
from attnfuse.dialects.tile_builder import TileBuilder, broadcast_shapes


def context() -> Context:
    ctx = Context()
    for name, factory in get_all_dialects().items():
        ctx.register_dialect(name, factory)
    ctx.load_dialect(Tile)
    return ctx


def parse(text: str) -> ModuleOp:
    module = Parser(context(), text).parse_module()
    module.verify()
    return module


def generic(module: ModuleOp) -> str:
    out = io.StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    return out.getvalue()


KERNEL = """\
builtin.module {
  tile.kernel @k(%x: !tile.ptr<bf16>, %y: !tile.ptr<f32>, %n: i32, %s: i64, %c: f32) attributes {num_warps = 8 : i64, num_stages = 2 : i64, launch = {grid = [2 : i64, 1 : i64]}, note = "extra"} {
    %pid = tile.program_id 0 : i32
    %np = tile.num_programs 1 : i32
    %offs = tile.arange 0, 16 : tensor<16xi32>
    %xb = tile.ptr_add %x, %s : !tile.ptr<bf16>, i64
    %row = tile.expand_dims %offs {axis = 1 : i64} : tensor<16xi32> -> tensor<16x1xi32>
    %col = tile.expand_dims %offs {axis = 0 : i64} : tensor<16xi32> -> tensor<1x16xi32>
    %rb = tile.broadcast %row : tensor<16x1xi32> -> tensor<16x16xi32>
    %cb = tile.broadcast %col : tensor<1x16xi32> -> tensor<16x16xi32>
    %idx = arith.addi %rb, %cb : tensor<16x16xi32>
    %nt = tile.splat %n : i32 -> tensor<16x16xi32>
    %m = tile.cmp lt, %idx, %nt : tensor<16x16xi32> -> tensor<16x16xi1>
    %z = arith.constant dense<0.000000e+00> : tensor<16x16xbf16>
    %a = tile.load %xb[%idx] mask %m other %z : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
    %s0 = tile.load %xb[%n] : !tile.ptr<bf16>, i32 -> bf16
    %at = tile.trans %a : tensor<16x16xbf16> -> tensor<16x16xbf16>
    %d = tile.dot %a, %at : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
    %d2 = tile.dot %a, %at, %d : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
    %mx = tile.reduce max %d2 {axis = 1 : i64} : tensor<16x16xf32> -> tensor<16xf32>
    %sm = tile.reduce sum %mx {axis = 0 : i64} : tensor<16xf32> -> f32
    %u = tile.rand %s, %idx : i64, tensor<16x16xi32> -> tensor<16x16xf32>
    %w = tile.where %m, %u, %d2 : tensor<16x16xi1>, tensor<16x16xf32>
    %f = tile.convert %idx : tensor<16x16xi32> -> tensor<16x16xf32>
    %r = tile.reshape %w : tensor<16x16xf32> -> tensor<256xf32>
    tile.store %y[%idx], %f mask %m : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xf32>
    tile.atomic_add %y[%idx], %w : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xf32>
    tile.return
  }
}"""


def test_round_trip_custom_generic_custom() -> None:
    module = parse(KERNEL)
    assert str(module) == KERNEL
    assert str(parse(generic(module))) == KERNEL
    text = generic(module)
    assert '"tile.kernel"() <{sym_name = "k", num_warps = 8 : i64' in text
    assert "#tile<reduce_kind max>" in text and "#tile<cmp_predicate lt>" in text
    assert "operandSegmentSizes = array<i32: 1, 1, 1, 1>" in text


def test_kernel_defaults_and_short_attribute_spelling() -> None:
    module = parse(
        "tile.kernel @k(%n: i32) attributes {num_warps = 2} {\n"
        "  %e = tile.arange 0, 4 : tensor<4xi32>\n"
        "  %x = tile.expand_dims %e {axis = 1} : tensor<4xi32> -> tensor<4x1xi32>\n"
        "  tile.return\n}"
    )
    (kernel,) = module.ops
    assert isinstance(kernel, tile.KernelOp)
    assert kernel.num_warps.value.data == 2 and kernel.num_stages.value.data == 3
    assert kernel.launch.data == {}


def _kernel_body(body: str, args: str = "%p: !tile.ptr<f32>, %n: i32") -> str:
    return f"tile.kernel @k({args}) {{\n{body}\n  tile.return\n}}"


@pytest.mark.parametrize(
    "body, message",
    [
        ("%a = tile.arange 0, 48 : tensor<48xi32>", "powers of two"),
        ("%a = tile.arange 0, 16 : tensor<8xi32>", "must have type tensor<16xi32>"),
        ("%a = tile.program_id 3 : i32", "axis must be 0, 1 or 2"),
        (
            "%a = tile.arange 0, 16 : tensor<16xi32>\n"
            "%b = tile.expand_dims %a {axis = 2} : tensor<16xi32> -> tensor<16x1xi32>",
            "axis 2 out of range",
        ),
        (
            "%a = tile.arange 0, 16 : tensor<16xi32>\n"
            "%b = tile.expand_dims %a {axis = 1} : tensor<16xi32> -> tensor<1x16xi32>",
            "result must be tensor<16x1xi32>",
        ),
        (
            "%a = arith.constant dense<0> : tensor<2x16xi32>\n"
            "%b = tile.broadcast %a : tensor<2x16xi32> -> tensor<4x16xi32>",
            "cannot broadcast",
        ),
        (
            "%a = arith.constant dense<0.0> : tensor<16x32xf32>\n"
            "%b = tile.trans %a : tensor<16x32xf32> -> tensor<16x32xf32>",
            "result must be tensor<32x16xf32>",
        ),
        (
            "%a = arith.constant dense<0.0> : tensor<16x32xf32>\n"
            "%b = tile.reshape %a : tensor<16x32xf32> -> tensor<256xf32>",
            "number of elements",
        ),
        (
            "%a = arith.constant dense<0.0> : tensor<16x32xbf16>\n"
            "%b = arith.constant dense<0.0> : tensor<16x32xbf16>\n"
            "%c = tile.dot %a, %b : tensor<16x32xbf16>, tensor<16x32xbf16> -> tensor<16x32xf32>",
            "shape mismatch",
        ),
        (
            "%a = arith.constant dense<0.0> : tensor<16x8xbf16>\n"
            "%b = arith.constant dense<0.0> : tensor<8x16xbf16>\n"
            "%c = tile.dot %a, %b : tensor<16x8xbf16>, tensor<8x16xbf16> -> tensor<16x16xf32>",
            ">= 16",
        ),
        (
            "%a = arith.constant dense<0.0> : tensor<16x16xbf16>\n"
            "%c = tile.dot %a, %a : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xbf16>",
            "result element type must be f32",
        ),
        (
            "%a = arith.constant dense<0.0> : tensor<16x16xf32>\n"
            "%b = tile.reduce max %a {axis = 2} : tensor<16x16xf32> -> tensor<16xf32>",
            "axis 2 out of range",
        ),
        (
            "%a = arith.constant dense<0.0> : tensor<16x16xf32>\n"
            "%b = tile.reduce sum %a {axis = 0} : tensor<16x16xf32> -> tensor<16xf16>",
            "result must be tensor<16xf32>",
        ),
        (
            "%o = arith.constant dense<0> : tensor<16xi32>\n"
            "%m = arith.constant dense<true> : tensor<16xi1>\n"
            "%z = arith.constant dense<0.0> : tensor<16xf16>\n"
            "%v = tile.load %p[%o] mask %m other %z : !tile.ptr<f32>, tensor<16xi32> -> tensor<16xf32>",
            "operand is used with type tensor<16xf32>",
        ),
        (
            "%o = arith.constant dense<0> : tensor<16xi32>\n"
            "%v = tile.load %p[%o] : !tile.ptr<f32>, tensor<16xi32> -> tensor<16xf16>",
            "result must be tensor<16xf32>",
        ),
        (
            "%o = arith.constant dense<0.0> : tensor<16xf32>\n"
            "%v = tile.load %p[%o] : !tile.ptr<f32>, tensor<16xf32> -> tensor<16xf32>",
            "offsets must be i8..i64",
        ),
        (
            "%o = arith.constant dense<0> : tensor<16xi32>\n"
            "%v = arith.constant dense<0> : tensor<16xi32>\n"
            "tile.store %p[%o], %v : !tile.ptr<f32>, tensor<16xi32>, tensor<16xi32>",
            "value must be tensor<16xf32>",
        ),
        (
            "%o = arith.constant dense<0> : tensor<16xi32>\n"
            "%u = tile.rand %n, %o : i32, tensor<16xi32> -> tensor<16xf16>",
            "f32 with the offsets' shape",
        ),
        (
            "%o = arith.constant dense<0> : tensor<16xi32>\n"
            "%c = arith.constant dense<true> : tensor<8xi1>\n"
            "%w = tile.where %c, %o, %o : tensor<8xi1>, tensor<16xi32>",
            "condition must be i1 with the shape",
        ),
        (
            "%o = arith.constant dense<0> : tensor<16xi32>\n"
            "%c = tile.cmp lt, %o, %o : tensor<16xi32> -> tensor<16xi32>",
            "result must be tensor<16xi1>",
        ),
        (
            "%o = arith.constant dense<0> : tensor<16xi32>\n"
            "%c = tile.convert %o : tensor<16xi32> -> tensor<8xf32>",
            "keep the shape",
        ),
        (
            "%q = tile.ptr_add %p, %n : !tile.ptr<f32>, i32\n%s = tile.splat %q : !tile.ptr<f32> -> tensor<16x!tile.ptr<f32>>",
            "must be a scalar",
        ),
    ],
)
def test_verifier_errors(body: str, message: str) -> None:
    with pytest.raises((VerifyException, ParseError), match=message):
        parse(_kernel_body(body))


def test_kernel_level_verifier_errors() -> None:
    with pytest.raises(VerifyException, match="argument #0 must be"):
        parse(_kernel_body("", args="%h: f16"))
    with pytest.raises(VerifyException, match="num_warps must be a positive power"):
        parse("tile.kernel @k() attributes {num_warps = 3} {\n  tile.return\n}")
    with pytest.raises(VerifyException, match="powers of two"):
        parse(_kernel_body("%a = arith.constant dense<0.0> : tensor<16x24xf32>"))
    with pytest.raises(VerifyException, match="is not a terminator"):
        parse("tile.kernel @k() {\n  %a = tile.program_id 0 : i32\n}")
    with pytest.raises(VerifyException, match="atomic_add supports"):
        parse(
            _kernel_body(
                "%o = arith.constant dense<0> : tensor<16xi32>\n"
                "%v = arith.constant dense<0.0> : tensor<16xbf16>\n"
                "tile.atomic_add %p[%o], %v : !tile.ptr<bf16>, tensor<16xi32>, tensor<16xbf16>",
                args="%p: !tile.ptr<bf16>",
            )
        )
    with pytest.raises(VerifyException, match="pointee must be"):
        PtrType(TensorType(f32, [4])).verify()
    with pytest.raises(VerifyException, match="atomic_fetch_add counts in i32"):
        parse(_kernel_body("%one = arith.constant 1 : i32\n%i = arith.constant 0 : i32\n"
                           "%t = tile.atomic_fetch_add %p[%i], %one : !tile.ptr<f32>, i32", args="%p: !tile.ptr<f32>"))


def test_host_alloc_restored_needs_zero() -> None:
    from xdsl.dialects.builtin import UnitAttr

    from attnfuse.dialects.host import AllocOp

    op = AllocOp.build(operands=[[], []], result_types=[TensorType(i32, [4])], properties={"restored": UnitAttr()})
    with pytest.raises(VerifyException, match="`restored` applies to a `zero` buffer"):
        op.verify()


# ---------------------------------------------------------------------------
# TileBuilder
# ---------------------------------------------------------------------------


def ops_of(b: TileBuilder) -> list[str]:
    return [op.name for op in b.kernel_op.body.block.ops]


def test_broadcast_shapes() -> None:
    assert broadcast_shapes((64, 1), (1, 128)) == (64, 128)
    assert broadcast_shapes((), (16,)) == (16,)
    assert broadcast_shapes((16,), (4, 1)) == (4, 16)
    with pytest.raises(ValueError, match="do not broadcast"):
        broadcast_shapes((2, 3), (4, 3))


def test_builder_scalar_tile_arithmetic_splats_and_picks_int_ops() -> None:
    b = TileBuilder.kernel("k", [("n", i32)])
    offs = b.add(b.mul(b.program_id(0), 64), b.arange(0, 64), name="offs")
    assert offs.type == TensorType(i32, [64]) and offs.name_hint == "offs"
    assert ops_of(b) == [
        "tile.program_id", "arith.constant", "arith.muli", "tile.arange",
        "tile.splat", "arith.addi",
    ]  # fmt: skip
    b.finish().verify()


def test_builder_numpy_broadcasting_of_rows_and_columns() -> None:
    b = TileBuilder.kernel("k", [("stride", i32)])
    (stride,) = b.args
    rows = b.expand_dims(b.arange(0, 64), 1)
    cols = b.expand_dims(b.arange(0, 128), -1 + 1)
    offs = b.add(b.mul(rows, stride), cols)
    assert offs.type == TensorType(i32, [64, 128])
    assert ops_of(b).count("tile.broadcast") == 2
    # a 1-d tile against a 2-d one gets a leading unit dim first
    row_vec = b.add(b.zeros((4, 16), f32), b.zeros((16,), f32))
    assert row_vec.type == TensorType(f32, [4, 16])
    b.finish().verify()


def test_builder_literals_take_the_other_operands_type() -> None:
    b = TileBuilder.kernel("k", [("x", PtrType(bf16))])
    x = b.load(b.args[0], b.arange(0, 16))
    y = b.mul(x, 0.5)
    assert y.type == TensorType(bf16, [16])
    splat = y.owner.operands[1].owner
    assert isinstance(splat, tile.SplatOp) and splat.result.type == TensorType(bf16, [16])
    const = splat.value.owner  # a bf16 scalar, not a dense<...> tile (xDSL stores all 16)
    assert isinstance(const, arith.ConstantOp) and const.result.type == bf16
    with pytest.raises(TypeError, match="float literal"):
        b.add(b.arange(0, 16), 1.5)
    b.finish().verify()


def test_builder_promotes_widths_and_rejects_int_float_mix() -> None:
    b = TileBuilder.kernel("k", [("n", i32), ("s", i64), ("f", f32)])
    n, s, f = b.args
    assert b.mul(n, s).type == i64
    assert isinstance(b.kernel_op.body.block.ops.first, arith.ExtSIOp)
    assert b.add(b.cast(f, f16), b.cast(f, bf16)).type == f32
    with pytest.raises(TypeError, match="cannot mix"):
        b.add(n, f)


def test_builder_comparisons_where_and_nonfinite_constants() -> None:
    b = TileBuilder.kernel("k", [("n", i32), ("f", f32)])
    n, f = b.args
    assert isinstance(b.lt(n, 3).owner, arith.CmpiOp)
    assert isinstance(b.ne(f, 0.0).owner, arith.CmpfOp)
    mask = b.lt(b.arange(0, 16), n)
    assert isinstance(mask.owner, tile.CmpOp) and mask.type == TensorType(i1, [16])
    s = b.where(mask, b.zeros((16,), f32), -math.inf)
    assert isinstance(s.owner, tile.WhereOp)
    ninf = s.owner.operands[2].owner
    assert isinstance(ninf, tile.SplatOp)  # not dense<0xFF800000>: xDSL misparses it
    assert isinstance(b.where(b.lt(n, 3), f, 1.0).owner, arith.SelectOp)
    kernel = b.finish()
    kernel.verify()
    assert str(parse(generic(ModuleOp([kernel.clone()])))).count("0xff800000") == 1


@pytest.mark.parametrize(
    "src, dst, scalar_op, tile_op",
    [
        (f32, bf16, arith.TruncFOp, arith.TruncFOp),
        (bf16, f32, arith.ExtFOp, arith.ExtFOp),
        (i32, f32, arith.SIToFPOp, tile.ConvertOp),
        (f32, i32, arith.FPToSIOp, tile.ConvertOp),
        (i32, i64, arith.ExtSIOp, tile.ConvertOp),
        (i64, i32, arith.TruncIOp, tile.ConvertOp),
        (i1, i32, arith.ExtUIOp, tile.ConvertOp),
        (i32, i8, arith.TruncIOp, tile.ConvertOp),
    ],
)
def test_builder_cast_picks_the_conversion(src, dst, scalar_op, tile_op) -> None:  # noqa: ANN001
    b = TileBuilder.kernel("k", [])
    scalar = b.constant(1, src)
    assert isinstance(b.cast(scalar, dst).owner, scalar_op)
    tile_value = b.full((16,), 1, src)
    converted = b.cast(tile_value, dst)
    assert isinstance(converted.owner, tile_op) and converted.type == TensorType(
        dst, [16]
    )
    assert b.cast(tile_value, src) is tile_value
    b.finish().verify()


def test_builder_cast_to_i1_is_not_equal_zero() -> None:
    b = TileBuilder.kernel("k", [("n", i32)])
    flag = b.cast(b.args[0], i1)
    assert isinstance(flag.owner, arith.CmpiOp) and flag.type == i1


def test_builder_loop_carries_values_and_names_them() -> None:
    b = TileBuilder.kernel("k", [("n", i32)])
    (n,) = b.args
    acc = b.zeros((16,), f32, name="acc")
    with b.for_(0, n, 16, inits=[acc], iv_name="start") as loop:
        (carried,) = loop.carried
        assert loop.iv.name_hint == "start" and carried.name_hint == "acc"
        loop.yield_(b.add(carried, 1.0))
    (result,) = loop.results
    assert result.type == TensorType(f32, [16])
    assert isinstance(loop.op, scf.ForOp) and loop.op.lb.type == i32
    b.finish().verify()


def test_builder_loop_errors() -> None:
    b = TileBuilder.kernel("k", [("n", i32)])
    with pytest.raises(ValueError, match="must call loop.yield_"):
        with b.for_(0, b.args[0], 16, inits=[b.zeros((16,), f32)]):
            pass
    b2 = TileBuilder.kernel("k", [("n", i32)])
    with b2.for_(0, 4, 1) as loop:  # no carried values: the yield is implicit
        b2.program_id(0)
    assert isinstance(loop.op.body.block.last_op, scf.YieldOp)
    with pytest.raises(TypeError, match="loop bounds must be integers"):
        with b2.for_(0.0, 1.0, 1.0):
            pass
    b2.finish().verify()


def test_builder_if_with_results() -> None:
    b = TileBuilder.kernel("k", [("n", i32), ("out", PtrType(f32))])
    n, out = b.args
    branch = b.if_(b.gt(n, 0), [f32])
    with branch.then_():
        branch.yield_(1.0)
    with branch.else_():
        branch.yield_(b.cast(n, f32))
    b.store(out, 0, branch.results[0])
    b.finish().verify()
    with pytest.raises(ValueError, match="must call yield_"):
        b2 = TileBuilder.kernel("k", [("n", i32)])
        br = b2.if_(b2.gt(b2.args[0], 0), [f32])
        with br.then_():
            pass


def test_builder_memory_ops_broadcast_masks_and_check_types() -> None:
    b = TileBuilder.kernel("k", [("p", PtrType(f32)), ("n", i32), ("s", i64)])
    p, n, s = b.args
    rows = b.expand_dims(b.arange(0, 16), 1)
    offs = b.add(b.mul(rows, 32), b.expand_dims(b.arange(0, 32), 0))
    row_mask = b.lt(rows, n)  # [16, 1] broadcast to the offsets' [16, 32]
    x = b.load(b.ptr_add(p, s), offs, mask=row_mask, other=0.0)
    assert x.type == TensorType(f32, [16, 32])
    assert x.owner.mask.type == TensorType(i1, [16, 32])  # pyright: ignore
    b.store(p, offs, 1.0, mask=row_mask)
    b.atomic_add(p, offs, x, mask=row_mask)
    with pytest.raises(TypeError, match="cast explicitly"):
        b.store(p, offs, b.cast(x, bf16))
    with pytest.raises(ValueError, match="needs a `mask`"):
        b.load(p, offs, other=0.0)
    b.finish().verify()


def test_builder_dot_reduce_rand_trans() -> None:
    b = TileBuilder.kernel("k", [("seed", i64)])
    a = b.zeros((32, 16), bf16)
    acc = b.dot(a, b.trans(a))
    assert acc.type == TensorType(f32, [32, 32])
    assert b.reduce_max(acc, -1).type == TensorType(f32, [32])
    assert b.reduce_sum(b.reduce_min(acc, 0), 0).type == f32
    u = b.rand(b.args[0], b.expand_dims(b.arange(0, 16), 0))
    assert u.type == TensorType(f32, [1, 16])
    assert b.cdiv(b.arange(0, 16), 4).type == TensorType(i32, [16])
    b.finish().verify()


def test_finish_inside_open_region_fails() -> None:
    b = TileBuilder.kernel("k", [("n", i32)])
    with pytest.raises(ValueError, match="inside an open loop"):
        with b.for_(0, 4, 1):
            b.finish()
