"""
Tile IR built with TileBuilder -> Triton source -> run under the Triton interpreter
on CPU tensors (compared with float64 torch) and compiled for sm_90 without a GPU.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Iterator

import pytest
import torch
from xdsl.context import Context
from xdsl.dialects.builtin import Attribute, ModuleOp, bf16, f32, i32, i64

from attnfuse import rng
from attnfuse.backends.triton.emitter import emit_module, kernel_metadata
from attnfuse.backends.triton.sm90 import (
    SM90_PTX_TARGET,
    compile_for_sm90,
    compile_kernel_for_sm90,
    ptx_target,
)
from attnfuse.runtime.loader import load_kernels
from attnfuse.backends.triton.target import TritonTarget
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.dialects.tile_types import PtrType

TORCH_DTYPE: dict[Attribute, torch.dtype] = {f32: torch.float32, bf16: torch.bfloat16}
LOG2E = 1.4426950408889634
BF16_ULP = 2**-7 * 1.02
"""One bf16 ulp, relative (8 significant bits), with 2% slack for the f32 math: the
bound for a value computed in f32 and converted to bf16 by the Triton interpreter,
which truncates (the GPU rounds to nearest, half of this)."""


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("ATTNFUSE_CACHE_DIR")
    os.environ["ATTNFUSE_CACHE_DIR"] = str(tmp_path_factory.mktemp("attnfuse_cache"))
    yield
    if old is None:
        del os.environ["ATTNFUSE_CACHE_DIR"]
    else:
        os.environ["ATTNFUSE_CACHE_DIR"] = old


def run(kernel: KernelOp, grid: tuple[int, ...], *args: object) -> None:
    """Emit `kernel`, load it for the interpreter and launch it."""
    fn = load_kernels(emit_module(kernel), interpret=True)[kernel.sym_name.data]
    fn[grid](*args)


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------


def finished(b: TileBuilder) -> KernelOp:
    """`b`'s kernel, terminated and verified (no pass manager verifies these)."""
    kernel = b.finish()
    kernel.verify()
    return kernel


def vector_add(dtype: Attribute = f32, block: int = 128) -> KernelOp:
    p = PtrType(dtype)
    b = TileBuilder.kernel(
        "vector_add", [("x", p), ("y", p), ("out", p), ("n", i32)],
        launch={},
    )  # fmt: skip
    x, y, out, n = b.args
    offs = b.add(b.mul(b.program_id(0), block), b.arange(0, block), name="offs")
    mask = b.lt(offs, n, name="mask")
    xv = b.load(x, offs, mask=mask, other=0.0, name="xv")
    yv = b.load(y, offs, mask=mask, other=0.0, name="yv")
    b.store(out, offs, b.add(xv, yv, name="sum"), mask=mask)
    return finished(b)


def row_softmax(dtype: Attribute, block_m: int = 16, block_n: int = 128) -> KernelOp:
    p = PtrType(dtype)
    b = TileBuilder.kernel(
        "row_softmax",
        [("x", p), ("y", p), ("stride", i32), ("M", i32), ("N", i32)],
        num_warps=4,
    )
    x, y, stride, m_rows, n_cols = b.args
    rows = b.add(b.mul(b.program_id(0), block_m), b.arange(0, block_m), name="rows")
    cols = b.arange(0, block_n, name="cols")
    row_in = b.lt(b.expand_dims(rows, 1), m_rows, name="row_in")  # [BM, 1]
    col_in = b.lt(b.expand_dims(cols, 0), n_cols, name="col_in")  # [1, BN]
    mask = b.and_(row_in, col_in, name="mask")  # [BM, BN]
    offs = b.add(
        b.mul(b.expand_dims(rows, 1), stride), b.expand_dims(cols, 0), name="offs"
    )
    xv = b.cast(b.load(x, offs, mask=mask, other=-math.inf), f32, name="xv")
    row_max = b.reduce_max(xv, 1, name="row_max")
    row_max = b.where(b.eq(row_max, -math.inf), 0.0, row_max, name="row_max_safe")
    e = b.exp(b.sub(xv, b.expand_dims(row_max, 1)), name="e")
    denom = b.reduce_sum(e, 1, name="denom")
    denom = b.where(b.eq(denom, 0.0), 1.0, denom, name="denom_safe")  # padding rows
    out = b.div(e, b.expand_dims(denom, 1), name="out")
    b.store(y, offs, b.cast(out, dtype), mask=mask)
    return finished(b)


def flash_attention_fwd(
    dtype: Attribute, head_dim: int = 32, block_m: int = 16, block_n: int = 16
) -> KernelOp:
    """Online-softmax attention forward, one (batch*head) per grid column."""
    p = PtrType(dtype)
    b = TileBuilder.kernel(
        "attn_fwd",
        [("Q", p), ("K", p), ("V", p), ("Out", p),
         ("stride_qh", i64), ("stride_qm", i32), ("stride_kh", i64), ("stride_kn", i32),
         ("stride_vh", i64), ("stride_vn", i32), ("stride_oh", i64), ("stride_om", i32),
         ("Sq", i32), ("Skv", i32), ("qk_scale", f32)],
        num_warps=4, num_stages=2,
        launch={},
    )  # fmt: skip
    q_ptr, k_ptr, v_ptr, o_ptr = b.args[:4]
    sqh, sqm, skh, skn, svh, svn, soh, som, sq, skv, qk_scale = b.args[4:]
    pid_m = b.program_id(0, name="pid_m")
    bh = b.to_i64(b.program_id(1), name="bh")  # batch*head base offsets in i64
    q_base = b.ptr_add(q_ptr, b.mul(bh, sqh), name="q_base")
    k_base = b.ptr_add(k_ptr, b.mul(bh, skh), name="k_base")
    v_base = b.ptr_add(v_ptr, b.mul(bh, svh), name="v_base")
    o_base = b.ptr_add(o_ptr, b.mul(bh, soh), name="o_base")
    offs_m = b.add(b.mul(pid_m, block_m), b.arange(0, block_m), name="offs_m")
    offs_d = b.arange(0, head_dim, name="offs_d")
    q_offs = b.add(
        b.mul(b.expand_dims(offs_m, 1), sqm), b.expand_dims(offs_d, 0), name="q_offs"
    )
    m_mask = b.lt(b.expand_dims(offs_m, 1), sq, name="m_mask")
    q = b.load(q_base, q_offs, mask=m_mask, other=0.0, name="q")
    m_i = b.full((block_m,), -math.inf, f32, name="m_i")
    l_i = b.zeros((block_m,), f32, name="l_i")
    acc = b.zeros((block_m, head_dim), f32, name="acc")
    with b.for_(0, skv, block_n, inits=[m_i, l_i, acc], iv_name="start_n") as loop:
        m_i, l_i, acc = loop.carried
        offs_n = b.add(loop.iv, b.arange(0, block_n), name="offs_n")
        n_in_row = b.lt(b.expand_dims(offs_n, 0), skv, name="n_in")  # [1, BN]
        kt_offs = b.add(
            b.mul(b.expand_dims(offs_n, 0), skn),
            b.expand_dims(offs_d, 1),
            name="kt_offs",
        )
        kt = b.load(k_base, kt_offs, mask=n_in_row, other=0.0, name="kt")
        s = b.mul(b.dot(q, kt), qk_scale, name="s")
        s = b.where(n_in_row, s, -math.inf, name="s_masked")
        m_new = b.maximum(m_i, b.reduce_max(s, 1), name="m_new")
        p_tile = b.exp2(b.sub(s, b.expand_dims(m_new, 1)), name="p")
        alpha = b.exp2(b.sub(m_i, m_new), name="alpha")
        l_new = b.add(b.mul(l_i, alpha), b.reduce_sum(p_tile, 1), name="l_new")
        v_offs = b.add(
            b.mul(b.expand_dims(offs_n, 1), svn),
            b.expand_dims(offs_d, 0),
            name="v_offs",
        )
        v = b.load(v_base, v_offs, mask=b.lt(b.expand_dims(offs_n, 1), skv), other=0.0)
        acc_new = b.dot(
            b.cast(p_tile, dtype),
            v,
            b.mul(acc, b.expand_dims(alpha, 1)),
            name="acc_new",
        )
        loop.yield_(m_new, l_new, acc_new)
    m_i, l_i, acc = loop.results
    out = b.div(acc, b.expand_dims(l_i, 1), name="out")
    o_offs = b.add(
        b.mul(b.expand_dims(offs_m, 1), som), b.expand_dims(offs_d, 0), name="o_offs"
    )
    b.store(o_base, o_offs, b.cast(out, dtype), mask=m_mask)
    return finished(b)


def dropout_rand(block_m: int = 64, block_n: int = 128) -> KernelOp:
    b = TileBuilder.kernel("rand_tile", [("out", PtrType(f32)), ("seed", i64)])
    out, seed = b.args
    rows = b.expand_dims(b.arange(0, block_m), 1)
    offs = b.add(
        b.mul(rows, block_n), b.expand_dims(b.arange(0, block_n), 0), name="offs"
    )
    b.store(out, offs, b.rand(seed, offs, name="u"))
    return finished(b)


def atomic_accumulate(block: int = 64) -> KernelOp:
    b = TileBuilder.kernel(
        "accumulate", [("x", PtrType(f32)), ("acc", PtrType(f32)), ("n", i32)]
    )
    x, acc, n = b.args
    pid = b.program_id(0, name="pid")
    offs = b.arange(0, block, name="offs")
    mask = b.lt(offs, n, name="mask")
    weight = b.cast(b.add(pid, 1), f32, name="weight")
    xv = b.load(x, offs, mask=mask, other=0.0, name="xv")
    b.atomic_add(acc, offs, b.mul(xv, weight), mask=mask)
    return finished(b)


def elementwise_math(dtype: Attribute, block: int = 64) -> KernelOp:
    """y[i, k] = f_k(x[i]) for tanh, exp, log, sqrt, rsqrt, abs, neg."""
    p = PtrType(dtype)
    b = TileBuilder.kernel("elementwise_math", [("x", p), ("y", p), ("n", i32)])
    x, y, n = b.args
    offs = b.arange(0, block, name="offs")
    mask = b.lt(offs, n)
    xv = b.load(x, offs, mask=mask, other=1.0, name="xv")
    results = [b.tanh(xv), b.exp(xv), b.log(b.abs(xv)), b.sqrt(b.abs(xv)),
               b.rsqrt(b.abs(xv)), b.neg(xv), b.maximum(xv, 0.5)]  # fmt: skip
    for k, r in enumerate(results):
        b.store(y, b.add(offs, k * block), r, mask=mask)
    return finished(b)


ALL_KERNELS: dict[str, Callable[[], KernelOp]] = {
    "vector_add": vector_add,
    "row_softmax_f32": lambda: row_softmax(f32),
    "row_softmax_bf16": lambda: row_softmax(bf16),
    "flash_attention_f32": lambda: flash_attention_fwd(f32),
    "flash_attention_bf16": lambda: flash_attention_fwd(bf16),
    "rand": dropout_rand,
    "atomic_add": atomic_accumulate,
    "math_bf16": lambda: elementwise_math(bf16),
}


# ---------------------------------------------------------------------------
# Numerics under the interpreter
# ---------------------------------------------------------------------------


def test_vector_add_odd_length() -> None:
    n = 1001
    x, y = torch.randn(n), torch.randn(n)
    out = torch.full((n + 7,), 123.0)  # tail past n must stay untouched
    run(vector_add(), (triton_cdiv(n, 128),), x, y, out, n)
    torch.testing.assert_close(out[:n], x + y, rtol=0, atol=0)  # one f32 add: exact
    assert (out[n:] == 123.0).all()


@pytest.mark.parametrize("dtype", [f32, bf16], ids=["f32", "bf16"])
def test_row_softmax_masked(dtype: Attribute) -> None:
    m, n = 37, 100
    x = (torch.randn(m, n, dtype=torch.float64) * 3).to(TORCH_DTYPE[dtype])
    y = torch.zeros(m, n, dtype=TORCH_DTYPE[dtype])
    run(row_softmax(dtype), (triton_cdiv(m, 16),), x, y, n, m, n)
    expected = torch.softmax(x.double(), dim=1)
    # f32: exp/div/sum in f32 over 100 terms, a few ulps. bf16: the f32 result is
    # converted to bf16, which the interpreter truncates (the GPU rounds to nearest):
    # under one bf16 ulp, 2**-7 relative, plus the f32 error.
    tol = {f32: dict(rtol=1e-5, atol=1e-7), bf16: dict(rtol=BF16_ULP, atol=1e-6)}[dtype]
    torch.testing.assert_close(y.double(), expected, **tol)


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    scale = 1 / math.sqrt(q.shape[-1])
    s = q.double() @ k.double().transpose(-1, -2) * scale
    return torch.softmax(s, dim=-1) @ v.double()


@pytest.mark.parametrize("dtype", [f32, bf16], ids=["f32", "bf16"])
def test_flash_attention_forward(dtype: Attribute) -> None:
    heads, seq, dim = 2, 45, 32
    torch.manual_seed(0)
    q, k, v = (torch.randn(heads, seq, dim).to(TORCH_DTYPE[dtype]) for _ in range(3))
    out = torch.zeros_like(q)
    scale = 1 / math.sqrt(dim)
    run(
        flash_attention_fwd(dtype), (triton_cdiv(seq, 16), heads),
        q, k, v, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        seq, seq, scale * LOG2E,
    )  # fmt: skip
    expected = attention_reference(q, k, v)
    if dtype == f32:
        # IEEE f32 dots and f32 online softmax: error ~ a few ulps of |O| <= max|V|.
        tol = dict(rtol=1e-5, atol=2e-6)
    else:
        # O is converted to bf16 (one ulp, see BF16_ULP) and P is converted to bf16
        # before the PV dot: every weight is truncated by up to one ulp, shifting O by
        # at most 2**-7 * max|V| (~4.5 here), much less on average over 45 keys.
        tol = dict(rtol=BF16_ULP, atol=2**-6)
    torch.testing.assert_close(out.double(), expected, **tol)


def test_rand_range_and_reproducibility() -> None:
    kernel = dropout_rand()
    first, again, other = (torch.empty(64 * 128) for _ in range(3))
    run(kernel, (1,), first, 1234)
    run(kernel, (1,), again, 1234)
    run(kernel, (1,), other, 4321)
    assert ((first >= 0) & (first < 1)).all()
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert abs(first.mean().item() - 0.5) < 0.02  # 8192 samples: sigma ~ 0.0032
    assert len(torch.unique(first)) > 8000
    # bit-exact with Triton's tl.rand, as reproduced in torch by attnfuse.rng
    torch.testing.assert_close(
        first, rng.rand(1234, torch.arange(64 * 128)), rtol=0, atol=0
    )
    run(kernel, (1,), again, 2**40 + 7)  # a seed with a non-zero high word
    torch.testing.assert_close(
        again, rng.rand(2**40 + 7, torch.arange(64 * 128)), rtol=0, atol=0
    )


def test_atomic_add_accumulates_across_programs() -> None:
    n, programs = 50, 8
    x = torch.randn(n)
    acc = torch.zeros(64)
    run(atomic_accumulate(), (programs,), x, acc, n)
    weight = sum(range(1, programs + 1))
    torch.testing.assert_close(acc[:n], x * weight, rtol=1e-6, atol=1e-6)
    assert (acc[n:] == 0).all()


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("dtype", [f32, bf16], ids=["f32", "bf16"])
def test_elementwise_math(dtype: Attribute) -> None:
    n = 60
    x = torch.cat(
        [torch.linspace(-4, 4, n - 4), torch.tensor([-100.0, 100.0, 1e-3, -30.0])]
    )
    x = x.to(TORCH_DTYPE[dtype])
    y = torch.zeros(7 * 64, dtype=TORCH_DTYPE[dtype])
    run(elementwise_math(dtype), (1,), x, y, n)
    xd = x.double()
    expected = [torch.tanh(xd), torch.exp(xd), torch.log(xd.abs()), torch.sqrt(xd.abs()),
                torch.rsqrt(xd.abs()), -xd, torch.clamp(xd, min=0.5)]  # fmt: skip
    got = y.view(7, 64)[:, :n].double()
    assert not torch.isnan(got).any()  # tanh(+-100): exp(200) overflows to inf -> 1
    # f32: tanh as 1 - 2/(exp(2x)+1) loses relative accuracy near 0 (absolute error
    # ~ f32 eps); bf16 results are computed in f32 and converted (one bf16 ulp).
    tol = {f32: dict(rtol=1e-5, atol=1e-6), bf16: dict(rtol=BF16_ULP, atol=1e-6)}[dtype]
    for k, exp in enumerate(expected):
        torch.testing.assert_close(got[k], exp.to(x.dtype).double(), **tol)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------
# Emitted text, target, loader
# ---------------------------------------------------------------------------


def test_emitted_source_is_readable_triton() -> None:
    src = emit_module(flash_attention_fwd(f32))
    assert src.startswith("# Generated by AttnFuse")
    assert "@triton.jit(do_not_specialize=['Sq', 'Skv'])\ndef attn_fwd(Q, K, V, Out, stride_qh," in src
    assert "    stride_qh = tl.cast(stride_qh, tl.int64)\n" in src
    assert "    bh = tl.cast(v0, tl.int64)\n" in src
    assert "    q_base = Q + v1\n" in src
    assert '    m_i = tl.full((16,), float("-inf"), tl.float32)\n' in src
    assert "    for start_n in range(0, Skv, 16):\n" in src
    assert 'tl.dot(q, kt, input_precision="ieee")' in src
    assert "        m_i, l_i, acc = m_new, l_new, acc_new\n" in src
    assert "q = tl.load(q_base + q_offs, mask=" in src
    assert "propagate_nan=tl.PropagateNan.ALL" in src
    bf16_src = emit_module(flash_attention_fwd(bf16))
    assert "input_precision" not in bf16_src


def test_tanh_on_bf16_is_computed_in_f32() -> None:
    src = emit_module(elementwise_math(bf16))
    assert (
        "tl.cast(1.0 - 2.0 / (tl.exp(2.0 * tl.cast(xv, tl.float32)) + 1.0), tl.bfloat16)"
        in src
    )


def test_target_prints_metadata_and_every_kernel() -> None:
    module = ModuleOp([vector_add(), flash_attention_fwd(bf16)])
    out = io.StringIO()
    TritonTarget().emit(Context(), module, out)
    text = out.getvalue()
    assert text.count("\n# kernel ") == 2
    assert "\ndef vector_add(x, y, out, n):\n" in text
    assert "# kernel attn_fwd\n#   num_warps=4 num_stages=2\n" in text
    assert (
        "#   signature: Q: *bf16, K: *bf16, V: *bf16, Out: *bf16, stride_qh: i64,"
        in text
    )
    meta = kernel_metadata(flash_attention_fwd(bf16))
    assert meta.signature["qk_scale"] == "fp32" and meta.num_stages == 2


def test_loader_modes_side_by_side() -> None:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    src = emit_module(vector_add())
    before = os.environ.get("TRITON_INTERPRET")
    interp = load_kernels(src, interpret=True)["vector_add"]
    jit = load_kernels(src, interpret=False)["vector_add"]
    assert isinstance(interp, InterpretedFunction)
    assert isinstance(jit, JITFunction)
    assert load_kernels(src, interpret=True)["vector_add"] is interp  # memoized
    assert os.environ.get("TRITON_INTERPRET") == before


# ---------------------------------------------------------------------------
# Every kernel compiles for Hopper without a GPU
# ---------------------------------------------------------------------------


HAND_WRITTEN = """\
import triton
import triton.language as tl


@triton.jit
def scale(x, y, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n) * factor, mask=offs < n)
"""


def test_compile_for_sm90_with_explicit_signature_and_constexprs() -> None:
    signature = {
        "x": "*fp16",
        "y": "*fp16",
        "n": "i32",
        "factor": "fp32",
        "BLOCK": "constexpr",
    }
    compiled = compile_for_sm90(
        HAND_WRITTEN, "scale", signature, {"BLOCK": 256}, num_warps=2
    )
    assert ptx_target(compiled).startswith(SM90_PTX_TARGET)
    assert compiled.metadata.num_warps == 2


@pytest.mark.parametrize("name", sorted(ALL_KERNELS))
def test_compiles_for_sm90(name: str) -> None:
    compiled = compile_kernel_for_sm90(ALL_KERNELS[name]())
    assert ptx_target(compiled).startswith(SM90_PTX_TARGET)
    assert compiled.asm["cubin"]
