"""Whether the tiles of a program's kernels fit Triton's block limit, checked before lowering.

Kernels hold `[rows, columns]` tiles, columns padded to powers of two: `block-m` rows of Q
and of the accumulator, `block-n` rows of K and V, and 64 rows of each part (a RoPE half,
or the whole row) in the pre-kernels and RoPE tables of Q/K transforms. The verifier
admits any head dim of which 16 rows fit, so a head dim too wide for the blocks a pass
uses is reported here, at `attn.scores`, rather than by a tile deep inside a kernel.
"""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType, f32
from xdsl.ir import Attribute

from attnfuse.dialects.tile_types import MAX_TILE_NUMEL
from attnfuse.lowering.prekernel import ROWS_PER_PROGRAM
from attnfuse.lowering.qk_side import padded, side_layout
from attnfuse.program import AttentionProgram, ProgramError

SHARED_MEMORY_BUDGET = 227 * 1024
"""Bytes of shared memory a program may use on an H100/H200 SM (232448, the limit Triton
reports for sm_90)."""


def q_tile_copies(element_type: Attribute, f32_dot: str) -> int:
    """Copies of the Q tile Triton 3.6 keeps in shared memory: two for f32 dots on the
    tensor cores (`f32_dot` not `ieee`; measured from sm_90 compiles at head dims 64, 128
    and 256), else one."""
    return 2 if element_type == f32 and f32_dot != "ieee" else 1


def kv_stages(
    q_type: TensorType, v_type: TensorType, block_m: int, block_n: int, budget: int, *,
    k_in_kernel: bool, f32_dot: str, paged: bool,
) -> int:
    """The `num_stages` of a KV loop: the deepest of 3 and 2 stages whose tiles fit
    `budget` bytes of shared memory, else 1. Counted in the input element size: the Q
    tile (`block_m` rows, `q_tile_copies` of it), two K-sized buffers when K is
    transformed in the kernel (the loaded and the transformed tile), and per stage one K
    and one V tile of `block_n` rows (head dims padded).

    A paged cache adds two stages: its K/V row addresses come from a block-table load,
    and Triton 3.6's software pipeliner spends stages on that load before the K/V loads
    that depend on it (sm_90 compiles of the Llama-3-8B split kernel: two K/V buffers at
    3 or 4 stages, three at 5, as the contiguous kernel has at 3;
    tests/lowering/test_paged_sm90.py). Its two tiles of `block_n` int32 page numbers are
    counted."""
    elem = 4 if q_type.element_type == f32 else 2
    d, dv = padded(q_type.get_shape()[3]), padded(v_type.get_shape()[3])
    fixed = q_tile_copies(q_type.element_type, f32_dot) * elem * block_m * d
    fixed += 2 * elem * block_n * d if k_in_kernel else 0
    fixed += 2 * 4 * block_n if paged else 0
    for stages in (3, 2):
        if fixed + stages * elem * block_n * (d + dv) <= budget:
            return stages + 2 * paged
    return 1 + 2 * paged


def check_tile_rows(program: AttentionProgram, block_m: int, block_n: int, options: str) -> None:
    """Raise a `ProgramError` at `attn.scores` when a kernel tile would have more than
    `MAX_TILE_NUMEL` elements; `options` names the pass options that set the blocks."""
    q_type = program.scores.q.type
    assert isinstance(q_type, TensorType)
    q_dim, v_dim = q_type.get_shape()[3], program.v_type.get_shape()[3]
    limits = [(max(block_m, block_n), padded(max(q_dim, v_dim)), f"blocks of {block_m} x {block_n} rows ({options})")]
    if program.q.transforms or program.k.transforms:
        part = max(p.tile_width for side in (program.q, program.k) for p in side_layout(side.transforms, q_dim))
        limits.append((ROWS_PER_PROGRAM, part, f"the {ROWS_PER_PROGRAM}-row pre-kernels and RoPE tables of Q/K transforms"))
    for rows, width, what in limits:
        if rows * width > MAX_TILE_NUMEL:
            raise ProgramError(
                f"head dim {max(q_dim, v_dim)} is too wide for {what}: a [{rows}, {width}] tile has "
                f"more than Triton's {MAX_TILE_NUMEL} elements per block",
                program.scores,
            )
