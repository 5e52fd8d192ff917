"""Pre-kernels: Q or K transforms (QK-norm, RoPE) run once over the whole tensor.

Used for transforms that `rope-fusion` placed in a `prekernel`: one program per
(block of rows, batch x head) loads its rows, applies the transforms in fp32 and writes
them, in the input dtype, into a new buffer that the attention kernel then reads.

In a packed batch (`packed`) a program is one (sequence, block of rows) slot of a
schedule (`attnfuse.lowering.varlen`), so RoPE positions count from the sequence's start.

Given `rope_table` (a `RopeTables`), RoPE reads cos and sin from an f32 table built once
per shape class: the same values the kernel would evaluate (the table kernel evaluates
them with the same code), without libdevice `sin`/`cos` per element, which made these
memory-bound kernels 3-4x slower than their reads and writes (H200, run 14).
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects.builtin import TensorType, f32
from xdsl.ir import Attribute, SSAValue

from attnfuse.dialects.attn import QKNormOp, RopeOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.lowering.qk_side import SideContext, SideTransforms, load_parts, side_layout, store_parts
from attnfuse.lowering.signature import KernelSignature
from attnfuse.lowering.varlen import PackedRows, SequenceView

ROWS_PER_PROGRAM = 64


def build_prekernel(
    name: str,
    source: SSAValue,
    target: SSAValue,
    transforms: list[RopeOp | QKNormOp],
    batch: SSAValue,
    seq_len: SSAValue,
    inv_freq: Callable[[RopeOp], SSAValue],
    launch: dict[str, Attribute],
    remap: dict[SSAValue, SSAValue] | None = None,
    rope_table: Callable[[RopeOp, Attribute], SSAValue] | None = None,
    packed: PackedRows | None = None,
) -> tuple[KernelOp, list[SSAValue]]:
    """The kernel and its launch operands (grid: cdiv(S, 64) x B*H, or the schedule's slots x H)."""
    assert isinstance(source.type, TensorType)
    heads, head_dim = source.type.get_shape()[1], source.type.get_shape()[3]
    sig = KernelSignature(remap)
    src = sig.tensor("X", source)
    dst = sig.tensor("Y", target)
    side = SideTransforms(transforms, SideContext(sig, head_dim, inv_freq, rope_table, f32), "x")
    sig.scalar("B", batch)
    seq = sig.scalar("S", seq_len)
    view = SequenceView(sig, packed) if packed is not None else None
    b = sig.start(name, num_warps=4, num_stages=1, launch=launch)
    layout = side_layout(transforms, head_dim)
    pid_s = b.program_id(0, name="pid_s")
    pid_bh = b.program_id(1, name="pid_bh")
    batch_index = b.div(pid_bh, heads, name="batch")
    head = b.rem(pid_bh, heads, name="head")
    rows, row_ok = _rows(b, pid_s, seq.value, view)
    parts = load_parts(b, src, src.base(b, batch_index, head), rows, row_ok, layout)
    parts32 = {r: b.cast(t, f32) for r, t in parts.items()}
    parts32 = side.apply(b, parts32, layout, rows, batch_index, row_ok)
    store_parts(b, dst, dst.base(b, batch_index, head), rows, row_ok, layout, parts32)
    return b.finish(), sig.host_operands()


def build_prekernel_backward(
    name: str,
    source: SSAValue,
    grad_in: SSAValue,
    target: SSAValue,
    transforms: list[RopeOp | QKNormOp],
    batch: SSAValue,
    seq_len: SSAValue,
    inv_freq: Callable[[RopeOp], SSAValue],
    weight_partials: dict[int, SSAValue],
    remap: dict[SSAValue, SSAValue],
    rope_table: Callable[[RopeOp, Attribute], SSAValue] | None = None,
    packed: PackedRows | None = None,
) -> tuple[KernelOp, list[SSAValue]]:
    """The transpose of a pre-kernel: `grad_in` (fp32, w.r.t. its output) -> `target`
    (w.r.t. its input `source`), plus per-program norm-weight partial sums."""
    from attnfuse.lowering.backward import store_weight_partial
    from attnfuse.lowering.qk_side_grad import backward, forward_saving

    assert isinstance(source.type, TensorType)
    heads, head_dim = source.type.get_shape()[1], source.type.get_shape()[3]
    sig = KernelSignature(remap)
    src, gin, dst = sig.tensor("X", source), sig.tensor("dY", grad_in), sig.tensor("dX", target)
    side = SideTransforms(transforms, SideContext(sig, head_dim, inv_freq, rope_table, f32), "x")
    partial_args = {n: sig.tensor(f"d_norm_w{n}", v) for n, v in weight_partials.items()}
    sig.scalar("B", batch)
    seq = sig.scalar("S", seq_len)
    view = SequenceView(sig, packed) if packed is not None else None
    b = sig.start(name, num_warps=4, num_stages=1, launch={})
    layout = side_layout(transforms, head_dim)
    pid_s, pid_bh = b.program_id(0, name="pid_s"), b.program_id(1, name="pid_bh")
    batch_index, head = b.div(pid_bh, heads, name="batch"), b.rem(pid_bh, heads, name="head")
    rows, row_ok = _rows(b, pid_s, seq.value, view)
    x = load_parts(b, src, src.base(b, batch_index, head), rows, row_ok, layout)
    states = forward_saving(side, b, {r: b.cast(t, f32) for r, t in x.items()}, layout, rows, batch_index, row_ok)
    grad = load_parts(b, gin, gin.base(b, batch_index, head), rows, row_ok, layout)
    dx, grads = backward(side, b, grad, states, layout, rows, batch_index, row_ok)
    store_parts(b, dst, dst.base(b, batch_index, head), rows, row_ok, layout, dx)
    slot = b.add(b.mul(pid_bh, b.num_programs(0)), pid_s, name="slot")
    for (n, role), sums in grads.weights.items():
        store_weight_partial(b, partial_args[n], slot, next(p for p in layout if p.role == role), sums)
    return b.finish(), sig.host_operands()


def _rows(b: TileBuilder, pid_s: SSAValue, seq_len: SSAValue | None,
          view: SequenceView | None) -> tuple[SSAValue, SSAValue]:
    """(rows, in-bounds mask) of program `pid_s`: its block of the sequence, or of the
    packed sequence its schedule slot names."""
    assert seq_len is not None
    block, length = pid_s, seq_len
    if view is not None:
        at = view.enter(b, pid_s)
        block, length = at.block, at.length
    rows = b.add(b.mul(block, ROWS_PER_PROGRAM), b.arange(0, ROWS_PER_PROGRAM), name="rows")
    return rows, b.lt(rows, length, name="row_ok")
