"""The Gluon template of the Hopper forward schedule (FA3: warp-specialized ping-pong).

From `bench/prototypes/gluon_fa3_forward.py` (`fa3_fwd_ws_kernel`, measured 0.95-1.05x
cuDNN on an H200), generalized: a work item is 128 query rows of one (batch, q head);
a CTA takes the items `$work_fn` gives it, `$steps_fn` steps (one item per CTA when the
grid has a CTA per item; several in turn when the grid is persistent, so that the K/V
loads of the next item overlap the last tiles and the epilogue of the current one). A
producer partition TMA-loads the K/V tiles of each item's KV walk into a
`$stages`-deep shared-memory ring (one warp, or, when K has transforms in the kernel,
a warpgroup that also transforms each K tile in place); two 4-warp consumer
warpgroups (64 rows each) take turns issuing their async wgmmas (S = Q K^T, O += P V) so that one's softmax overlaps
the other's tensor-core work. The walk goes from the last KV tile of the band down to
the first (the diagonal, masked tile first for causal bands).

What is problem-specific comes from tile IR device functions (`tile_hopper.func`):
`$range_fn` (the KV walk of an item: four scalars, for a band its first tile start, tile
count and the range [full_lo, full_hi) of tiles that need no mask, for a runtime block
map its row of the map, tile count and count of partial tiles), `$tile_fn` (the walk's
`j`-th tile from those four: its first key and whether the plan's masks apply), `$q_fn` (loads and transforms the
consumer's Q rows, returning column parts) and the score functions (`$score_masked`,
`$score_full`: the score chain on the raw S tile, in the units `$qk_scale` turns into
log2 units). `$args` are the kernel's pointer/stride/scalar arguments, passed to every
device function.
"""

from __future__ import annotations

from string import Template

from attnfuse.lowering.hopper_functions import DESCRIPTOR_AT

TEMPLATE = Template(DESCRIPTOR_AT + '''\
$producer

@gluon.jit
def ${k}_producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, $kv_steps, $producer_extra$args):
    """The producer partition: the CTA's work items in turn (`$work_fn`), each loaded by `${k}_load`."""
    cta = gl.program_id(0)
    ctas = gl.num_programs(0)
    kt = 0
    for step in range($steps_fn(ctas, $args)):
        batch, head, m, valid = $work_fn(step, cta, ctas, $args)
        if valid:
            kt = ${k}_load(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, $kv_steps,
                           ${producer_extra}kt, batch, head, m, $args)


@gluon.jit
def ${k}_softmax(s, m_i, l_i, rows, start, masked, batch, head, $args):
    """One online-softmax step of the S tile at key `start`, `masked` when the plan's
    masks apply to it (m in log2 units)."""
$score_step
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * $qk_scale)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s * $qk_scale - m_safe[:, None])
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, alpha, l_new


@gluon.jit
def ${k}_qk(q, k_smem, k2_smem, st, zero_s):
    """Issue S = Q K^T of ring slot `st` (async)."""
$qk_body


@gluon.jit
def ${k}_attend(o_desc, q, k_smem, k2_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, $o_steps,
                ${consumer_extra}kt, batch, head, m, $args, WG: gl.constexpr):
    """One work item of a consumer warpgroup: its 64 Q rows of q block `m` of (batch,
    head) against the item's KV walk; `kt` counts the K/V tiles this warpgroup consumed
    before (ring slots, barrier phases and turns continue from it). Returns the count after."""
    ROWS: gl.constexpr = o_desc.block_type.shape[0]
    BN: gl.constexpr = k_smem.shape[1]
    DV: gl.constexpr = v_smem.shape[2]
    dtype: gl.constexpr = o_desc.dtype
    NW: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    OTHER: gl.constexpr = 1 - WG

    kv_lo, n_tiles, full_lo, full_hi = $range_fn(m * 128, batch, head, $args)
    q_start = m * 128 + WG * ROWS
    # prologue: this warpgroup's Q rows, loaded and transformed in registers, into shared memory
    q_rows = q_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, q_layout))
$q_store
    fence_async_shared()
$q_save

    rows = q_start + gl.arange(0, ROWS, layout=row_layout)
    zero_s = gl.zeros([ROWS, BN], gl.float32, s_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([ROWS], gl.float32, row_layout)
    o = gl.zeros([ROWS, DV], gl.float32, o_layout)
    if n_tiles > 0:
        # turn t of WG 0 waits for parity (t & 1) ^ 1 (its first turn passes on the fresh
        # barrier), turn t of WG 1 for parity t & 1 (granted by WG 0's t-th arrive).
        st = kt % $stages
        mbarrier.wait(turn.index(WG), (kt & 1) ^ OTHER)
        mbarrier.wait(k_ready.index(st), (kt // $stages) & 1)
        s_tok = ${k}_qk(q, k_smem, k2_smem, st, zero_s)
        mbarrier.arrive(turn.index(OTHER))
        s = warpgroup_mma_wait(0, deps=[s_tok])
        mbarrier.arrive(k_empty.index(st))
        start, masked = $tile_fn(0, kv_lo, n_tiles, full_lo, full_hi, $args)
        p, m_i, alpha, l_i = ${k}_softmax(s, m_i, l_i, rows, start, masked, batch, head, $args)
        for j in range(1, n_tiles):
            t = kt + j
            st = t % $stages
            prev = (t - 1) % $stages
            mbarrier.wait(turn.index(WG), (t & 1) ^ OTHER)
            mbarrier.wait(k_ready.index(st), (t // $stages) & 1)
            s_tok = ${k}_qk(q, k_smem, k2_smem, st, zero_s)
            o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.wait(v_ready.index(prev), ((t - 1) // $stages) & 1)
            o_tok = warpgroup_mma(p16, v_smem.index(prev), o, is_async=True)
            mbarrier.arrive(turn.index(OTHER))
            s = warpgroup_mma_wait(1, deps=[s_tok])
            mbarrier.arrive(k_empty.index(st))
            start, masked = $tile_fn(j, kv_lo, n_tiles, full_lo, full_hi, $args)
            if masked:
                # a masked tile (band edges, a few per CTA): finish P V first, which frees
                # P's registers for the mask code
                o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
            p, m_i, alpha, l_i = ${k}_softmax(s, m_i, l_i, rows, start, masked, batch, head, $args)
            o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
            mbarrier.arrive(v_empty.index(prev))
        t = kt + n_tiles - 1
        last = t % $stages
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_ready.index(last), (t // $stages) & 1)
        o_tok = warpgroup_mma(p16, v_smem.index(last), o, is_async=True)
        o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
        mbarrier.arrive(v_empty.index(last))

    # epilogue: O / l into this warpgroup's (dead) Q tile, TMA store; natural-log LSE.
    # A row that sees no key gets O = 0 and lse = -inf. The store completes before the
    # next item's Q rows overwrite the tile.
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    out = o / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
$q_save_wait
    q.store(out.to(dtype))
    fence_async_shared()
    o_row, o_col = ${k}_at(batch, head, $o_steps)
    tma.async_copy_shared_to_global(o_desc, [o_row + q_start, o_col], q)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    lse_base = batch.to(gl.int64) * $lse_s0 + head.to(gl.int64) * $lse_s1
    gl.store($lse + lse_base + rows * $lse_s2, lse)
    tma.store_wait(pendings=0)
    return kt + n_tiles


@gluon.jit
def ${k}_consumer(o_desc, q_smem, k_smem, k2_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, $o_steps,
                  ${consumer_extra}$args, WG: gl.constexpr):
    """A consumer warpgroup: the CTA's work items in turn (`$work_fn`)."""
    cta = gl.program_id(0)
    ctas = gl.num_programs(0)
    kt = 0
    for step in range($steps_fn(ctas, $args)):
        batch, head, m, valid = $work_fn(step, cta, ctas, $args)
        if valid:
            kt = ${k}_attend(o_desc, q_smem.index(WG), k_smem, k2_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn,
                             $o_steps, ${consumer_extra}kt, batch, head, m, $args, WG)


def __kernel__():
    ROWS: gl.constexpr = o_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = k_desc.block_type.shape[1]  # half the head dim when K is split in two
    DV: gl.constexpr = v_desc.block_type.shape[1]
    dtype: gl.constexpr = o_desc.dtype
    gl.static_assert(ROWS * 2 == 128)
    # Q tiles (the head dim, equal to V's), later the output
    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, DV], o_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [$stages, BN, D], k_desc.layout)
$k2_alloc
    v_smem = gl.allocate_shared_memory(dtype, [$stages, BN, DV], v_desc.layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [$stages, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [$stages, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [$stages, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [$stages, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range($stages):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        # one arrive per consumer warpgroup: K once its S = Q K^T is done, V after P V
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
$k_raw_init
    fence_async_shared()
    gl.warp_specialize([
        (${k}_consumer, (o_desc, q_smem, k_smem, k2_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, $o_steps,
                         ${consumer_extra}$args, 0)),
        (${k}_consumer, (o_desc, q_smem, k_smem, k2_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, $o_steps,
                         ${consumer_extra}$args, 1)),
        (${k}_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, $kv_steps,
                         $producer_extra$args)),
    ], [4, $producer_warps], [$consumer_regs, $producer_regs])
''')
"""Substitutions: k (name prefix), group_k, group_v, stages, qk_scale, the descriptors'
step arguments `kv_steps` (K's then V's) and `o_steps` (see `hopper_functions`),
args, steps_fn, work_fn, range_fn, tile_fn, q_store, score_step, lse, lse_s0..2; `producer` (the
text of `PRODUCER` or `TRANSFORMING_PRODUCER`: its `${k}_load`), `producer_extra` (the load's arguments before
`args`), `k_raw_init`, and the partitions' `producer_warps`, `consumer_regs`,
`producer_regs`; `consumer_extra` (`qs_desc, ` or nothing), `q_save` (the TMA store of
the transformed Q tile for the backward, `ForwardSpec.q_saved`, with `qs_desc`'s steps among
`consumer_extra`) and `q_save_wait` (its
completion, before the epilogue overwrites the tile)."""


PRODUCER = Template('''\
@gluon.jit
def ${k}_load(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, $kv_steps, kt, batch, head, m,
           $args):
    """The TMA loads of one work item's K/V tiles into the ring, from ring position `kt`."""
    BN: gl.constexpr = k_desc.block_type.shape[0]
    kv_lo, n_tiles, full_lo, full_hi = $range_fn(m * 128, batch, head, $args)
    k_row, k_col = ${k}_at(batch, head // $group_k, $k_steps)
    v_row, v_col = ${k}_at(batch, head // $group_v, $v_steps)
    for j in range(n_tiles):
        t = kt + j
        st = t % $stages
        ph = (t // $stages) & 1
        start, masked = $tile_fn(j, kv_lo, n_tiles, full_lo, full_hi, $args)
        # a fresh mbarrier counts as having completed phase "1": the first lap passes
        mbarrier.wait(k_empty.index(st), ph ^ 1)
        mbarrier.expect(k_ready.index(st), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [k_row + start, k_col], k_ready.index(st), k_smem.index(st))
        mbarrier.wait(v_empty.index(st), ph ^ 1)
        mbarrier.expect(v_ready.index(st), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [v_row + start, v_col], v_ready.index(st), v_smem.index(st))
    return kt + n_tiles

''')
"""`${k}_load` of the 1-warp producer: TMA loads of each K/V tile of an item into the ring
(`k_steps`, `v_steps`, `kv_steps`: the descriptors' step arguments)."""

TRANSFORMING_PRODUCER = Template('''\
@gluon.jit
def ${k}_load(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, $kv_steps, k_raw, k2_smem, kt,
           batch, head, m, $args):
    """TMA loads of each K tile of one work item as soon as its slot is free (the
    consumers free K once S = Q K^T is done); one tile behind, the K tile's transforms
    in place (chunks of rows through registers, a proxy fence, a barrier of this
    warpgroup, the arrive that hands the tile to the consumers), then that tile's V
    load. Ring positions continue from `kt`; returns the position after the item."""
    BN: gl.constexpr = k_desc.block_type.shape[0]
    NW: gl.constexpr = gl.num_warps()
    k_layout: gl.constexpr = gl.BlockedLayout([1, $k_vec], [$k_tpw_row, $k_tpw_col], [NW, 1], [1, 0])
    CH: gl.constexpr = $k_tpw_row * NW
    kv_lo, n_tiles, full_lo, full_hi = $range_fn(m * 128, batch, head, $args)
    k_row, k_col = ${k}_at(batch, head // $group_k, $k_steps)
    v_row, v_col = ${k}_at(batch, head // $group_v, $v_steps)
    chunk_rows = gl.arange(0, CH, layout=gl.SliceLayout(1, k_layout))
$k_setup
    for j in range(n_tiles + 1):
        if j < n_tiles:
            t = kt + j
            st = t % $stages
            start, masked = $tile_fn(j, kv_lo, n_tiles, full_lo, full_hi, $args)
            mbarrier.wait(k_empty.index(st), ((t // $stages) & 1) ^ 1)
            mbarrier.expect(k_raw.index(st), $k_parts * k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [k_row + start, k_col], k_raw.index(st), k_smem.index(st))
$k2_load        if j > 0:
            t = kt + j - 1
            st = t % $stages
            ph = (t // $stages) & 1
            start, masked = $tile_fn(j - 1, kv_lo, n_tiles, full_lo, full_hi, $args)
            mbarrier.wait(k_raw.index(st), ph)
            tile = k_smem.index(st)
            tile2 = k2_smem.index(st)
            for c in gl.static_range(BN - CH, -1, -CH):
                rows = start + c + chunk_rows
                chunk = tile.slice(c, CH, dim=0)
                chunk2 = tile2.slice(c, CH, dim=0)
$k_transform
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(k_ready.index(st))
            # V of the same tile (first read one consumer step after its K)
            mbarrier.wait(v_empty.index(st), ph ^ 1)
            mbarrier.expect(v_ready.index(st), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [v_row + start, v_col], v_ready.index(st), v_smem.index(st))
    return kt + n_tiles

''')
"""`${k}_load` of the 4-warp producer of `rope-fusion` fused: K reaches the consumers transformed.
`k_transform` loads each column part of `chunk` (`k_vec` x `k_tpw_row` x `k_tpw_col`
blocked layout), calls the K device function and stores the parts back. Chunks go from
the tile's last to its first, as tiles do, so the rows a thread visits descend by `CH`
all along the walk: with a rope, `k_setup` evaluates cos and sin once per work item (at
the first tile's last chunk, and the rotation by -`CH` rows) and `k_transform` steps them
after each chunk (fp32 rotations, no transcendental per tile)."""
