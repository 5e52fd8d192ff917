"""Whether a program can decode split over its keys, and the tiles it would use.

Decoding runs a few new queries (`Sq` = 1..16) against a long KV cache. The split-KV
lowering packs the query rows of all `group = Hq / Hkv` heads that share a KV head into
one tile of `rows` rows (row `r`: query `r / group` of head `kv_head * group + r % group`),
so each K/V tile is loaded once per group, and splits the keys over several programs
whose partial results a combine kernel merges (docs/inference.md).

`split-kv` asks `split_kv_blocker` whether every building block of a program works in
that form and records `decode_tiles` as a `#attn.split_kv`; `lower-to-tile` builds the
kernels from it.
"""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType, f32

from attnfuse.lowering.qk_side import padded
from attnfuse.program import AttentionProgram

DECODE_Q_ROWS = 16
"""Queries per call the default packing is sized for (a decode step, or a few
speculative tokens): `rows = group * 16`, rounded up to a power of two."""


SMALL_ROWS = 16
"""Packed rows of the second, smaller split kernel built beside a taller one: a decode
step of one token (`Sq * group <= 16`, e.g. Sq <= 4 at group 4) walks its keys with a
16-row tile (fewer registers and shared memory per program; 4-11% faster than a 64-row
tile at B = 1, Skv <= 8192 on the H200, run 30)."""


WIDE_BLOCK_N = 128
"""Keys per KV block of the wide split kernel: 16-row tiles of 128 keys, three pipeline
stages in the whole of an SM's shared memory, for calls whose programs fit one wave and
whose splits walk at least `WIDE_MIN_BLOCKS` blocks of the plan. More bytes in flight
per SM: at Sq = 1 (H200, CUDA graphs, split kernel + combine) B = 1, Skv = 8192 took
11.42 us against 12.48 with 64-key blocks at three stages (half the shared memory);
Skv = 32768 37.7 against 39.1, Skv = 131072 126.5 against 133.2; B = 16, Skv = 8192
123.7 against 130.8 (run 38, call B)."""

WIDE_MIN_BLOCKS = 4
"""Blocks of the plan (64 keys) a split walks, at least, for the wide kernel to take a
call: with fewer, 128-key blocks leave splits empty or half used (B = 1, Skv = 1024:
16 splits of 64 keys, 6.1 us, against 8 splits of 128 keys at two stages, 6.5 us;
run 38, call B)."""


def wide_block_n(program: AttentionProgram, rows: int, block_n: int, group: int) -> int | None:
    """Keys per block of the wide split kernel beside a plan of `rows` x `block_n` tiles
    for GQA groups of `group` heads, or None where there is none: only beside a taller
    tile than `SMALL_ROWS` rows that a group fits in, and beside the default tiles of
    16-bit inputs with head dims up to 128 (`decode_tiles` 128 x 64)."""
    if not group <= SMALL_ROWS < rows:
        return None
    return WIDE_BLOCK_N if decode_tiles(program) == (128, 64) and block_n == 64 else None


def _head_dims(program: AttentionProgram) -> tuple[int, int]:
    q_type = program.scores.q.type
    assert isinstance(q_type, TensorType)
    return q_type.get_shape()[3], program.v_type.get_shape()[3]


def decode_tiles(program: AttentionProgram) -> tuple[int, int]:
    """(most packed rows, keys per KV block) of a split kernel tile without register
    spills on sm_90 (tests/lowering/test_split_kv_sm90.py): 128 x 64 for 16-bit inputs
    with head dims up to 128, 64 x 32 for wider heads, 32 x 16 for f32 inputs (sized
    for FMA dots from registers, `f32-dot=ieee`; the `tf32x3` default keeps them, not
    tuned for the tensor cores). The K and V tiles of three pipeline stages
    then fit half an SM's shared memory, so two programs share each SM."""
    q_type = program.scores.q.type
    assert isinstance(q_type, TensorType)
    if q_type.element_type == f32:
        return 32, 16
    return (128, 64) if padded(max(_head_dims(program))) <= 128 else (64, 32)


def default_rows(program: AttentionProgram) -> int:
    """Packed rows per tile: `group * DECODE_Q_ROWS` as a power of two, at most the
    rows of `decode_tiles`."""
    hq, hk, _ = program.heads
    return min(padded((hq // hk) * DECODE_Q_ROWS), decode_tiles(program)[0])


def split_kv_blocker(program: AttentionProgram, rows: int) -> str | None:
    """Why `program` cannot use the split-KV lowering with tiles of `rows` packed rows,
    or None when it can."""
    hq, hk, hv = program.heads
    group = hq // hk
    online = program.online
    assert online is not None
    if program.scores.cu_seqlens_q is not None:
        return "a packed batch (cu_seqlens): its kernels walk a per-call schedule of sequences"
    if online.dropout_seed is not None:
        return ("dropout draws its random numbers per (batch, head), and the split kernel "
                "packs the heads of a GQA group into one tile")
    if hv != hk:
        return f"V has {hv} heads and K {hk}: the packed heads of a GQA group must share one V head"
    if group > rows:
        return f"a GQA group of {group} query heads does not fit a tile of {rows} rows"
    q_len = program.func.args[program.q.arg_index].type.get_shape()[2]  # type: ignore[attr-defined]
    if q_len >= 0 and q_len * group > rows:
        return (f"the program's {q_len} queries x {group} heads per KV head never fit a tile "
                f"of {rows} rows")
    return None
