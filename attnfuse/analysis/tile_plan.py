"""The tile plan of an attention program: block sizes and the tiles its masks let a kernel skip.

`mask-tiling` records it on `attn.online_softmax`; the cost model shares the default
block sizes.

```mlir
%o = attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<128x128, band [?, 0], exact>} : ...
```
"""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType, f32

from attnfuse.analysis.masks import effective_masks, plan_masks
from attnfuse.dialects.attn import TilePlanAttr
from attnfuse.program import AttentionProgram

DEFAULT_BLOCK_M = 128
"""Query rows per program unless `mask-tiling{block-m}` says otherwise."""


def default_block_n(program: AttentionProgram) -> int:
    """128 keys per block for 16-bit inputs with Q/K and V head dims up to 128 (with
    128-row q blocks, 3 pipeline stages then fit an H200 SM: the fastest forward measured
    for Llama-3-8B, docs/benchmarks.md run 12), else 64 (wider rows or f32 leave room for
    fewer stages of 128 keys)."""
    q_type = program.scores.q.type
    assert isinstance(q_type, TensorType)
    v_type = program.v_type
    narrow = max(q_type.get_shape()[3], v_type.get_shape()[3]) <= 128
    return 128 if narrow and q_type.element_type != f32 else 64


def tile_plan(program: AttentionProgram, block_m: int = 0, block_n: int = 0) -> TilePlanAttr:
    """The plan of `program` with tiles of `block_m` x `block_n` (0: the defaults)."""
    plan = plan_masks(effective_masks(program.score_ops))
    band = plan.band
    return TilePlanAttr(
        block_m or DEFAULT_BLOCK_M,
        block_n or default_block_n(program),
        lower=None if band is None else band.lower,
        upper=None if band is None else band.upper,
        align="top_left" if band is None else band.align,
        exact=plan.exact,
        prefix=plan.prefix,
        runtime_block_map=plan.runtime_map,
    )
