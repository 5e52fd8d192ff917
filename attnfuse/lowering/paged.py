"""Paged KV caches in the kernels: K/V tiles gathered row by row through the block table.

The forward kernel and the split-KV kernel of a paged program (`attnfuse.analysis.paging`)
read K and V from page pools `[num_pages, Hkv, page_size, D]`. A program first reads its
sequence's key count (`PageView.enter`):

```
kv_len = min(max(kv_lens[b], 0), max_pages * page_size)     # never past the block table
```

and then works on logical key indices as for a contiguous cache: loop bounds, masks,
splits. A K/V tile of `n` keys starts at a multiple of `n` (`PageView.tile`), so for page
sizes that `n` divides or that divide `n` its rows are found without a division per key:

```
page_size % n == 0:  page = block_table[b, start / page_size]              # one entry
                     K, V bases advance to that page; row i is (start % page_size + i)
n % page_size == 0:  page = block_table[b, start / page_size + i / page_size]  # per key
  (narrow kernels)   row i = page * stride_page + (i % page_size) * stride_row
otherwise:           page = block_table[b, j / page_size], row = j % page_size   (key j)
```

so a tile may span several pages and any page size works (vLLM's 16, FlashInfer's 1..):
one gathered load per K and V row, `D` contiguous elements, as for a contiguous cache.
Row offsets are i64, or i32 in kernels built `narrow` (`PagedKV.narrow`: about a third
of the split kernel's instructions per tile went to 64-bit address arithmetic), which the
host launches only for pools whose every element an i32 offset reaches (`host.fits_i32`).
Page numbers are clamped to `[0, num_pages)`, so a bad block table gives wrong numbers
but never reads outside the pool; `ArgumentChecker.page_values` checks the values on the
host when asked (a synchronisation).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import SSAValue

from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.dialects.tile_types import shape_of
from attnfuse.lowering.signature import KernelSignature, ScalarArg, TensorArg


@dataclass(frozen=True)
class PagedKV:
    """Host values of a paged program: block table, key counts, page count."""

    block_table: SSAValue
    kv_lens: SSAValue
    num_pages: SSAValue
    page_size: int
    narrow: bool = False
    """Row offsets in i32 (the pools fit `host.fits_i32`), else i64."""


class PageView:
    """Kernel side of `PagedKV`: declares its arguments (before `KernelSignature.start`);
    `enter` places a program on its sequence, `tile` finds a tile's rows from the pool
    bases (`pool_base`)."""

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

    def tile(self, b: TileBuilder, bases: tuple[SSAValue, SSAValue], start: SSAValue, cols: SSAValue,
             col_ok: SSAValue | None) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue]:
        """(K base, K row offsets, V base, V row offsets) of the tile of keys `cols` =
        `start + arange(n)`, `start` a multiple of `n` (`col_ok` None: all in bounds);
        page numbers clamped into the pool. `bases`: the K and V `pool_base`s, advanced
        to the tile's page where it lies in one."""
        k_base, v_base = bases
        n, size = shape_of(cols.type)[0], self.paged.page_size
        if size % n == 0:
            # One page: its entry is in the table, since the tile's first key is a key
            # of the sequence (loops stop at its length).
            page = self._clamp(b, self._entry(b, b.div(start, size, name="page_slot"), None))
            within = b.add(b.rem(start, size), b.arange(0, n), name="page_row")
            k_base, v_base = (b.ptr_add(base, b.mul(b.to_i64(page), b.to_i64(arg.strides[0])), name=f"{arg.name}_page")
                              for base, arg in ((k_base, self.k), (v_base, self.v)))
            return k_base, b.mul(within, self.k.strides[2]), v_base, b.mul(within, self.v.strides[2])
        if n % size == 0 and self.paged.narrow:
            # The in-page rows are the same for every tile (a register-held offset per
            # row: in the i64 kernels that pressure cost spills, the f32 forward kernel's
            # 144 bytes went to 232).
            key = b.arange(0, n)
            slot = b.add(b.div(start, size), b.div(key, size), name="page_slot")
            within = b.rem(key, size, name="page_row")
        else:
            slot, within = b.div(cols, size, name="page_slot"), b.rem(cols, size, name="page_row")
        k_rows, v_rows = self._offsets(b, self._clamp(b, self._entry(b, slot, col_ok)), within)
        return k_base, k_rows, v_base, v_rows

    def rows_to_write(self, b: TileBuilder, keys: SSAValue, ok: SSAValue) -> tuple[SSAValue, SSAValue, SSAValue]:
        """(K row offsets, V row offsets, mask) of keys `keys` to write where `ok`: the
        mask drops rows whose page is outside the pool."""
        assert self.pages.value is not None
        page = self._entry(b, b.div(keys, self.paged.page_size, name="page_slot"), ok)
        in_pool = b.and_(ok, b.and_(b.ge(page, 0), b.lt(page, self.pages.value)), name="in_pool")
        k_rows, v_rows = self._offsets(b, page, b.rem(keys, self.paged.page_size, name="page_row"))
        return k_rows, v_rows, in_pool

    def _entry(self, b: TileBuilder, slot: SSAValue, ok: SSAValue | None) -> SSAValue:
        """`block_table[b, slot]` (0 where not `ok`)."""
        assert self.table_row is not None
        at = b.mul(slot, self.table.strides[1])
        if ok is None:
            return b.load(self.table_row, at, name="page")
        return b.load(self.table_row, at, mask=ok, other=0, name="page")

    def _clamp(self, b: TileBuilder, page: SSAValue) -> SSAValue:
        assert self.pages.value is not None
        return b.minimum(b.maximum(page, 0), b.sub(self.pages.value, 1), name="page_in_pool")

    def _offsets(self, b: TileBuilder, page: SSAValue, within: SSAValue) -> tuple[SSAValue, SSAValue]:
        """(K, V) element offsets of rows `within` of pages `page` from the pool bases."""
        if not self.paged.narrow:
            page, within = b.to_i64(page), b.to_i64(within)

        def rows(arg: TensorArg) -> SSAValue:
            page_stride, row_stride = arg.strides[0], arg.strides[2]
            if not self.paged.narrow:
                page_stride, row_stride = b.to_i64(page_stride), b.to_i64(row_stride)
            return b.add(b.mul(page, page_stride), b.mul(within, row_stride), name=f"{arg.name}_rows")

        return rows(self.k), rows(self.v)


def sequence_length(b: TileBuilder, lens: TensorArg, batch: SSAValue, capacity: SSAValue) -> SSAValue:
    """`kv_lens[batch]` clamped to `[0, capacity]`: the keys of sequence `batch` in a
    cache of `capacity` keys per sequence (paged, or contiguous with lengths)."""
    assert lens.ptr is not None
    length = b.load(lens.ptr, b.mul(batch, lens.strides[0]), name="kv_seq_len")
    return b.minimum(b.maximum(length, 0), capacity, name="kv_len")


__all__ = ["PageView", "PagedKV", "sequence_length"]
