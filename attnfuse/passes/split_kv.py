"""`split-kv{splits=auto}`: plan split-KV decoding for programs whose blocks allow it.

Records a `#attn.split_kv` on the `attn.online_softmax` of every program that can run
split over its keys with the query rows of a GQA group packed into one tile
(`attnfuse.analysis.split_kv`). `lower-to-tile` then builds a split kernel and a
combine kernel next to the usual forward kernel, and host code that runs them for calls
with few queries (`Sq * group <= rows`) and the usual kernel otherwise. A program that
cannot be split (dropout; V heads other than K heads; a group too large for a tile) is
left as it is, and the reason is logged (logger `attnfuse.passes.split_kv`, INFO).

```mlir
%o = attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<128x128, band [?, 0] bottom_right, exact>} : ...
```
becomes, with 32 query heads over 8 KV heads,
```mlir
%o = attn.online_softmax %m, %v {tile_plan = ...,
    split_kv = #attn.split_kv<64x64, group 4, splits auto, waves 1, min_blocks 1>} : ...
```
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from attnfuse.analysis.paging import paged_cache
from attnfuse.analysis.split_kv import decode_tiles, default_rows, split_kv_blocker, wide_block_n
from attnfuse.dialects.attn_split_kv import AUTO, SplitKVAttr
from attnfuse.program import ProgramError, analyze, find_functions

logger = logging.getLogger(__name__)


def _check_pow2(value: int, what: str) -> None:
    if value and (value < 16 or value & (value - 1)):
        raise ValueError(f"split-kv: {what} must be a power of two >= 16, got {value}")


@dataclass(frozen=True)
class SplitKVPass(ModulePass):
    """Plan split-KV decoding (`#attn.split_kv`) for every program that allows it."""

    name = "split-kv"
    requires: ClassVar[tuple[str, ...]] = ("online-softmax", "mask-tiling")

    splits: int | str = "auto"
    """`auto`: the host code picks the split count per call shape from the batch, the KV
    heads, the keys visited and the device's SM count; or a fixed count (>= 1)."""
    rows: int = 0
    """Packed query rows per tile (a power of two >= 16); 0 picks `16 * group`, at most
    128 (16-bit inputs, head dims <= 128), 64 (wider heads) or 32 (f32)."""
    block_n: int = 0
    """Keys per KV block; 0 picks 64 (16-bit inputs, head dims <= 128), 32 or 16 (f32)."""
    waves: int = 0
    """`auto` aims at this many programs per SM; 0: 1, or 2 on a paged cache without the
    wide split kernel (its per-tile block-table load wants more programs to hide behind;
    the wide kernel, one program per SM, is faster in one wave: H200, Llama-3-8B, Sq = 1,
    pages of 16, CUDA graphs, B = 1, Skv = 8192 12.9 us against 14.9 with 2 waves;
    B = 16, Skv = 1024 20.8 against 27.6; run 39, call B)."""
    min_blocks: int = 0
    """`auto` gives each split at least this many KV blocks where that keeps every SM
    busy (it never leaves SMs idle); 0: as `waves`' default."""
    merge: bool = True
    """The 16-row split kernels' last program per (batch, KV head) merges up to
    `merge_rows_limit` splits itself instead of the combine kernel (one launch fewer;
    B = 1, Sq = 1, CUDA graphs on the H200: Skv = 8192 9.7 us against 10.4, 32768
    35.8 against 36.6, but 1024 5.8 against 5.6; run 39, call A). False: always the
    combine kernel."""
    persistent: bool = True
    """Where the wide split kernel exists, a persistent one takes the calls of one split
    with more (batch, KV head) pairs than two per SM and short caches (two programs per
    SM walk the pairs; `split_host.persistent_taken`, docs/inference.md#tiles); recorded
    as `persistent 1` in the plan. False: those calls take the wide kernel."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        splits = self._splits()
        _check_pow2(self.rows, "rows")
        _check_pow2(self.block_n, "block-n")
        for value, what in ((self.waves, "waves"), (self.min_blocks, "min-blocks")):
            if value < 0:
                raise ValueError(f"split-kv: {what} must be >= 1 (or 0: by the cache's form), got {value}")
        for function in find_functions(op):
            program = analyze(function)
            online = program.online
            if online is None or online.tile_plan is None:
                raise ProgramError("split-kv runs after online-softmax and mask-tiling", program.scores)
            rows = self.rows or default_rows(program)
            reason = split_kv_blocker(program, rows)
            if reason is not None:
                logger.info("@%s: no split-KV decoding (the usual forward kernel serves every call): %s",
                            function.sym_name.data, reason)
                continue
            hq, hk, _ = program.heads
            block_n = self.block_n or decode_tiles(program)[1]
            wide = wide_block_n(program, rows, block_n, hq // hk)
            deep = 2 if paged_cache(program) is not None and wide is None else 1
            online.properties["split_kv"] = SplitKVAttr(
                rows, block_n, group=hq // hk, splits=splits, waves=self.waves or deep,
                min_blocks=self.min_blocks or deep, merge=self.merge, persistent=self.persistent and wide is not None)

    def _splits(self) -> int:
        if self.splits == "auto":
            return AUTO
        if isinstance(self.splits, int) and self.splits >= 1:
            return self.splits
        raise ValueError(f"split-kv: splits must be auto or a count >= 1, got {self.splits}")
