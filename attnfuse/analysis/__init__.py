"""Compile-time facts that several passes (and the cost model) share.

* `bands`: the band `lower <= kv - q - diag <= upper` a mask keeps, and how many key rows
  a kernel visiting only the tiles of a band loads (plain Python: the cost model uses it);
* `masks`: the band, prefix and runtime block map of a program's masks;
* `packing`: the cu_seqlens operands of a packed batch, and what a packed program holds;
* `paging`: the block table and lengths of a paged KV cache, and what a paged program holds;
* `tile_plan`: the `#attn.tile_plan` that `mask-tiling` records for the lowering.
"""
