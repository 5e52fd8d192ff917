"""FA3-style causal attention forward for Hopper (sm_90a), written in Triton 3.6 Gluon.

PROTOTYPE: compiled for sm_90 on a CPU-only machine (gluon_compile_check.py), never run
yet; run_gluon_fa3.py checks and times it on an H200.

Problem: Q [B, H, S, 128] bf16, K/V [B, HKV, S, 128] bf16 (GQA, H % HKV == 0, the q heads
h = g * (H // HKV) + i share kv head g), causal top-left with Sq == Skv, scale 1/sqrt(128).
Outputs O [B, H, S, 128] bf16 and LSE [B, H, S] fp32 in the NATURAL log (the unit of
torch's SDPA logsumexp): lse = ln(sum_j exp(q.k_j * scale)).
Restrictions of the prototype: head dim 128, S a multiple of 128 (checked), contiguous
tensors, any B.

Tiles: one CTA owns BLOCK_M = 128 query rows of one (batch, q head) and walks the
BLOCK_N = 128 key blocks n = m, m-1, ..., 0 (the diagonal, masked block first, as FA3
does, so that every later block is unmasked and no row is ever fully masked). Q, K, V
and O are 2-D TMA descriptors over the [rows, 128] views of the contiguous tensors, so
S % 128 == 0 keeps every tile inside one (batch, head).

Grid (B * H, S // 128): blockIdx.x is the head (fastest launched), blockIdx.y walks the
q blocks from the LAST (longest causal row, most key blocks) to the first, so the longest
CTAs start first (LPT order), and the 4 q heads sharing one kv head are neighbours in
launch order (their K/V tiles are shared in L2).

Two kernels (three variants, see KERNELS):

* `fa3_fwd_simple_kernel` (num_warps=8, no warp specialization): the 8 warps own the 128
  rows (warps_per_cta [8, 1]: warpgroup 0 rows 0-63, warpgroup 1 rows 64-127); TMA loads
  K/V into a STAGES-deep shared-memory ring guarded by `ready` mbarriers (expect-tx),
  issued by the same warps: the prologue fills the ring, and the slot of block j-1 is
  refilled with block j-1+STAGES at the end of iteration j (after a CTA barrier, once both
  warpgroups' P V_{j-1} completed), so STAGES=3 keeps one block of prefetch in flight.
  S = Q K^T and O += P V are async wgmma (P from registers, no shared-memory round trip),
  with FA3's intra-warpgroup overlap: iteration j issues S_j = Q K_j^T, then
  O = alpha_{j-1} O + P_{j-1} V_{j-1}, waits for S_j only (wgmma_wait(1)) and does the
  softmax of S_j while P_{j-1} V_{j-1} still runs on the tensor cores.

* `fa3_fwd_ws_kernel` (gl.warp_specialize, num_warps=4 per partition): FA3's schedule.
    - producer partition (1 warp, 24 registers): TMA of the two Q halves, then of K_n and
      V_n into the STAGES ring; `k_ready[s]` / `v_ready[s]` (expect-tx mbarriers) tell
      the consumers, `empty[s]` (count 2: one arrive per consumer warpgroup) gives the
      slot back.
    - two consumer warpgroups (the default partition = rows 0-63, a 4-warp worker
      partition = rows 64-127, 240 registers each). Per key block j each does
          wait(turn[wg]); wait(k_ready); S_j = Q K_j^T (async wgmma, smem x smem);
          O *= alpha_{j-1}; wait(v_ready); O += P_{j-1} V_{j-1} (async wgmma, P in regs);
          arrive(turn[other]);
          wgmma_wait(1) -> S_j;  online softmax of S_j (exp2, scale folded in);
          wgmma_wait(0) -> O;    arrive(empty[slot of j-1])
      `turn` is a pair of mbarriers that makes the two warpgroups issue their GEMMs in
      alternation (ping-pong): while one warpgroup does its softmax (MUFU/FMA bound) the
      other one's wgmmas keep the tensor cores busy.
  The epilogue of each warpgroup writes O / l (bf16) into its own half of the Q tile in
  shared memory (Q is dead by then) and TMA-stores it; LSE is a plain (unmasked) store.
  Variant "ws_coop" (PINGPONG=False, for an A/B of the ping-pong): the same producer and
  ONE 8-warp consumer (the default partition) owning all 128 rows, no turns.

Online softmax (both kernels), with c = scale * log2(e) folded into one FMA:
    m_j = max(m_{j-1}, c * rowmax(S_j));  P_j = exp2(c * S_j - m_j)
    alpha_j = exp2(m_{j-1} - m_j);  l_j = alpha_j * l_{j-1} + rowsum(P_j)
    O_j = alpha_j * O_{j-1} + P_j V_j;  out = O / l;  lse = (m + log2 l) * ln 2.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BLOCK_M = 128
"""Query rows per CTA (both kernels)."""
BLOCK_N = 128
"""Key rows per K/V tile."""
HEAD_DIM = 128
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ----------------------------------------------------------------------------------
# shared device helpers
# ----------------------------------------------------------------------------------


@gluon.jit
def _tile_coords(S, H, HKV):
    """(q row of the CTA's first query in the [B*H*S, D] view, kv row of the (b, kv
    head)'s first key in the [B*HKV*S, D] view, q block index m) of this CTA (LPT)."""
    pid_bh = gl.program_id(0)
    m = gl.num_programs(1) - 1 - gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kvh = h // (H // HKV)
    q_row = pid_bh * S + m * 128
    kv_row = (b * HKV + kvh) * S
    return q_row, kv_row, m


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, row0, col0, MASKED: gl.constexpr):
    """One online-softmax step on the fp32 scores tile `s` (layout of the QK wgmma).
    Returns (P (fp32), m_new, alpha, l_new); m is in log2 units of the scaled scores."""
    s_layout: gl.constexpr = s.type.layout
    if MASKED:
        rows = row0 + gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, s_layout))
        cols = col0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, alpha, l_new


@gluon.jit
def _epilogue(o, m_i, l_i, o_smem, o_desc, o_row, lse_ptr, lse_row):
    """O / l -> bf16 -> shared memory (o_smem) -> TMA store at row o_row of o_desc;
    natural-log LSE of the tile's rows at lse_ptr + lse_row + [0, rows)."""
    o_layout: gl.constexpr = o.type.layout
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    inv_l = 1.0 / gl.convert_layout(l_i, row_layout)
    out = (o * inv_l[:, None]).to(o_desc.dtype)
    o_smem.store(out)
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [o_row, 0], o_smem)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    offs = gl.arange(0, o.shape[0], layout=m_i.type.layout)
    gl.store(lse_ptr + lse_row + offs, lse)
    tma.store_wait(pendings=0)


# ----------------------------------------------------------------------------------
# kernel 1: TMA ring + async wgmma + mbarriers, no warp specialization
# ----------------------------------------------------------------------------------


@gluon.jit
def fa3_fwd_simple_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, S, H, HKV, qk_scale,
                          STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Non-specialized Gluon FA3-like forward: 8 warps own 128 q rows (see module doc).
    q_desc / o_desc blocks are [128, 128], k_desc / v_desc [128, 128]."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(BM == 128)
    gl.static_assert(BN == 128)

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    q_row, kv_row, m = _tile_coords(S, H, HKV)
    n_blocks = m + 1  # blocks m, m-1, ..., 0 (BM == BN)

    q_smem = gl.allocate_shared_memory(dtype, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    # prologue: blocks 0 .. STAGES-1 of the walk (key blocks m, m-1, ...) fill the ring
    for i in gl.static_range(STAGES):
        pred = i < n_blocks
        mbarrier.expect(ready.index(i), 2 * k_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(k_desc, [kv_row + (m - i) * BN, 0], ready.index(i), k_smem.index(i),
                                        pred=pred)
        tma.async_copy_global_to_shared(v_desc, [kv_row + (m - i) * BN, 0], ready.index(i), v_smem.index(i),
                                        pred=pred)

    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)
    m_i = gl.full([BM], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([BM], gl.float32, row_layout)
    row0 = m * BM

    mbarrier.wait(q_bar, 0)
    # j = 0: the diagonal block, masked; S only (no P V yet)
    mbarrier.wait(ready.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    p, m_i, alpha, l_i = _softmax_step(s, m_i, l_i, qk_scale, row0, m * BN, True)
    o = gl.zeros([BM, D], gl.float32, o_layout)

    for j in range(1, n_blocks):
        st = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(ready.index(st), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        o_tok = warpgroup_mma(p16, v_smem.index(prev), o, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        p, m_i, alpha, l_i = _softmax_step(s, m_i, l_i, qk_scale, row0, (m - j) * BN, False)
        o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
        # slot `prev` (block j-1) is free once BOTH warpgroups finished P V_{j-1}:
        # refill it with block j-1+STAGES
        gl.thread_barrier()
        nxt = j - 1 + STAGES
        pred = nxt < n_blocks
        mbarrier.expect(ready.index(prev), 2 * k_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(k_desc, [kv_row + (m - nxt) * BN, 0], ready.index(prev),
                                        k_smem.index(prev), pred=pred)
        tma.async_copy_global_to_shared(v_desc, [kv_row + (m - nxt) * BN, 0], ready.index(prev),
                                        v_smem.index(prev), pred=pred)

    last = (n_blocks - 1) % STAGES
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    o_tok = warpgroup_mma(p16, v_smem.index(last), o, is_async=True)
    o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    pid_bh = gl.program_id(0)
    _epilogue(o, m_i, l_i, q_smem, o_desc, q_row, lse_ptr, pid_bh * S + row0)


# ----------------------------------------------------------------------------------
# kernel 2: warp-specialized, 1 producer warp + 2 ping-pong consumer warpgroups
# ----------------------------------------------------------------------------------


@gluon.jit
def _ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, S, H, HKV,
                 STAGES: gl.constexpr):
    """Producer partition (1 warp): TMA Q (its q_smem.shape[0] row tiles), then K_n, V_n
    for n = m, m-1, ..., 0 into the ring."""
    BN: gl.constexpr = k_desc.block_type.shape[0]
    Q_ROWS: gl.constexpr = q_desc.block_type.shape[0]
    q_row, kv_row, m = _tile_coords(S, H, HKV)
    N_Q: gl.constexpr = q_smem.shape[0]
    mbarrier.expect(q_bar, N_Q * q_desc.block_type.nbytes)
    for i in gl.static_range(N_Q):
        tma.async_copy_global_to_shared(q_desc, [q_row + i * Q_ROWS, 0], q_bar, q_smem.index(i))
    for j in range(m + 1):
        st = j % STAGES
        ph = (j // STAGES) & 1
        row = kv_row + (m - j) * BN
        # a fresh mbarrier counts as having completed phase "1": the first lap passes
        mbarrier.wait(empty.index(st), ph ^ 1)
        mbarrier.expect(k_ready.index(st), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, 0], k_ready.index(st), k_smem.index(st))
        mbarrier.expect(v_ready.index(st), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, 0], v_ready.index(st), v_smem.index(st))


@gluon.jit
def _ws_consumer(o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, turn, S, H, HKV,
                 qk_scale, WG: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr):
    """Consumer partition owning the q rows [WG*ROWS, WG*ROWS+ROWS) of the CTA's 128.
    PINGPONG: warpgroup WG (0: default partition, 1: worker partition) of 4 warps, 64
    rows, taking turns with the other one via `turn`; else the only consumer (8 warps,
    128 rows, WG = 0), no turns."""
    ROWS: gl.constexpr = o_desc.block_type.shape[0]
    BN: gl.constexpr = k_smem.shape[1]
    D: gl.constexpr = k_smem.shape[2]
    dtype: gl.constexpr = o_desc.dtype
    NW: gl.constexpr = gl.num_warps()  # warps of this partition
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    OTHER: gl.constexpr = 1 - WG

    q_row, kv_row, m = _tile_coords(S, H, HKV)
    n_blocks = m + 1
    row0 = m * 128 + WG * ROWS
    q = q_smem.index(WG)
    my_turn = turn.index(WG)
    other_turn = turn.index(OTHER)

    zero_s = gl.zeros([ROWS, BN], gl.float32, s_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([ROWS], gl.float32, row_layout)

    mbarrier.wait(q_bar, 0)
    # turn k of WG 0 waits for parity (k & 1) ^ 1 (its first turn passes on the fresh
    # barrier), turn k of WG 1 for parity k & 1 (granted by WG 0's k-th arrive).
    if PINGPONG:
        mbarrier.wait(my_turn, 1 - WG)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    if PINGPONG:
        mbarrier.arrive(other_turn)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    p, m_i, alpha, l_i = _softmax_step(s, m_i, l_i, qk_scale, row0, m * BN, True)
    o = gl.zeros([ROWS, D], gl.float32, o_layout)

    for j in range(1, n_blocks):
        st = j % STAGES
        prev = (j - 1) % STAGES
        if PINGPONG:
            mbarrier.wait(my_turn, (j & 1) ^ OTHER)
        mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p16, v_smem.index(prev), o, is_async=True)
        if PINGPONG:
            mbarrier.arrive(other_turn)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        p, m_i, alpha, l_i = _softmax_step(s, m_i, l_i, qk_scale, row0, (m - j) * BN, False)
        o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
        mbarrier.arrive(empty.index(prev))

    last = (n_blocks - 1) % STAGES
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p16, v_smem.index(last), o, is_async=True)
    o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
    mbarrier.arrive(empty.index(last))

    pid_bh = gl.program_id(0)
    # this partition's Q rows are dead (its last QK^T completed): reuse them for O
    _epilogue(o, m_i, l_i, q, o_desc, q_row + WG * ROWS, lse_ptr, pid_bh * S + row0)


@gluon.jit
def fa3_fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, S, H, HKV, qk_scale, STAGES: gl.constexpr,
                      PINGPONG: gl.constexpr, num_warps: gl.constexpr):
    """Warp-specialized FA3 forward (see module doc).
    PINGPONG=True: num_warps=4, q_desc / o_desc blocks [64, 128] (one consumer warpgroup's
    rows); consumers = default partition (rows 0-63) + a 4-warp worker (rows 64-127).
    PINGPONG=False (cooperative, for comparison): num_warps=8, q_desc / o_desc blocks
    [128, 128]; one 8-warp consumer (the default partition) owns the 128 rows.
    Both: a 1-warp producer worker; k_desc / v_desc blocks [128, 128]."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    N_CONSUMERS: gl.constexpr = 2 if PINGPONG else 1
    gl.static_assert(ROWS * N_CONSUMERS == 128)
    gl.static_assert(num_warps * 16 == ROWS)
    gl.static_assert(BN == 128)

    q_smem = gl.allocate_shared_memory(dtype, [N_CONSUMERS, ROWS, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=N_CONSUMERS)  # one arrive per consumer partition
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    fence_async_shared()

    if PINGPONG:
        gl.warp_specialize([
            (_ws_consumer, (o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, turn, S, H,
                            HKV, qk_scale, 0, STAGES, True)),
            (_ws_consumer, (o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, turn, S, H,
                            HKV, qk_scale, 1, STAGES, True)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, S, H,
                            HKV, STAGES)),
        ], [4, 1], [240, 24])
    else:
        gl.warp_specialize([
            (_ws_consumer, (o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, turn, S, H,
                            HKV, qk_scale, 0, STAGES, False)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, empty, S, H,
                            HKV, STAGES)),
        ], [1], [24])


# ----------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------

KERNELS = {
    # name: (kernel, q/o descriptor rows, num_warps, default STAGES, maxnreg, extra constexprs)
    "simple": (fa3_fwd_simple_kernel, 128, 8, 3, None, {}),
    # 12 warps (4 + 4 + 1 rounded up to warpgroups) x 32 x 168 <= 65536 registers; the
    # compiler's setmaxnreg gives 240 to each consumer warpgroup and 24 to the producer's
    "ws": (fa3_fwd_ws_kernel, 64, 4, 2, 168, {"PINGPONG": True}),
    # 12 warps (8 + 1 rounded up): 8 consumer warps at 240, producer warpgroup at 24
    "ws_coop": (fa3_fwd_ws_kernel, 128, 8, 2, 168, {"PINGPONG": False}),
}


def make_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variant: str = "ws",
              stages: int | None = None) -> tuple[tuple[Any, ...], dict[str, Any], tuple[int, int], torch.Tensor,
                                                  torch.Tensor]:
    """(positional args, launch kwargs, grid, o, lse) of one launch. Works on CPU tensors
    too (the compile check builds its signature from them)."""
    kernel, q_rows, num_warps, default_stages, maxnreg, extra = KERNELS[variant]
    B, H, S, D = q.shape
    HKV = k.shape[1]
    assert D == HEAD_DIM, f"head dim must be {HEAD_DIM}"
    assert S % BLOCK_M == 0, "prototype: S must be a multiple of 128"
    assert k.shape == (B, HKV, S, D) and v.shape == (B, HKV, S, D) and H % HKV == 0
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lse = torch.empty(B, H, S, device=q.device, dtype=torch.float32)
    qo_layout = gl.NVMMASharedLayout.get_default_for([q_rows, D], gl.bfloat16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.bfloat16)
    q_desc = TensorDescriptor.from_tensor(q.view(B * H * S, D), [q_rows, D], qo_layout)
    o_desc = TensorDescriptor.from_tensor(o.view(B * H * S, D), [q_rows, D], qo_layout)
    k_desc = TensorDescriptor.from_tensor(k.view(B * HKV * S, D), [BLOCK_N, D], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v.view(B * HKV * S, D), [BLOCK_N, D], kv_layout)
    qk_scale = LOG2E / math.sqrt(D)
    args = (q_desc, k_desc, v_desc, o_desc, lse, S, H, HKV, qk_scale)
    kwargs: dict[str, Any] = {"STAGES": stages or default_stages, **extra, "num_warps": num_warps}
    if maxnreg is not None:
        kwargs["maxnreg"] = maxnreg
    grid = (B * H, S // BLOCK_M)
    return args, kwargs, grid, o, lse


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variant: str = "ws",
           stages: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal GQA attention forward: (O [B, H, S, 128] bf16, LSE [B, H, S] fp32, natural
    log). `variant`: "ws" (warp-specialized, ping-pong consumers), "ws_coop" (warp-specialized,
    one 8-warp consumer) or "simple" (no warp specialization)."""
    args, kwargs, grid, o, lse = make_args(q, k, v, variant, stages)
    KERNELS[variant][0][grid](*args, **kwargs)
    return o, lse
