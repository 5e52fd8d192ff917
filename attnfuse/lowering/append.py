"""Appending new keys and values to a paged KV cache, RoPE applied to the keys.

`build_append` returns a module with a host function and one kernel. The host function
takes the pools, the block table, the key counts *before* the append and the new
tokens, and launches the kernel on a `[cdiv(Sn, 64), B * Hkv, 1]` grid:

```mlir
func.func @append_paged_kv(%k_cache: tensor<?x8x16x128xbf16>, %v_cache: tensor<?x8x16x128xbf16>,
                           %block_table: tensor<?x?xi32>, %kv_lens: tensor<?xi32>,
                           %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) {
  ...
  host.launch @append_paged_kv_kernel[%grid_s, %grid_bh, %one] (...) : ...
  func.return
}
```

New token `i` of sequence `b` becomes key `j = kv_lens[b] + i`: row `j % page_size` of
page `block_table[b, j / page_size]`, K rotated at position `j` (plus the rope's
`offset`) by the rope's own code (`SideTransforms`: every style, partial rotary dims
and frequency scaling of `attn.rope`), V copied. Rows past the block table's
`max_pages * page_size` keys, or in pages outside the pool, are not written (the
kernel never writes outside the pools; `attnfuse.inference.append_paged_kv` can check
the values first).
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, ModuleOp, TensorType, f32, i32
from xdsl.ir import Block, Region
from xdsl.rewriter import InsertPoint

from attnfuse.analysis.rope import rope_inverse_frequencies
from attnfuse.dialects.attn import RopeOp
from attnfuse.dialects.host import DimOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.lowering.forward import load_rows
from attnfuse.lowering.host_code import HostCode
from attnfuse.lowering.paged import PagedKV, PageView
from attnfuse.lowering.qk_side import SideContext, SideTransforms, load_parts, padded, partition, store_parts
from attnfuse.lowering.signature import KernelSignature

ROWS_PER_PROGRAM = 64
"""New tokens one program appends (per batch element and KV head)."""


def build_append(name: str, k_pool: TensorType, v_pool: TensorType, rope: RopeOp | None) -> ModuleOp:
    """The host function `@name` and its kernel `@name_kernel` (see the module docstring)."""
    heads, page_size, head_dim = k_pool.get_shape()[1:]
    v_dim = v_pool.get_shape()[3]
    new_k = TensorType(k_pool.element_type, [DYNAMIC_INDEX, heads, DYNAMIC_INDEX, head_dim])
    new_v = TensorType(v_pool.element_type, [DYNAMIC_INDEX, heads, DYNAMIC_INDEX, v_dim])
    inputs = [k_pool, v_pool, TensorType(i32, [DYNAMIC_INDEX, DYNAMIC_INDEX]), TensorType(i32, [DYNAMIC_INDEX]),
              new_k, new_v]
    block = Block(arg_types=inputs)
    for arg, arg_name in zip(block.args, ("k_cache", "v_cache", "block_table", "kv_lens", "k", "v")):
        arg.name_hint = arg_name
    function = func.FuncOp(name, func.FunctionType.from_lists(inputs, []), Region(block))
    k_cache, v_cache, table, kv_lens, k, v = block.args
    ret = func.ReturnOp()
    block.add_op(ret)
    host = HostCode(InsertPoint.before(ret))
    batch = host.emit(DimOp(k, 0), "batch")
    new_tokens = host.emit(DimOp(k, 2), "new_tokens")
    capacity = host.mul(host.emit(DimOp(table, 1), "max_pages"), page_size, "capacity")
    paged = PagedKV(table, kv_lens, host.emit(DimOp(k_cache, 0), "num_pages"), page_size)

    sig = KernelSignature()
    k_pool_arg, v_pool_arg = sig.tensor("Kcache", k_cache), sig.tensor("Vcache", v_cache)
    pages = PageView(sig, paged, k_pool_arg, v_pool_arg)
    k_arg, v_arg = sig.tensor("K", k), sig.tensor("V", v)
    layout = partition(rope, head_dim)
    side = SideTransforms([rope] if rope is not None else [],
                          SideContext(sig, head_dim, lambda op: host.table(rope_inverse_frequencies(op))), "k")
    tokens_arg, capacity_arg = sig.scalar("Sn", new_tokens), sig.scalar("capacity", capacity)
    kernel_name = f"{name}_kernel"
    b = sig.start(kernel_name, num_warps=4, num_stages=1, launch={})
    assert tokens_arg.value is not None and capacity_arg.value is not None
    pid_bh = b.program_id(1, name="pid_bh")
    seq, head = b.div(pid_bh, heads, name="batch"), b.rem(pid_bh, heads, name="head")
    rows = b.add(b.mul(b.program_id(0), ROWS_PER_PROGRAM), b.arange(0, ROWS_PER_PROGRAM), name="rows")
    start = pages.enter(b, seq, capacity_arg.value)
    keys = b.add(start, rows, name="keys")
    row_ok = b.and_(b.lt(rows, tokens_arg.value), b.lt(keys, capacity_arg.value), name="row_ok")
    k_rows, v_rows, ok = pages.rows_to_write(b, keys, row_ok)

    parts = load_parts(b, k_arg, k_arg.base(b, seq, head), rows, row_ok, layout)
    if rope is not None:
        parts = {r: b.cast(t, f32) for r, t in parts.items()}
        parts = side.apply(b, parts, layout, keys, seq, row_ok)
    store_parts(b, k_pool_arg, pages.pool_base(b, k_pool_arg, head), keys, ok, layout, parts, row_offsets=k_rows)
    values = load_rows(b, v_arg, v_arg.base(b, seq, head), rows, row_ok, v_dim, False)
    d = b.arange(0, padded(v_dim))
    offs = b.add(b.expand_dims(v_rows, 1), b.expand_dims(b.mul(d, v_pool_arg.strides[3]), 0))
    mask = b.and_(b.expand_dims(ok, 1), b.expand_dims(b.lt(d, v_dim), 0))
    b.store(pages.pool_base(b, v_pool_arg, head), offs, b.cast(values, v_pool.element_type), mask=mask)
    kernel: KernelOp = b.finish()

    one = host.const(1, "one")
    grid = [host.cdiv(new_tokens, ROWS_PER_PROGRAM, "grid_s"), host.mul(batch, heads, "grid_bh"), one]
    host.launch(kernel_name, grid, sig.host_operands())
    return ModuleOp([function, kernel])


__all__ = ["ROWS_PER_PROGRAM", "build_append"]
