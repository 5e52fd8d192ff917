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
