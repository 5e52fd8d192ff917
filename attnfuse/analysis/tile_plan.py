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
from attnfuse.analysis.packing import packed_batch
from attnfuse.dialects.attn import QKNormOp, RopeOp, TilePlanAttr
from attnfuse.dialects.tile_compute import DotOp
from attnfuse.program import AttentionProgram

DEFAULT_F32_DOT = "tf32x3"
"""Precision of the dots of f32 programs where `f32-dot` is left unset: three TF32
tensor-core products per dot, about fp32 accuracy. On the H200 (run 26, t5_bias,
B = 2, S = 8192) its forward was 5.8x faster than IEEE FMA dots and its output's error
against float64 lower (1.3e-5) than both the IEEE kernel's and flex_attention's (2.1e-5,
IEEE under PyTorch's default matmul precision). `ieee` multiplies on the FMA units."""

FMA_SCORES_PER_THREAD = 8
"""Elements of the [BM, BN] score tile per thread in kernels whose dots run on the FMA
units (f32 inputs: `tl.dot(..., input_precision="ieee")`). Triton's FMA dot keeps the
operand rows and columns of a thread's outputs in registers for the whole reduction:
at 16 or more outputs per thread (D = 64, with a bias tile) ptxas gives up on register
allocation (32 registers, 7-56 KiB of spills per thread); at 8 it spills at most a few
dozen bytes (`bench/sm90_resources.py`, t5_bias)."""


def resolve_f32_dot(pass_name: str, value: str) -> str:
    """The `f32-dot` option of a pass: `value`, or :data:`DEFAULT_F32_DOT` when empty;
    a precision `tile.dot` does not know is an error."""
    if not value:
        return DEFAULT_F32_DOT
    if value not in DotOp.PRECISIONS:
        raise ValueError(f"{pass_name}: f32-dot must be one of {', '.join(DotOp.PRECISIONS)}, got {value!r}")
    return value


def f32_inputs(program: AttentionProgram) -> bool:
    """Whether the program multiplies f32 tiles (its dots take an `f32-dot` precision)."""
    return program.scores.q.type.element_type == f32  # type: ignore[attr-defined]


def fma_dots(program: AttentionProgram, f32_dot: str = DEFAULT_F32_DOT) -> bool:
    """Whether the program's dots run on the FMA units (f32 inputs, IEEE products)."""
    return f32_inputs(program) and f32_dot == "ieee"


def _head_dims(program: AttentionProgram) -> tuple[int, int]:
    q_type = program.scores.q.type
    assert isinstance(q_type, TensorType)
    return q_type.get_shape()[3], program.v_type.get_shape()[3]


def _narrow_16bit(program: AttentionProgram) -> bool:
    return max(_head_dims(program)) <= 128 and not f32_inputs(program)


def k_transformed_in_kernel(program: AttentionProgram) -> bool:
    """Whether the forward kernel transforms K tiles itself (`fused` placements)."""
    return any(t.str_option("placement") != "prekernel" for t in program.k.transforms)


FUSED_TILES = (256, 64)
"""`default_block_sizes` of a 16-bit program with head dims <= 128 whose K is transformed
in the kernel (see there)."""


def default_block_sizes(
    program: AttentionProgram, k_in_kernel: bool | None = None, f32_dot: str = DEFAULT_F32_DOT
) -> tuple[int, int]:
    """(query rows, keys) per block when `mask-tiling` leaves them at 0; `k_in_kernel`
    None reads the placement `rope-fusion` gave K's transforms; `f32_dot` is the
    precision of f32 dots.

    - K transformed in the kernel, 16-bit, head dims <= 128: 256 x 64. Each K tile is
      transformed once per q block that visits it, so taller q blocks halve that work;
      256 x 64 with 8 warps and 3 stages fits an SM and was 11% faster than 128 x 128
      for fused Llama-3-8B at S = 16384 (H200, run 14).
    - Other 16-bit inputs with head dims <= 128: 128 x 128 (3 stages fit; the fastest
      forward measured for Llama-3-8B, docs/benchmarks.md run 12).
    - f32 inputs with FMA dots (`ieee`): 64 x 32 (8 warps: `FMA_SCORES_PER_THREAD`).
    - f32 inputs with tensor-core dots: 128 x 64 at head dims <= 64 (t5_bias, run 26);
      wider heads 64 x 32, whose Q tile (kept twice) and K/V stages fit an SM's shared
      memory up to head dim 256 (128 x 64 at head dim 128 would fit one stage only).
    - Else 128 x 64 (wider rows leave room for fewer stages of 128 keys).
    """
    if f32_inputs(program):
        narrow = max(_head_dims(program)) <= 64
        return (64, 32) if fma_dots(program, f32_dot) or not narrow else (128, 64)
    if not _narrow_16bit(program):
        return 128, 64
    if k_in_kernel is None:
        k_in_kernel = k_transformed_in_kernel(program)
    return FUSED_TILES if k_in_kernel else (128, 128)


def tile_plan(
    program: AttentionProgram, block_m: int = 0, block_n: int = 0, f32_dot: str = DEFAULT_F32_DOT
) -> TilePlanAttr:
    """The plan of `program` with tiles of `block_m` x `block_n` (0: `default_block_sizes`
    for f32 dots of precision `f32_dot`).

    A packed batch has no runtime block map: its kernels never leave a sequence, and a
    data-dependent mask is evaluated on every tile of it; nor has a KV cache read through
    `kv_lens` (the map kernel would read K contiguously, and not per sequence)."""
    plan = plan_masks(effective_masks(program.score_ops))
    band = plan.band
    default_m, default_n = default_block_sizes(program, f32_dot=f32_dot)
    return TilePlanAttr(
        block_m or default_m,
        block_n or default_n,
        lower=None if band is None else band.lower,
        upper=None if band is None else band.upper,
        align="top_left" if band is None else band.align,
        exact=plan.exact,
        prefix=plan.prefix,
        runtime_block_map=plan.runtime_map and packed_batch(program) is None and program.scores.kv_lens is None,
    )


def default_num_warps(program: AttentionProgram, block_m: int, block_n: int, f32_dot: str = DEFAULT_F32_DOT) -> int:
    """Warps per program of a kernel on [block_m, block_n] score tiles when a pass leaves
    them at 0: 8 for 128-row blocks, else 4; with FMA dots (f32, `ieee`) as many as hold
    `FMA_SCORES_PER_THREAD` scores per thread, between 4 and 8."""
    if fma_dots(program, f32_dot):
        return min(8, max(4, block_m * block_n // (32 * FMA_SCORES_PER_THREAD)))
    return 8 if block_m >= 128 else 4


def backward_block_sizes(program: AttentionProgram) -> tuple[int, int]:
    """(query rows, keys) per block of the backward kernels when `lower-backward` leaves
    them at 0: 64 x 64; for f32 inputs 32 x 32 up to head dim 128, 16 x 16 beyond. With
    FMA dots the dK/dV kernel's five dots at 64 x 64 made ptxas spill 56 KiB per thread
    (32 x 32 with 4 warps spills none); with `tf32x3` dots t5_bias's forward + backward
    took 57.9 ms at 32 x 32 and 67.9 ms at 64 x 64 (run 26); at head dim 256 the 32 x 32
    kernels fall back to 32 registers (dK/dV: 62 KiB of spills per thread with `tf32x3`,
    98 KiB with FMA dots), 16 x 16 to 0.5-1.7 KiB (sm_90 compiles)."""
    if not f32_inputs(program):
        return 64, 64
    return (32, 32) if max(_head_dims(program)) <= 128 else (16, 16)


def in_kernel_transforms(transforms: list[RopeOp | QKNormOp]) -> list[RopeOp | QKNormOp]:
    """The Q/K transforms applied inside the attention kernels (placement not `prekernel`)."""
    return [t for t in transforms if t.str_option("placement") != "prekernel"]


def prekernel_transforms(transforms: list[RopeOp | QKNormOp]) -> list[RopeOp | QKNormOp]:
    """The Q/K transforms applied by pre-kernels (placement `prekernel`)."""
    return [t for t in transforms if t.str_option("placement") == "prekernel"]


def forward_stores_q(program: AttentionProgram) -> bool:
    """Whether the forward kernels (the split-KV kernel of decoding calls too) can store
    Q as their in-kernel transforms leave it, for the backward to read
    (`attnfuse.saved`): not the rows of a packed batch, which they address through its
    schedule, nor with a KV cache read through `kv_lens` (no backward)."""
    return packed_batch(program) is None and program.scores.kv_lens is None

