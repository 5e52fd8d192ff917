"""FA3-style fused attention backward (dK, dV and dQ in one kernel) for Hopper, in Gluon.

PROTOTYPE, Llama-3-8B case only: Q [B, HQ, S, 128], K/V [B, HKV, S, 128] bf16 (GQA, q
head h uses kv head h // (HQ // HKV)), Q and K already rotated, causal top-left with
Sq == Skv, scale 1/sqrt(128), S a multiple of 128, contiguous tensors. Inputs of the
backward: dO [B, HQ, S, 128] bf16, LSE [B, HQ, S] f32 (natural log, as the forward
writes it) and delta = rowsum(dO * O) [B, HQ, S] f32. Outputs dK, dV [B, HKV, S, 128]
bf16 and dQ accumulated in f32 into a zeroed [B, HQ, S, 128] buffer (cast to bf16 on
the host). `python bench/prototypes/gluon_bwd.py --out DIR` checks and times it on a GPU;
tests/lowering/test_gluon_bwd_prototype.py compiles it for sm_90a on the CPU.

Design
------
Grid (B * HKV, S / 128): one CTA per (batch x kv head, block n of 128 keys), blocks n = 0
(the longest causal walk) launched first. The CTA walks every query head of its GQA group
and, for each, the 64-row q tiles t = 2n .. S/64 - 1 of the causal band (the first two
straddle the diagonal and are masked), so dK and dV of the block are complete at the end
(no reduction across CTAs) and only dQ crosses CTAs.

Partitions (`gl.warp_specialize`):
  * producer, 1 warp, 24 registers: TMA of K and V of the block once (`kv_bar`), then per
    q tile of the walk Q + LSE (`q_ready[st]`) and dO + delta (`do_ready[st]`) into a
    STAGES-deep ring; `empty[st]` (2 arrivals, one per consumer warpgroup) frees a slot.
  * two consumer warpgroups, 4 warps and 240 registers each; warpgroup w owns keys
    [64w, 64w + 64) of the block (so every wgmma has M = 64) and per q tile does, with
    c = scale * log2(e):
        S^T  = K_w Q^T                 wgmma, smem x smem (Q permuted), [64 keys, 64 q]
        dP^T = V_w dO^T                wgmma, smem x smem, issued before S^T is waited on
        P^T  = exp2(c S^T - log2(e) lse[q]), causal mask on the two diagonal tiles
                                       (overlaps the dP^T wgmma)
        dS^T = P^T * (dP^T - delta[q])  (f32, then bf16)
        dV  += P^T dO                  wgmma, P^T from registers (bf16), dO from smem
        dS^T -> this warpgroup's rows [64w, 64w + 64) of the double-buffered ds_smem[it % 2]
                (`ds_ready` / `ds_free`: 2 arrivals, one per warpgroup)
        dK  += dS^T Q                  wgmma, dS^T from those ds_smem rows, Q from smem
        (wait dV, dK; arrive `empty[st]`; wait `ds_ready`: the other warpgroup's rows)
        dQ[:, 64w:64w+64] = dS K[:, 64w:64w+64]   wgmma, A = ds_smem permuted (all 128 keys
                of both warpgroups), B = a column slice of K; K-dim 128
        dQ * scale -> dq_smem[w] (f32) -> TMA reduce-add into dQacc[q tile, 64w:64w+64]
    Before dq_smem[w] is overwritten, the previous tile's reduce must have read it
    (`tma.store_wait(0)`), which leaves one tile of compute to hide the reduce.
  Epilogue: each warpgroup writes its dV rows, then dK * scale, as bf16 into its own
  dq_smem slot (reinterpreted as [64, 128] bf16) and TMA-stores them.
  The 5 matmuls per (q tile, key block) are FA3's; dQ crosses CTAs through
  `cp.reduce.async.bulk.tensor.add.f32` (one bulk op per 64x64 f32 tile, done in L2),
  not through per-thread atomics (the failed run-14 `tl.atomic_add` experiment).
  Not deterministic: the order of the dQ reductions depends on CTA timing.

Shared memory (STAGES = 2): K, V 2 x 32 KiB; Q, dO rings 2 x 2 x 16 KiB; dS 2 x 16 KiB;
dQ staging 2 x 16 KiB; LSE / delta 2 x 2 x 256 B.

sm_90a compile on a CPU (`compile_for_sm90`, tests/lowering/test_gluon_bwd_prototype.py):
STAGES=2: 198,048 B of shared memory, STAGES=3: 231,376 B (limit 232,448); setmaxnreg
240 per consumer warpgroup, 24 for the producer's; one 4-byte spill (a scalar of the
epilogue, stored and reloaded once per CTA; none inside the loop); 2 TMA reduce-adds
(one per consumer warpgroup; each is split into two 32-column messages by Triton's TMA
lowering, issued by two warps). Getting there: HQ, HKV and the scale are constexprs (as
runtime scalars, the index math spilled in the second consumer's loop), dP^T is waited
on before P^T and dS^T are cast (keeps P^T's and dS^T's register copies from living
across the dV wgmma), and dK takes dS^T from shared memory (it is stored there for dQ).

Gluon features it relies on (Triton 3.6)
----------------------------------------
gl.warp_specialize with per-partition register budgets (setmaxnreg); TMA loads
(`tma.async_copy_global_to_shared`, 2-D and 1-D descriptors) with expect-tx mbarriers;
`warpgroup_mma` (async, A from registers or from shared memory, A transposed through
`permute`, B as a column `slice` of a 128B-swizzled tile) and `warpgroup_mma_wait`;
mbarriers between the two consumer warpgroups; `fence_async_shared`; TMA stores and
`tma.store_wait`; `shared_memory_descriptor._reinterpret`. No explicit
`gl.thread_barrier`: Triton's membar pass already puts the partition's `bar.sync` around
every `mbarrier.arrive` (so all 128 threads' shared stores and wgmma waits precede the one
arriving thread) and after every `tma.store_wait` (checked in the PTX: the same 27
`bar.sync` with or without explicit ones). The TMA reduce-add has no Gluon wrapper in
3.6 (`hopper.tma` exports the two copies and `store_wait` only; newer Gluon sources seen
in a code search have `tma.async_atomic_add`, not checked against a release), but the
Gluon builder binds
`create_async_tma_reduce(kind, desc, coord, src)` (`ttng.async_tma_reduce`, lowered to
`cp.reduce.async.bulk.tensor`): `_tma_reduce_add` below is that one call as a builtin.

Unverified
----------
Nothing here has run: the numerics (masking, LSE units, the transposes, the dQ split, the
barrier phases), the absence of deadlocks and races (the dS hand-off between warpgroups,
the reuse of dq_smem while a reduce may still read it), the TMA reduce's completion
tracking by `tma.store_wait`, and the speed. Only the sm_90a compile (registers, spills,
shared memory, the instructions in the PTX) is checked, on a CPU.

Plan for a lowering (only if the GPU run beats cuDNN's bprop kernel)
---------------------------------------------------------------------
1. `attnfuse/lowering/hopper_backward.py`, a pass option `lower-to-tile{hopper-backward}`
   next to hopper-forward, with the same eligibility rules (sm_90 + TMA-ready shape
   class, head dim 64/128, bf16/fp16, no dropout, band masks it can plan) and the same
   Triton fallback launch (`LaunchOp.unless`) for other shape classes.
2. `attnfuse/lowering/hopper_bwd_template.py`, this kernel as a `string.Template` in the
   style of hopper_template.py, its problem-specific parts generated as tile_hopper
   device functions: `$range_fn` (the q walk of a key block: first tile, count, and the
   [full_lo, full_hi) tiles that need no mask, i.e. the transpose of the forward's walk),
   `$score_masked` / `$score_full` (the score chain and planned masks on S^T with key rows
   and query columns), `$score_grad` (the chain's backward on dS^T, the identity for
   plain softmax; softcap, ALiBi etc. from region_grad.py), and the epilogue transform of
   dK (the inverse RoPE now done by the Triton dK/dV epilogue, rotate-in-epilogue).
3. The host code: the preprocess kernel (delta) stays; dQ gets a zeroed f32 accumulator
   and a cast (or the dQ epilogue of lowering/backward.py: inverse RoPE + cast) kernel;
   the dQ Triton kernel is dropped on this path.
4. Tests as for the forward: the template compiles for sm_90 for every eligible program
   (this file's test), CPU calls keep the Triton kernels, and tests/gpu/ checks gradients.
5. A deterministic mode (not in the prototype), FA3's way: a per-(q tile, head) counter
   in global memory; the CTA of key block n waits until it reads n (blocks reduce in key
   order), reduces, waits for the reduce (`store_wait`), then bumps it.
First step on the GPU: `python bench/prototypes/gluon_bwd.py --out DIR` (smoke launch in a
child process with a timeout, then the checks and timings for STAGES 2 and 3;
DIR/gluon_bwd.json).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

HEAD_DIM = 128
BLOCK_N = 128
"""Keys per CTA (64 per consumer warpgroup)."""
BLOCK_M = 64
"""Query rows per step of the walk."""
STAGES = 2
"""Depth of the Q / dO ring."""
SCALE = 1.0 / math.sqrt(HEAD_DIM)
LOG2E = 1.4426950408889634


@builtin
def _tma_reduce_add(tensor_desc: Any, coord: Any, src: Any, _semantic: Any = None) -> None:
    """global[box at coord] += shared `src` (`cp.reduce.async.bulk.tensor ... .add`),
    tracked like a TMA store (`tma.store_wait`)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _walk(S, HKV: gl.constexpr):
    """(batch, kv head, key block n, q tiles per head, first q tile) of this CTA."""
    bkv = gl.program_id(0)
    n = gl.program_id(1)
    first = 2 * n
    return bkv // HKV, bkv % HKV, n, S // 64 - first, first


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem, lse_smem,
              delta_smem, kv_bar, q_ready, do_ready, empty, S, HQ: gl.constexpr, HKV: gl.constexpr,
              STAGES: gl.constexpr):
    """1 warp: K and V of the block, then Q + LSE and dO + delta of every q tile of the walk."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    G: gl.constexpr = HQ // HKV
    batch, kvh, n, tiles, first = _walk(S, HKV)
    kv_row = (batch * HKV + kvh) * S + n * BN
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [kv_row, 0], kv_bar, v_smem)
    for it in range(G * tiles):
        st = it % STAGES
        # a fresh mbarrier counts as having completed phase "1": the first lap passes
        mbarrier.wait(empty.index(st), ((it // STAGES) & 1) ^ 1)
        q_row = (batch * HQ + kvh * G + it // tiles) * S + (first + it % tiles) * BM
        mbarrier.expect(q_ready.index(st), q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_ready.index(st), q_smem.index(st))
        tma.async_copy_global_to_shared(lse_desc, [q_row], q_ready.index(st), lse_smem.index(st))
        mbarrier.expect(do_ready.index(st), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(do_desc, [q_row, 0], do_ready.index(st), do_smem.index(st))
        tma.async_copy_global_to_shared(delta_desc, [q_row], do_ready.index(st), delta_smem.index(st))


@gluon.jit
def _consumer(dq_desc, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_smem,
              kv_bar, q_ready, do_ready, empty, ds_ready, ds_free, S, HQ: gl.constexpr, HKV: gl.constexpr,
              SM_SCALE: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warpgroup WG: keys [64 WG, 64 WG + 64) of the block (see the module doc)."""
    BM: gl.constexpr = q_smem.shape[1]
    D: gl.constexpr = q_smem.shape[2]
    KW: gl.constexpr = dq_desc.block_type.shape[0]  # keys of this warpgroup (64)
    DQW: gl.constexpr = dq_desc.block_type.shape[1]  # dQ columns of this warpgroup (64)
    dtype: gl.constexpr = q_smem.dtype
    NW: gl.constexpr = gl.num_warps()
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                         instr_shape=[16, BM, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                          instr_shape=[16, D, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                         instr_shape=[16, DQW, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    key_layout: gl.constexpr = gl.SliceLayout(1, st_layout)
    C: gl.constexpr = SM_SCALE * 1.4426950408889634

    G: gl.constexpr = HQ // HKV
    batch, kvh, n, tiles, first = _walk(S, HKV)
    key0 = n * (2 * KW) + WG * KW
    k_w = k_smem.slice(WG * KW, KW, dim=0)
    v_w = v_smem.slice(WG * KW, KW, dim=0)
    k_cols = k_smem.slice(WG * DQW, DQW, dim=1)
    my_dq = dq_smem.index(WG)
    keys = key0 + gl.arange(0, KW, layout=key_layout)
    zero_st = gl.zeros([KW, BM], gl.float32, st_layout)
    zero_dq = gl.zeros([BM, DQW], gl.float32, dq_layout)
    dv = gl.zeros([KW, D], gl.float32, acc_layout)
    dk = gl.zeros([KW, D], gl.float32, acc_layout)

    mbarrier.wait(kv_bar, 0)
    for it in range(G * tiles):
        st = it % STAGES
        ph = (it // STAGES) & 1
        buf = it % 2
        t = first + it % tiles
        q_row = (batch * HQ + kvh * G + it // tiles) * S + t * BM
        q_t = q_smem.index(st)
        do_t = do_smem.index(st)
        mbarrier.wait(q_ready.index(st), ph)
        s_tok = warpgroup_mma(k_w, q_t.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(st), ph)
        dp_tok = warpgroup_mma(v_w, do_t.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        lse2 = lse_smem.index(st).load(col_layout) * 1.4426950408889634
        s_t = warpgroup_mma_wait(1, deps=[s_tok])
        p_t = gl.exp2(s_t * C - lse2[None, :])
        if t < first + 2:  # the two tiles that straddle the diagonal
            cols = t * BM + gl.arange(0, BM, layout=col_layout)
            p_t = gl.where(keys[:, None] <= cols[None, :], p_t, 0.0)
        delta = delta_smem.index(st).load(col_layout)
        dp_t = warpgroup_mma_wait(0, deps=[dp_tok])
        ds16 = (p_t * (dp_t - delta[None, :])).to(dtype)
        p16 = gl.convert_layout(p_t.to(dtype), op_layout)
        dv_tok = warpgroup_mma(p16, do_t, dv, is_async=True)
        # dS^T into this warpgroup's rows of ds_smem[buf] (free once both warpgroups'
        # dQ wgmmas of two tiles ago read it): the A of dK here, half the A of dQ
        mbarrier.wait(ds_free.index(buf), ((it // 2) & 1) ^ 1)
        ds_mine = ds_smem.index(buf).slice(WG * KW, KW, dim=0)
        ds_mine.store(ds16)
        fence_async_shared()
        mbarrier.arrive(ds_ready.index(buf))
        dk_tok = warpgroup_mma(ds_mine, q_t, dk, is_async=True)
        dv, dk, p16 = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p16])
        mbarrier.arrive(empty.index(st))
        mbarrier.wait(ds_ready.index(buf), (it // 2) & 1)
        dq_tok = warpgroup_mma(ds_smem.index(buf).permute((1, 0)), k_cols, zero_dq, use_acc=False, is_async=True)
        dq = warpgroup_mma_wait(0, deps=[dq_tok])
        mbarrier.arrive(ds_free.index(buf))
        tma.store_wait(pendings=0)  # the previous tile's reduce has read my_dq
        my_dq.store(dq * SM_SCALE)
        fence_async_shared()
        _tma_reduce_add(dq_desc, [q_row, WG * DQW], my_dq)

    # epilogue: dV, then dK * scale, through this warpgroup's own dQ staging tile
    tma.store_wait(pendings=0)
    out = my_dq._reinterpret(dtype, [KW, D], dv_desc.layout)
    out_row = (batch * HKV + kvh) * S + key0
    out.store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dv_desc, [out_row, 0], out)
    tma.store_wait(pendings=0)
    out.store((dk * SM_SCALE).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [out_row, 0], out)
    tma.store_wait(pendings=0)


@gluon.jit
def gluon_bwd_kernel(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc,
                     S, HQ: gl.constexpr, HKV: gl.constexpr, SM_SCALE: gl.constexpr, STAGES: gl.constexpr):
    """The fused backward (see the module doc); launched with num_warps=4."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(BN == 2 * dq_desc.block_type.shape[0])
    gl.static_assert(D == 2 * dq_desc.block_type.shape[1])
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BN, D], v_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BM], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BM], delta_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BN, BM], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(ds_free.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (dq_desc, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem,
                     dq_smem, kv_bar, q_ready, do_ready, empty, ds_ready, ds_free, S, HQ, HKV, SM_SCALE, 0, STAGES)),
        (_consumer, (dq_desc, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem,
                     dq_smem, kv_bar, q_ready, do_ready, empty, ds_ready, ds_free, S, HQ, HKV, SM_SCALE, 1, STAGES)),
        (_producer, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                     lse_smem, delta_smem, kv_bar, q_ready, do_ready, empty, S, HQ, HKV, STAGES)),
    ], [4, 1], [240, 24])


# ----------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------


def _desc(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor over the [rows, last dim] (or flat, for 1-D blocks) view of `t`."""
    view = t.reshape(-1) if len(block) == 1 else t.reshape(-1, t.shape[-1])
    dtype = getattr(gl, str(t.dtype).removeprefix("torch."))
    return TensorDescriptor.from_tensor(view, block, gl.NVMMASharedLayout.get_default_for(block, dtype))


def make_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
              delta: torch.Tensor, dq_acc: torch.Tensor, dk: torch.Tensor,
              dv: torch.Tensor, stages: int = STAGES) -> tuple[list[Any], dict[str, Any], tuple[int, int]]:
    """The kernel's arguments, its constexprs and its grid."""
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    assert d == HEAD_DIM and s % BLOCK_N == 0 and hq % hkv == 0, (q.shape, k.shape)
    assert all(t.is_contiguous() for t in (q, k, v, do, lse, delta, dq_acc, dk, dv))
    tile = [BLOCK_M, HEAD_DIM]
    half = [BLOCK_N // 2, HEAD_DIM]
    args = [_desc(q, tile), _desc(do, tile), _desc(k, [BLOCK_N, HEAD_DIM]), _desc(v, [BLOCK_N, HEAD_DIM]),
            _desc(lse, [BLOCK_M]), _desc(delta, [BLOCK_M]), _desc(dq_acc, [BLOCK_N // 2, HEAD_DIM // 2]),
            _desc(dk, half), _desc(dv, half), s]
    constexprs = {"HQ": hq, "HKV": hkv, "SM_SCALE": SCALE, "STAGES": stages}
    return args, constexprs, (b * hkv, s // BLOCK_N)


def gluon_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
                   lse: torch.Tensor, stages: int = STAGES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of causal GQA attention: delta, the dQ accumulator and its cast in
    torch, the rest in `gluon_bwd_kernel`."""
    delta = (do.float() * o.float()).sum(-1)
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    args, constexprs, grid = make_args(q, k, v, do, lse, delta, dq_acc, dk, dv, stages)
    gluon_bwd_kernel[grid](*args, **constexprs, num_warps=4)
    return dq_acc.to(q.dtype), dk, dv


def compile_for_sm90(stages: int = STAGES) -> Any:
    """`triton.compile` the kernel for sm_90a without a GPU, with the argument types a
    launch on the Llama shape gives (descriptors from small CPU tensors, S divisible by 16)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    q = torch.empty(1, 32, 256, HEAD_DIM, dtype=torch.bfloat16)
    k = torch.empty(1, 8, 256, HEAD_DIM, dtype=torch.bfloat16)
    stats = torch.empty(1, 32, 256)
    args, values, _ = make_args(q, k, k, q, stats, stats, q.float(), k, k, stages)
    values.update(zip(gluon_bwd_kernel.arg_names, args))
    signature: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, name in enumerate(gluon_bwd_kernel.arg_names):
        if i >= len(args):
            signature[name] = "constexpr"
            constexprs[(i,)] = values[name]
        else:
            signature[name] = mangle_type(values[name])
            if name == "S":
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = GluonASTSource(gluon_bwd_kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


# ----------------------------------------------------------------------------------
# GPU check and timing
# ----------------------------------------------------------------------------------


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 autograd gradients of causal GQA attention, one batch element at a time."""
    grads: list[list[torch.Tensor]] = [[], [], []]
    group = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        qb, kb, vb = (t[b:b + 1].double().requires_grad_() for t in (q, k, v))
        s = qb @ kb.repeat_interleave(group, 1).transpose(-1, -2) * SCALE
        causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        o = torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ vb.repeat_interleave(group, 1)
        for acc, grad in zip(grads, torch.autograd.grad(o, (qb, kb, vb), do[b:b + 1].double())):
            acc.append(grad)
    dq, dk, dv = (torch.cat(g) for g in grads)
    return dq, dk, dv


def _forward_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """O (bf16) and the natural-log LSE (f32) of causal GQA attention, in f32 math."""
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for b in range(q.shape[0]):
        s = q[b].float() @ k[b].float().repeat_interleave(group, 0).transpose(-1, -2) * SCALE
        causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~causal, float("-inf"))
        lse = torch.logsumexp(s, -1)
        outs.append((torch.exp(s - lse[..., None]) @ v[b].float().repeat_interleave(group, 0)).to(q.dtype))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses).contiguous()


def _sdpa_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _errors(got: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> dict[str, list[float]]:
    """Max abs and relative RMS error of dQ, dK, dV against the float64 reference."""
    out: dict[str, list[float]] = {"max_abs": [], "rel_rms": []}
    for a, r in zip(got, ref):
        d = a.double() - r
        out["max_abs"].append(float(d.abs().max()))
        out["rel_rms"].append(float(d.pow(2).mean().sqrt() / r.pow(2).mean().sqrt()))
    return out


def _inputs(b: int, s: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(b, 32, s, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, 8, s, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    return q, k, v, do


def _check(b: int, s: int, stages: list[int]) -> list[dict[str, Any]]:
    """Gradients of the Gluon kernel (per ring depth) and of SDPA (cuDNN) against float64
    autograd, on the same inputs."""
    q, k, v, do = _inputs(b, s, seed=s + b)
    o, lse = _forward_stats(q, k, v)
    ours = {n: gluon_backward(q, k, v, o, do, lse, n) for n in stages}
    torch.cuda.synchronize()
    ref = _reference(q, k, v, do)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sdpa = _errors(torch.autograd.grad(_sdpa_cudnn(*leaves), leaves, do), ref)
    rows = []
    for n, grads in ours.items():
        errors = _errors(grads, ref)
        ratio = [x / max(y, 1e-30) for x, y in zip(errors["max_abs"], sdpa["max_abs"])]
        rows.append({"B": b, "S": s, "stages": n, "ours": errors, "sdpa_cudnn": sdpa,
                     "max_abs_ratio_vs_sdpa": ratio})
    return rows


def _timing(b: int, s: int, stages: int) -> dict[str, Any]:
    """Backward times (us, triton.testing.do_bench medians) of the Gluon kernel, SDPA
    cuDNN and attnfuse's Triton backward of examples/llama3.attn, with kernel breakdowns."""
    import triton
    from backward_profile import kernel_times

    import attnfuse

    q, k, v, do = _inputs(b, s, seed=1)
    o, lse = _forward_stats(q, k, v)
    delta = (do.float() * o.float()).sum(-1)
    dq_acc = torch.zeros(q.shape, device="cuda", dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    args, constexprs, grid = make_args(q, k, v, do, lse, delta, dq_acc, dk, dv, stages)

    def kernel_only() -> None:
        dq_acc.zero_()
        gluon_bwd_kernel[grid](*args, **constexprs, num_warps=4)

    def with_host_ops() -> None:
        torch.sum(do.float() * o.float(), -1, out=delta)
        dq_acc.zero_()
        gluon_bwd_kernel[grid](*args, **constexprs, num_warps=4)
        dq_acc.to(q.dtype)

    row: dict[str, Any] = {"B": b, "S": s, "stages": stages}
    row["gluon_kernel_plus_zero_us"] = 1e3 * triton.testing.do_bench(kernel_only, warmup=25, rep=200)
    row["gluon_with_delta_zero_cast_us"] = 1e3 * triton.testing.do_bench(with_host_ops, warmup=25, rep=200)
    row["gluon_kernels"] = kernel_times(with_host_ops, 10)
    candidates: dict[str, Callable[..., torch.Tensor]] = {
        "sdpa_cudnn": _sdpa_cudnn,
        "attnfuse_triton_llama3_with_rope": attnfuse.compile(
            Path(__file__).resolve().parents[2].joinpath("examples", "llama3.attn").read_text()),
    }
    for name, fn in candidates.items():
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)

        def backward(out: torch.Tensor = out, leaves: list[torch.Tensor] = leaves) -> None:
            torch.autograd.grad(out, leaves, do, retain_graph=True)

        row[f"{name}_backward_us"] = 1e3 * triton.testing.do_bench(backward, warmup=25, rep=200)
        row[f"{name}_kernels"] = kernel_times(backward, 10)
    row["speedup_vs_sdpa_cudnn"] = row["sdpa_cudnn_backward_us"] / row["gluon_with_delta_zero_cast_us"]
    return row


def _smoke(stages: int) -> None:
    """One small launch (run in a child process first, so that a deadlock is a timeout)."""
    q, k, v, do = _inputs(1, 256, seed=0)
    o, lse = _forward_stats(q, k, v)
    gluon_backward(q, k, v, o, do, lse, stages)
    torch.cuda.synchronize()


def main() -> int:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(root), str(root / "bench")]  # attnfuse, and bench/backward_profile.py's kernel_times
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stages", default="2,3", help="ring depths to check and time")
    ap.add_argument("--smoke", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.smoke is not None:
        _smoke(a.smoke)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"compile_sm90": {}, "smoke": {}, "check": [], "timing": []}
    path = a.out / "gluon_bwd.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1))

    from attnfuse.backends.gluon.sm90 import gluon_resources

    runnable: list[int] = []
    for stages in (int(x) for x in a.stages.split(",")):
        result["compile_sm90"][stages] = gluon_resources(compile_for_sm90(stages))
        try:
            done = subprocess.run([sys.executable, __file__, "--out", str(a.out), "--smoke", str(stages)],
                                  capture_output=True, text=True, timeout=90)
            result["smoke"][stages] = {"rc": done.returncode, "stderr": done.stderr[-3000:]}
        except subprocess.TimeoutExpired:
            result["smoke"][stages] = {"rc": None, "error": "timed out after 90 s (deadlock?)"}
        if result["smoke"][stages]["rc"] == 0:
            runnable.append(stages)
        save()
        print(stages, result["smoke"][stages], flush=True)
    for b, s in ((2, 1024), (8, 2048)) if runnable else ():
        try:
            result["check"] += _check(b, s, runnable)
        except Exception as err:  # noqa: BLE001 - a failure is a result
            result["check"].append({"B": b, "S": s, "error": repr(err)[:2000]})
        print(json.dumps(result["check"][-len(runnable):]), flush=True)
        save()
        torch.cuda.empty_cache()
    for stages in runnable:
        try:
            result["timing"].append(_timing(8, 2048, stages))
        except Exception as err:  # noqa: BLE001
            result["timing"].append({"stages": stages, "error": repr(err)[:2000]})
        print(json.dumps(result["timing"][-1])[:3000], flush=True)
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
