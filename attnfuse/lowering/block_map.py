"""The runtime block map: data-dependent masks classified per tile, on the GPU.

For masks whose kept set depends on data (document ids) or on a predicate the compiler
cannot bound statically, a small kernel evaluates every mask on every (q block, kv block)
tile before attention runs and writes, per q block, the list of *partial* kv blocks (some
elements masked) and of *full* kv blocks (none masked, fully in bounds); empty tiles are
in neither list, so the attention kernel never visits them. This is flex_attention's
BlockMask, derived by the compiler from the mask ops instead of written by the user.

The *transposed* map (`transposed=True`) lists, per kv block, the q blocks that visit it:
the dK/dV kernel, one program per kv block, walks it like the forward walks its map. A
full tile there is in bounds along both dims (the dK/dV kernel then loads its q rows
without masks).

With `ranks`, the (untransposed) map also records at each kept tile how many kept tiles
of its q block come before it: the Hopper backward's key blocks add into a dQ tile in
that order, and a block's rank is its turn.
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
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.lowering.signature import KernelSignature, TensorArg
from attnfuse.program import AttentionProgram


def _uses_head(mask: MaskOp) -> bool:
    if mask.kind_name != "custom":
        return False
    return bool(list(mask.predicate.block.args[1].uses)) or bool(mask.args)


def map_per_head(program: AttentionProgram) -> bool:
    """Whether the program's runtime block map has one map per query head (a custom
    predicate reads the head or captures operands) rather than one per batch element."""
    return any(_uses_head(m) for m in effective_masks(program.score_ops))


def map_arguments(sig: KernelSignature, block_map: BlockMap, prefix: str = "") -> list[TensorArg]:
    """The kernel arguments of a map: partial count / index, full count / index."""
    return [sig.tensor(prefix + name, value) for name, value in (
        ("partial_count", block_map.partial_count), ("partial_index", block_map.partial_index),
        ("full_count", block_map.full_count), ("full_index", block_map.full_index))]


def map_counts(b: TileBuilder, args: list[TensorArg], row: SSAValue) -> tuple[SSAValue, SSAValue]:
    """(partial, full) tile counts of map row `row` (`args`: `map_arguments`)."""
    counts = []
    for arg in (args[0], args[2]):
        assert arg.ptr is not None
        counts.append(b.load(arg.ptr, b.mul(row, arg.strides[0])))
    return counts[0], counts[1]


def map_entry(b: TileBuilder, args: list[TensorArg], row: SSAValue, j: SSAValue, partial: SSAValue,
              name: str) -> tuple[SSAValue, SSAValue]:
    """(block, masked) of entry `j` of map row `row` when its `partial` partial tiles
    come first: partial entry `j` (masked) if `j < partial`, else full entry
    `j - partial` (both read in bounds, one selected)."""
    masked = b.lt(j, partial, name="masked")
    indices = []
    for arg, at in ((args[1], j), (args[3], b.maximum(b.sub(j, partial), 0))):
        assert arg.ptr is not None
        base = b.ptr_add(arg.ptr, b.mul(b.to_i64(row), b.to_i64(arg.strides[0])))
        indices.append(b.load(base, b.mul(at, arg.strides[1])))
    return b.where(masked, indices[0], indices[1], name=name), masked


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
    transposed: bool = False,
    ranks: bool = False,
) -> tuple[BlockMap, Operation]:
    """Allocate the map buffers, launch the map kernel; return them and the kernel.
    `transposed`: per kv block, the lists of q blocks; `ranks`: the ranks of kept tiles
    too (see the module docstring)."""
    assert not (ranks and transposed)
    online = program.online
    assert isinstance(online, OnlineSoftmaxOp)
    bm, bn = blocks or (online.plan.block_m.data, online.plan.block_n.data)
    masks = effective_masks(program.score_ops)
    per_head = map_per_head(program)
    heads = program.heads[0]
    map_heads = heads if per_head else 1
    tag = "map_t" if transposed else "map"
    n_q = host.cdiv(q_len, bm, f"{tag}_q_blocks")
    n_kv = host.cdiv(kv_len, bn, f"{tag}_kv_blocks")
    n_outer, n_inner = (n_kv, n_q) if transposed else (n_q, n_kv)
    slots = host.emit(arith.MuliOp(host.mul(batch, map_heads, f"{tag}_bh"), n_outer), f"{tag}_slots")
    vec, mat = TensorType(i32, [DYNAMIC_INDEX]), TensorType(i32, [DYNAMIC_INDEX, DYNAMIC_INDEX])
    prefix = "t_" if transposed else ""
    block_map = BlockMap(
        partial_count=host.alloc(vec, {0: slots}, f"{prefix}partial_count"),
        partial_index=host.alloc(mat, {0: slots, 1: n_inner}, f"{prefix}partial_index"),
        full_count=host.alloc(vec, {0: slots}, f"{prefix}full_count"),
        full_index=host.alloc(mat, {0: slots, 1: n_inner}, f"{prefix}full_index"),
        per_head=per_head,
        rank=host.alloc(mat, {0: slots, 1: n_inner}, "rank") if ranks else None,
    )
    sig = KernelSignature(remap)
    chain = ScoreChain(list(masks), sig, host.table, set())
    outs = map_arguments(sig, block_map)
    rank_arg = sig.tensor("rank", block_map.rank) if block_map.rank is not None else None
    sig.scalar("B", batch)
    sq_arg, skv_arg = sig.scalar("Sq", q_len), sig.scalar("Skv", kv_len)
    name = f"{fname}_kv_block_map" if transposed else f"{fname}_block_map"
    b = sig.start(name, num_warps=4, num_stages=1, launch={})
    sq, skv = sq_arg.value, skv_arg.value
    assert sq is not None and skv is not None
    pid = b.program_id(0, name="pid_n" if transposed else "pid_m")
    pid_bh = b.program_id(1, name="pid_bh")
    batch_index = b.div(pid_bh, map_heads, name="batch")
    head = b.rem(pid_bh, map_heads, name="head")
    slot = b.add(b.mul(pid_bh, b.num_programs(0)), pid, name="slot")
    outer_block, inner_block, inner_len = (bn, bm, sq) if transposed else (bm, bn, skv)
    outer = b.add(b.mul(pid, outer_block), b.arange(0, outer_block), name="cols" if transposed else "rows")
    n_inner_blocks = b.div(b.add(inner_len, inner_block - 1), inner_block, name="n_inner_blocks")
    zero = b.constant(0, i32)
    with b.for_(0, n_inner_blocks, 1, inits=[zero, zero], iv_name="q_block" if transposed else "kv_block",
                names=["n_partial", "n_full"]) as loop:
        n_partial, n_full = loop.carried
        start = b.mul(loop.iv, inner_block)
        inner = b.add(start, b.arange(0, inner_block), name="rows" if transposed else "cols")
        rows, cols = (inner, outer) if transposed else (outer, inner)
        row_ok, col_ok = b.lt(rows, sq), b.lt(cols, skv)
        valid = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(col_ok, 0), name="valid")
        at = TileCoords(batch_index, head, rows, cols, sq, skv, valid)
        keep = valid
        for n, mask in enumerate(chain.ops):
            assert isinstance(mask, MaskOp)
            keep = b.and_(keep, chain.keep(b, n, mask, at))
        kept = b.reduce_sum(b.reduce_sum(b.cast(keep, i32), 1), 0, name="kept")
        total = b.reduce_sum(b.reduce_sum(b.cast(valid, i32), 1), 0, name="total")
        # Full: every element kept and the keys in bounds (transposed: the queries too).
        in_bounds = b.le(b.add(b.mul(pid, bn), bn), skv) if transposed else b.le(b.add(start, bn), skv)
        if transposed:
            in_bounds = b.and_(in_bounds, b.le(b.add(start, bm), sq))
        is_full = b.and_(b.eq(kept, total), in_bounds, name="is_full")
        is_partial = b.and_(b.gt(kept, 0), b.xor(is_full, True), name="is_partial")
        for count, arg, flag in ((n_partial, outs[1], is_partial), (n_full, outs[3], is_full)):
            assert arg.ptr is not None
            row_base = b.ptr_add(arg.ptr, b.mul(b.to_i64(slot), b.to_i64(arg.strides[0])))
            b.store(row_base, b.mul(count, arg.strides[1]), loop.iv, mask=flag)
        if rank_arg is not None:
            assert rank_arg.ptr is not None
            row_base = b.ptr_add(rank_arg.ptr, b.mul(b.to_i64(slot), b.to_i64(rank_arg.strides[0])))
            b.store(row_base, b.mul(loop.iv, rank_arg.strides[1]), b.add(n_partial, n_full, name="rank"),
                    mask=b.gt(kept, 0))
        loop.yield_(b.add(n_partial, b.cast(is_partial, i32)), b.add(n_full, b.cast(is_full, i32)))
    n_partial, n_full = loop.results
    for arg, value in ((outs[0], n_partial), (outs[2], n_full)):
        assert arg.ptr is not None
        b.store(arg.ptr, b.mul(slot, arg.strides[0]), value)
    kernel = b.finish()
    grid = [host.cdiv(kv_len, bn, f"{tag}_grid_n") if transposed else host.cdiv(q_len, bm, f"{tag}_grid_m"),
            host.mul(batch, map_heads, f"{tag}_grid_bh"), one]
    host.launch(name, grid, sig.host_operands())
    return block_map, kernel
