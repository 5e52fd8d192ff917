"""`mask-tiling{block-m=128 block-n=64}`: plan which (q block, kv block) tiles run.

Analyses every `attn.mask` of a program (`attnfuse.analysis.masks`) and records a
`#attn.tile_plan` on its `attn.online_softmax` (see that attribute for the fields):

* affine masks (causal of either alignment, sliding windows, and custom predicates that
  compare `kv_idx - q_idx` with constants) become a *band*
  `lower <= kv - q - diag <= upper`, from which `lower-to-tile` derives, per q block, the
  KV loop bounds (empty tiles are never visited) and the range of full tiles (run
  without mask code);
* `prefix_lm` adds a prefix (static, or `-1` for its per-batch operand);
* data-dependent masks (document ids, other predicates) ask for a block map built on the
  GPU at run time (`runtime_block_map`), which still skips empty tiles.

```mlir
%o = attn.online_softmax %m, %v : !attn.scores<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
```
becomes, for a causal mask,
```mlir
%o = attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<128x64, band [?, 0], exact>} : ...
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from attnfuse.analysis.tile_plan import resolve_f32_dot, tile_plan
from attnfuse.program import ProgramError, analyze, find_functions


@dataclass(frozen=True)
class MaskTilingPass(ModulePass):
    """Record the tile plan (loop bounds, full tiles, block map) of every program."""

    name = "mask-tiling"
    requires: ClassVar[tuple[str, ...]] = ("online-softmax",)

    block_m: int = 0
    """Query rows per program; 0 picks `default_block_sizes` (256 when K is transformed
    in the kernel, else 128)."""
    block_n: int = 0
    """Keys per KV block; 0 picks `default_block_sizes` (128 or 64)."""
    f32_dot: str = ""
    """Precision of the dots of f32 programs, which the default f32 tiles follow (as
    `lower-to-tile`; empty: `DEFAULT_F32_DOT`, tf32x3)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        f32_dot = resolve_f32_dot(self.name, self.f32_dot)
        for size, what in ((self.block_m, "block-m"), (self.block_n, "block-n")):
            if size and (size < 16 or size & (size - 1)):
                raise ValueError(f"mask-tiling: {what} must be a power of two >= 16, got {size}")
        for function in find_functions(op):
            program = analyze(function)
            if program.online is None:
                raise ProgramError("mask-tiling runs after online-softmax", program.scores)
            program.online.properties["tile_plan"] = tile_plan(program, self.block_m, self.block_n, f32_dot)
