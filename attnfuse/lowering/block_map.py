"""The runtime block map: data-dependent masks classified per tile, on the GPU.

For masks whose kept set depends on data (document ids) or on a predicate the compiler
cannot bound statically, a small kernel evaluates every mask on every (q block, kv block)
tile before attention runs and writes, per q block, the list of *partial* kv blocks (some
elements masked) and of *full* kv blocks (none masked, fully in bounds); empty tiles are
in neither list, so the attention kernel never visits them. This is flex_attention's
BlockMask, derived by the compiler from the mask ops instead of written by the user.
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects import arith
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType, i32
from xdsl.ir import Operation, SSAValue

from attnfuse.analysis.masks import effective_masks
from attnfuse.dialects.attn import MaskOp, OnlineSoftmaxOp
from attnfuse.lowering.forward import BlockMap
from attnfuse.lowering.score_chain import ScoreChain, TileCoords
from attnfuse.lowering.signature import KernelSignature
from attnfuse.program import AttentionProgram


def _uses_head(mask: MaskOp) -> bool:
    if mask.kind_name != "custom":
        return False
    return bool(list(mask.predicate.block.args[1].uses)) or bool(mask.args)


def build_block_map(
    program: AttentionProgram,
    host: Any,
    q: SSAValue,
    k: SSAValue,
    batch: SSAValue,
    q_len: SSAValue,
    kv_len: SSAValue,
    one: SSAValue,
    fname: str,
    remap: dict[SSAValue, SSAValue] | None = None,
    blocks: tuple[int, int] | None = None,
) -> tuple[BlockMap, Operation]:
    """Allocate the map buffers, launch the map kernel; return them and the kernel."""
    online = program.online
    assert isinstance(online, OnlineSoftmaxOp)
    bm, bn = blocks or (online.plan.block_m.data, online.plan.block_n.data)
    masks = effective_masks(program.score_ops)
    per_head = any(_uses_head(m) for m in masks)
    heads = program.heads[0]
    map_heads = heads if per_head else 1
    n_q = host.cdiv(q_len, bm, "map_q_blocks")
    n_kv = host.cdiv(kv_len, bn, "map_kv_blocks")
    slots = host.emit(arith.MuliOp(host.mul(batch, map_heads, "map_bh"), n_q), "map_slots")
    vec, mat = TensorType(i32, [DYNAMIC_INDEX]), TensorType(i32, [DYNAMIC_INDEX, DYNAMIC_INDEX])
    block_map = BlockMap(
        partial_count=host.alloc(vec, {0: slots}, "partial_count"),
        partial_index=host.alloc(mat, {0: slots, 1: n_kv}, "partial_index"),
        full_count=host.alloc(vec, {0: slots}, "full_count"),
        full_index=host.alloc(mat, {0: slots, 1: n_kv}, "full_index"),
        per_head=per_head,
    )
    sig = KernelSignature(remap)
    chain = ScoreChain(list(masks), sig, host.table, set())
    outs = [sig.tensor(name, value) for name, value in (
        ("partial_count", block_map.partial_count), ("partial_index", block_map.partial_index),
        ("full_count", block_map.full_count), ("full_index", block_map.full_index))]
    sig.scalar("B", batch)
    sq_arg, skv_arg = sig.scalar("Sq", q_len), sig.scalar("Skv", kv_len)
    name = f"{fname}_block_map"
    b = sig.start(name, num_warps=4, num_stages=1, launch={})
    sq, skv = sq_arg.value, skv_arg.value
    assert sq is not None and skv is not None
    pid_m = b.program_id(0, name="pid_m")
    pid_bh = b.program_id(1, name="pid_bh")
    batch_index = b.div(pid_bh, map_heads, name="batch")
    head = b.rem(pid_bh, map_heads, name="head")
    rows = b.add(b.mul(pid_m, bm), b.arange(0, bm), name="rows")
    row_ok = b.lt(rows, sq)
    slot = b.add(b.mul(pid_bh, b.num_programs(0)), pid_m, name="slot")
    n_kv_blocks = b.div(b.add(skv, bn - 1), bn, name="n_kv_blocks")
    zero = b.constant(0, i32)
    with b.for_(0, n_kv_blocks, 1, inits=[zero, zero], iv_name="kv_block", names=["n_partial", "n_full"]) as loop:
        n_partial, n_full = loop.carried
        start_n = b.mul(loop.iv, bn)
        cols = b.add(start_n, b.arange(0, bn), name="cols")
        col_ok = b.lt(cols, skv)
        valid = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(col_ok, 0), name="valid")
        at = TileCoords(batch_index, head, rows, cols, sq, skv, valid)
        keep = valid
        for n, mask in enumerate(chain.ops):
            assert isinstance(mask, MaskOp)
            keep = b.and_(keep, chain.keep(b, n, mask, at))
        kept = b.reduce_sum(b.reduce_sum(b.cast(keep, i32), 1), 0, name="kept")
        total = b.reduce_sum(b.reduce_sum(b.cast(valid, i32), 1), 0, name="total")
        in_bounds = b.le(b.add(start_n, bn), skv)
        is_full = b.and_(b.eq(kept, total), in_bounds, name="is_full")
        is_partial = b.and_(b.gt(kept, 0), b.xor(is_full, True), name="is_partial")
        for count, arg, flag in ((n_partial, outs[1], is_partial), (n_full, outs[3], is_full)):
            assert arg.ptr is not None
            row_base = b.ptr_add(arg.ptr, b.mul(b.to_i64(slot), b.to_i64(arg.strides[0])))
            b.store(row_base, b.mul(count, arg.strides[1]), loop.iv, mask=flag)
        loop.yield_(b.add(n_partial, b.cast(is_partial, i32)), b.add(n_full, b.cast(is_full, i32)))
    n_partial, n_full = loop.results
    for arg, value in ((outs[0], n_partial), (outs[2], n_full)):
        assert arg.ptr is not None
        b.store(arg.ptr, b.mul(slot, arg.strides[0]), value)
    kernel = b.finish()
    grid = [host.cdiv(q_len, bm, "map_grid_m"), host.mul(batch, map_heads, "map_grid_bh"), one]
    host.launch(name, grid, sig.host_operands())
    return block_map, kernel
