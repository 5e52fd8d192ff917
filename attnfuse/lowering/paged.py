"""Paged KV caches in the kernels: K/V tiles gathered row by row through the block table.

The forward kernel and the split-KV kernel of a paged program (`attnfuse.analysis.paging`)
read K and V from page pools `[num_pages, Hkv, page_size, D]`. A program first reads its
sequence's key count (`PageView.enter`):

```
kv_len = min(max(kv_lens[b], 0), max_pages * page_size)     # never past the block table
```

and then works on logical key indices as for a contiguous cache: loop bounds, masks,
splits. Each K/V tile of keys `j` finds its rows through the block table
(`PageView.rows`):

```
page = block_table[b, j / page_size]                        # one int32 per key of the tile
row  = page * stride_page + (j % page_size) * stride_row      (i64)
```

so a tile may span several pages and any page size works (vLLM's 16, FlashInfer's 1..):
one gathered load per K and V row, `D` contiguous elements, as for a contiguous cache.
Page numbers are clamped to `[0, num_pages)`, so a bad block table gives wrong numbers
but never reads outside the pool; `ArgumentChecker.page_values` checks the values on the
host when asked (a synchronisation).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import SSAValue

from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.lowering.signature import KernelSignature, ScalarArg, TensorArg


@dataclass(frozen=True)
class PagedKV:
    """Host values of a paged program: block table, key counts, page count."""

    block_table: SSAValue
    kv_lens: SSAValue
    num_pages: SSAValue
    page_size: int


class PageView:
    """Kernel side of `PagedKV`: declares its arguments (before `KernelSignature.start`);
    `enter` places a program on its sequence, `rows` gathers a tile's rows."""

    def __init__(self, sig: KernelSignature, paged: PagedKV, k: TensorArg, v: TensorArg) -> None:
        self.paged = paged
        self.table = sig.tensor("block_table", paged.block_table)
        self.lens = sig.tensor("kv_lens", paged.kv_lens)
        self.pages: ScalarArg = sig.scalar("num_pages", paged.num_pages)
        self.k, self.v = k, v
        self.table_row: SSAValue | None = None

    def enter(self, b: TileBuilder, batch: SSAValue, capacity: SSAValue) -> SSAValue:
        """The key count of sequence `batch`, clamped to `[0, capacity]` (`capacity`:
        the host's `max_pages * page_size`, the keys a block table row holds)."""
        assert self.table.ptr is not None
        self.table_row = self.table.base(b, batch)
        return sequence_length(b, self.lens, batch, capacity)

    def pool_base(self, b: TileBuilder, arg: TensorArg, head: SSAValue) -> SSAValue:
        """`arg`'s pointer at head `head` of page 0."""
        assert arg.ptr is not None
        return b.ptr_add(arg.ptr, b.mul(b.to_i64(head), b.to_i64(arg.strides[1])), name=f"{arg.name}_pool")

    def rows(self, b: TileBuilder, cols: SSAValue, col_ok: SSAValue | None) -> tuple[SSAValue, SSAValue]:
        """(K row offsets, V row offsets) of keys `cols` ([BN] i32; `col_ok` None: all
        in bounds) to read, i64 element offsets from `pool_base`; page numbers clamped
        into the pool."""
        assert self.pages.value is not None
        page = self._page(b, cols, col_ok)
        page = b.minimum(b.maximum(page, 0), b.sub(self.pages.value, 1), name="page_in_pool")
        return self._offsets(b, page, cols)

    def rows_to_write(self, b: TileBuilder, keys: SSAValue, ok: SSAValue) -> tuple[SSAValue, SSAValue, SSAValue]:
        """(K row offsets, V row offsets, mask) of keys `keys` to write where `ok`: the
        mask drops rows whose page is outside the pool."""
        assert self.pages.value is not None
        page = self._page(b, keys, ok)
        in_pool = b.and_(ok, b.and_(b.ge(page, 0), b.lt(page, self.pages.value)), name="in_pool")
        k_rows, v_rows = self._offsets(b, page, keys)
        return k_rows, v_rows, in_pool

    def _page(self, b: TileBuilder, keys: SSAValue, ok: SSAValue | None) -> SSAValue:
        """`block_table[b, keys / page_size]` (0 where not `ok`)."""
        assert self.table_row is not None
        at = b.mul(b.div(keys, self.paged.page_size, name="page_slot"), self.table.strides[1])
        if ok is None:
            return b.load(self.table_row, at, name="page")
        return b.load(self.table_row, at, mask=ok, other=0, name="page")

    def _offsets(self, b: TileBuilder, page: SSAValue, keys: SSAValue) -> tuple[SSAValue, SSAValue]:
        within = b.to_i64(b.rem(keys, self.paged.page_size, name="page_row"))
        page64 = b.to_i64(page)
        k_rows, v_rows = (b.add(b.mul(page64, b.to_i64(arg.strides[0])), b.mul(within, b.to_i64(arg.strides[2])),
                                name=f"{arg.name}_rows") for arg in (self.k, self.v))
        return k_rows, v_rows


def sequence_length(b: TileBuilder, lens: TensorArg, batch: SSAValue, capacity: SSAValue) -> SSAValue:
    """`kv_lens[batch]` clamped to `[0, capacity]`: the keys of sequence `batch` in a
    cache of `capacity` keys per sequence (paged, or contiguous with lengths)."""
    assert lens.ptr is not None
    length = b.load(lens.ptr, b.mul(batch, lens.strides[0]), name="kv_seq_len")
    return b.minimum(b.maximum(length, 0), capacity, name="kv_len")


__all__ = ["PageView", "PagedKV", "sequence_length"]
