"""The backward's preprocess kernel: `delta = rowsum(dO * O) - dlse` per query row (fp32),
which the dQ and dK/dV kernels (`backward.py`) read as `dS = P (dP - delta)`."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType, f32
from xdsl.ir import SSAValue

from attnfuse.dialects.tile import KernelOp
from attnfuse.lowering.qk_side import padded
from attnfuse.lowering.signature import KernelSignature


def build_preprocess(name: str, out: SSAValue, d_out: SSAValue, d_lse: SSAValue, delta: SSAValue,
                     batch: SSAValue, q_len: SSAValue, heads: int, block_m: int) -> tuple[KernelOp, list[SSAValue]]:
    """`delta = rowsum(dO * O) - dlse`, one program per (query block, batch x head)."""
    assert isinstance(out.type, TensorType)
    v_dim = out.type.get_shape()[3]
    sig = KernelSignature()
    o_arg, do_arg = sig.tensor("Out", out), sig.tensor("dOut", d_out)
    dlse_arg, delta_arg = sig.tensor("dLSE", d_lse), sig.tensor("Delta", delta)
    sig.scalar("B", batch)
    sq = sig.scalar("Sq", q_len)
    b = sig.start(name, num_warps=4, num_stages=1, launch={})
    assert sq.value is not None
    pid_m, pid_bh = b.program_id(0, name="pid_m"), b.program_id(1, name="pid_bh")
    bi, h = b.div(pid_bh, heads, name="batch"), b.rem(pid_bh, heads, name="head")
    rows = b.add(b.mul(pid_m, block_m), b.arange(0, block_m), name="rows")
    row_ok = b.lt(rows, sq.value)
    d = b.arange(0, padded(v_dim))
    mask = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(b.lt(d, v_dim), 0))
    total = None
    for arg in (o_arg, do_arg):
        offs = b.add(b.expand_dims(b.mul(rows, arg.strides[2]), 1), b.expand_dims(b.mul(d, arg.strides[3]), 0))
        x = b.cast(b.load(arg.base(b, bi, h), offs, mask=mask, other=0.0), f32)
        total = x if total is None else b.mul(total, x)
    assert total is not None
    dlse = b.load(dlse_arg.base(b, bi, h), b.mul(rows, dlse_arg.strides[2]), mask=row_ok, other=0.0)
    delta = b.sub(b.reduce_sum(total, 1), dlse, name="delta")
    b.store(delta_arg.base(b, bi, h), b.mul(rows, delta_arg.strides[2]), delta, mask=row_ok)
    return b.finish(), sig.host_operands()


__all__ = ["build_preprocess"]
