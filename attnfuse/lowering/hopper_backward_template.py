"""The Gluon template of the Hopper backward schedule (FA3-style: dK, dV and dQ in one
warp-specialized kernel, dQ reduced across CTAs by TMA).

From the prototype `bench/prototypes/gluon_bwd.py` (in git up to commit d56cc71; removed
once this lowering replaced it; measured on an H200, run 18: 1652 us against
cuDNN's bprop kernel's 1433 us and the Triton dK/dV + dQ kernels' 2176 us at
Llama-3-8B, B=8, S=2048), generalized to any band the tile plan describes, any GQA
group and head dims 64 and 128. One CTA owns 128 keys of one (batch, kv head):

* a 1-warp producer partition TMA-loads K and V of the block once, then per 64-row q
  tile of the walk Q + LSE and dO + delta into a `$stages`-deep ring;
* two 4-warp consumer warpgroups, each owning 64 keys, compute per q tile
  S^T = K Q^T and dP^T = V dO^T (async wgmma), P^T = exp2(c S^T - lse2) with the
  planned masks on the tiles that need them, dS^T = P^T (dP^T - delta), dV += P^T dO,
  dK += dS^T Q, and the share dQ[:, 64w:] of dQ = dS K from both warpgroups' dS^T
  (handed over in shared memory);
* per consumer warpgroup a 1-warp dQ writer adds that share, in its turn, into the f32
  dQ buffer with `cp.reduce.async.bulk.tensor.add` and frees the shared staging buffer
  once the TMA unit has read it, so the consumers never wait on global memory;
* the epilogue stores dK * scale and dV from registers.

The key blocks that add into a dQ tile do so in block order (FlashAttention-3's
deterministic mode), so the gradients are bitwise reproducible. An unordered variant
(adds as they come) measured no faster (H200, run 23: 2.400 against 2.390 ms at S = 2048,
7.784 against 7.727 at 8192, Llama-3-8B forward + backward) and was removed. A per-(tile, head,
column half) counter in global memory says how many have added; block n's writer waits
until it reads n - first (`take_turn`, an acquire), adds, and once the add is complete
releases the next (`pass_turn`: one thread's `fence.acq_rel.gpu` and a relaxed `red`).
The first adder stores its tile instead of adding it, so the dQ buffer needs no
zeroing where every tile has an adder. The blocks adding into a tile are consecutive
(block 0 on for bands without a lower bound; for a sliding window the first is where
the window's lower edge puts it).

What is problem-specific comes from tile IR device functions: `$range_fn` (the q walk
of a key block: four scalars, for a band its first row, tile count and the rows
[full_lo, full_hi) that need no mask, for a runtime block map its map row, tile count,
partial and full q block counts), `$walk_fn` (the first row of the walk's `tile`-th q
tile and whether the planned masks apply), `$turn` (block n's dQ turn on the tile at
`t_start`: n minus the first block that visits it for a band, a rank read from the map
otherwise) and the functions of `$mask_step` (ALiBi on every S^T tile, the planned masks on the tiles
at the band's edges; keys along dim 0).
"""

from __future__ import annotations

from string import Template

from attnfuse.lowering.hopper_functions import DESCRIPTOR_AT

TEMPLATE = Template(DESCRIPTOR_AT + '''\
from triton._C.libtriton import ir as _ir
from triton.experimental.gluon.language._core import builtin as _builtin


@_builtin
def ${k}_reduce_add(tensor_desc, coord, src, _semantic=None):
    """global[box at coord] += shared `src` (`cp.reduce.async.bulk.tensor ... .add`),
    tracked like a TMA store (`tma.store_wait`); Gluon 3.6 has no wrapper for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def ${k}_reduce_complete():
    """Wait until this thread's bulk operations (the TMA reduce) are complete, not only
    read from shared memory (`tma.store_wait` waits for that), and order them before
    what follows (`fence.proxy.async.global`)."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\\n\\tfence.proxy.async.global;\\n\\tmov.u32 $$0, 0;",
                              "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def ${k}_pass_turn(sem):
    """This warp's dQ add is complete: the next key block may add into the tile (counter
    at `sem`). One thread releases it with a `fence.acq_rel.gpu` and a relaxed `red` (a
    `red.release`, or a release by the consumers after every step, cost a quarter of the
    kernel: H200, Llama-3-8B); its predicate comes from a thread-index tensor, since a
    `red` predicated on %tid.x inside the PTX made ptxas spill the consumers' registers.
    The lane that issued the add (`elect.sync`) waits for it; `bar.warp.sync` then
    orders that before the releasing lane's fence, whichever lanes they are."""
    ${k}_reduce_complete()
    lanes: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    first = (gl.arange(0, 32 * gl.num_warps(), layout=lanes) == 0).to(gl.int32)
    gl.inline_asm_elementwise(
        "{\\n\\t.reg .pred p;\\n\\tbar.warp.sync -1;\\n\\tsetp.ne.b32 p, $$2, 0;\\n\\t@p fence.acq_rel.gpu;\\n\\t"
        "@p red.relaxed.gpu.global.add.u32 [$$1], 1;\\n\\t}\\n\\tmov.u32 $$0, 0;",
        "=r,l,r", [sem, first], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def ${k}_take_turn(sem, turn):
    """Wait until the key blocks before this one (`turn` of them) have added into the tile."""
    # the spin loop is PTX (labels scoped by the braces): a loop in the kernel's IR made
    # ptxas spill some 200 bytes of the consumer's live registers
    gl.inline_asm_elementwise(
        "{\\n\\t.reg .pred p;\\n\\t.reg .u32 v;\\n\\tTURN_WAIT:\\n\\t"
        "ld.acquire.gpu.global.u32 v, [$$1];\\n\\tsetp.ne.u32 p, v, $$2;\\n\\t@p bra TURN_WAIT;\\n\\t}\\n\\t"
        "fence.proxy.async.global;\\n\\tmov.u32 $$0, 0;",
        "=r,l,r", [sem, turn], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def ${k}_coords():
    """(batch, kv head, key block) of this CTA. The (batch, kv head) pairs go in chunks of
    $chunk (grid axis 1); within a chunk (axis 0), key block 0 of each pair first (the
    longest causal walks), then block 1, and so on: about a $chunk-th of the CTAs in
    flight work on each pair of a chunk, so the dQ tiles they add into are reused in L2.
    Constant divisors only, so ptxas recomputes these from the CTA id instead of keeping
    them in registers."""
    rest = gl.program_id(0)
    bkv = gl.program_id(1) * $chunk + rest % $chunk
    return bkv // $hk, bkv % $hk, rest // $chunk


@gluon.jit
def ${k}_step(it, tiles):
    """(head of the group, q tile) of step `it` of a walk of `tiles` q tiles: the last
    tile first, the group's heads inner, so block n reaches each (tile, head) at the step
    block n - 1 does. The producer, the consumers and the dQ writers walk alike."""
    return it % $group, tiles - 1 - it // $group


@gluon.jit
def ${k}_producer(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                  lse_smem, delta_smem, kv_bar, q_ready, do_ready, empty, $in_steps, $args):
    """1 warp: K and V of the block, then Q + LSE and dO + delta of every q tile of the walk."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    batch, kv_head, n = ${k}_coords()
    q_lo, tiles, full_lo, full_hi = $range_fn(n * BN, batch, kv_head, $args)
    k_row, k_col = ${k}_at(batch, kv_head, $k_steps)
    v_row, v_col = ${k}_at(batch, kv_head, $v_steps)
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [k_row + n * BN, k_col], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [v_row + n * BN, v_col], kv_bar, v_smem)
    for it in range($group * tiles):
        st = it % $stages
        # a fresh mbarrier counts as having completed phase "1": the first lap passes
        mbarrier.wait(empty.index(st), ((it // $stages) & 1) ^ 1)
        g, tile = ${k}_step(it, tiles)
        t_start, masked = $walk_fn(tile, q_lo, tiles, full_lo, full_hi, $args)
        head = kv_head * $group + g
        lse_row = (batch * $hq + head) * $q_len + t_start  # lse and delta: contiguous [B, Hq, Sq]
        q_row, q_col = ${k}_at(batch, head, $q_steps)
        do_row, do_col = ${k}_at(batch, head, $do_steps)
        mbarrier.expect(q_ready.index(st), q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row + t_start, q_col], q_ready.index(st), q_smem.index(st))
        tma.async_copy_global_to_shared(lse_desc, [lse_row], q_ready.index(st), lse_smem.index(st))
        mbarrier.expect(do_ready.index(st), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(do_desc, [do_row + t_start, do_col], do_ready.index(st), do_smem.index(st))
        tma.async_copy_global_to_shared(delta_desc, [lse_row], do_ready.index(st), delta_smem.index(st))


@gluon.jit
def ${k}_consumer(dq_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_smem,
                  kv_bar, q_ready, do_ready, empty, ds_ready, ds_free, dq_full, dq_empty, $args, WG: gl.constexpr):
    """Consumer warpgroup WG: keys [64 WG, 64 WG + 64) of the block."""
    BM: gl.constexpr = q_smem.shape[1]
    D: gl.constexpr = q_smem.shape[2]
    KW: gl.constexpr = k_smem.shape[0] // 2
    DQW: gl.constexpr = dq_desc.block_type.shape[1]
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

    batch, kv_head, n = ${k}_coords()
    q_lo, tiles, full_lo, full_hi = $range_fn(n * 2 * KW, batch, kv_head, $args)
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
    for it in range($group * tiles):
        st = it % $stages
        ph = (it // $stages) & 1
        buf = it % 2
        g, tile = ${k}_step(it, tiles)
        head = kv_head * $group + g
        t_start, masked = $walk_fn(tile, q_lo, tiles, full_lo, full_hi, $args)
        q_t = q_smem.index(st)
        do_t = do_smem.index(st)
        mbarrier.wait(q_ready.index(st), ph)
        s_tok = warpgroup_mma(k_w, q_t.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(st), ph)
        dp_tok = warpgroup_mma(v_w, do_t.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        lse = lse_smem.index(st).load(col_layout)
        # a query that sees no key (lse = -inf) gets P = 0
        lse2 = gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        s_t = warpgroup_mma_wait(1, deps=[s_tok])
$mask_step
        p_t = gl.exp2(s_t * $c - lse2[None, :])
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
        mbarrier.wait(dq_empty.index(WG), (it & 1) ^ 1)  # the writer has read my_dq
        my_dq.store(dq * $scale)
        fence_async_shared()
        mbarrier.arrive(dq_full.index(WG))

    # epilogue: dK * scale and dV of this warpgroup's keys, from registers
    out_keys = key0 + gl.arange(0, KW, layout=gl.SliceLayout(1, acc_layout))
    out_cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
$dk_store
    dv_base = batch.to(gl.int64) * $dv_s0 + kv_head.to(gl.int64) * $dv_s1
    gl.store($dv + dv_base + out_keys[:, None] * $dv_s2 + out_cols[None, :] * $dv_s3, dv.to($dv_dtype))


@gluon.jit
def ${k}_dq_writer(dq_desc, dq_smem, dq_full, dq_empty, $dq_steps, $args, WG: gl.constexpr):
    """1 warp: the dQ share of consumer warpgroup WG, step by step: wait for it in shared
    memory, add it into the f32 buffer in its turn, free the staging buffer
    once the TMA unit has read it."""
    BM: gl.constexpr = dq_smem.shape[1]
    DQW: gl.constexpr = dq_desc.block_type.shape[1]
    batch, kv_head, n = ${k}_coords()
    q_lo, tiles, full_lo, full_hi = $range_fn(n * 2 * BM, batch, kv_head, $args)  # BN = 2 BM
    my_dq = dq_smem.index(WG)
    for it in range($group * tiles):
        g, tile = ${k}_step(it, tiles)
        head = kv_head * $group + g
        t_start, masked = $walk_fn(tile, q_lo, tiles, full_lo, full_hi, $args)
        dq_row, dq_col = ${k}_at(batch, head, $dq_steps)
        mbarrier.wait(dq_full.index(WG), it & 1)
        tile_turn = $turns + batch * ${turns}_stride0 + head * ${turns}_stride1 + (t_start // BM) * ${turns}_stride2 + WG * ${turns}_stride3
        turn = $turn
        ${k}_take_turn(tile_turn, turn)
        if turn == 0:  # the first adder: nothing to add to
            tma.async_copy_shared_to_global(dq_desc, [dq_row + t_start, dq_col + WG * DQW], my_dq)
        else:
            ${k}_reduce_add(dq_desc, [dq_row + t_start, dq_col + WG * DQW], my_dq)
        tma.store_wait(pendings=0)
        mbarrier.arrive(dq_empty.index(WG))
        ${k}_pass_turn(tile_turn)


def __kernel__():
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(BN == 128)
    gl.static_assert(BN == 2 * BM)  # the dQ writer's key block
    gl.static_assert(D == 2 * dq_desc.block_type.shape[1])
    q_smem = gl.allocate_shared_memory(dtype, [$stages, BM, D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [$stages, BM, D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BN, D], v_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [$stages, BM], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [$stages, BM], delta_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BN, BM], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [$stages, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [$stages, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [$stages, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range($stages):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(ds_free.index(i), count=2)
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (${k}_consumer, (dq_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_smem,
                         kv_bar, q_ready, do_ready, empty, ds_ready, ds_free, dq_full, dq_empty, $args, 0)),
        (${k}_consumer, (dq_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_smem,
                         kv_bar, q_ready, do_ready, empty, ds_ready, ds_free, dq_full, dq_empty, $args, 1)),
        (${k}_producer, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                         lse_smem, delta_smem, kv_bar, q_ready, do_ready, empty, $in_steps, $args)),
        (${k}_dq_writer, (dq_desc, dq_smem, dq_full, dq_empty, $dq_steps, $args, 0)),
        (${k}_dq_writer, (dq_desc, dq_smem, dq_full, dq_empty, $dq_steps, $args, 1)),
    ], [4, 1, 1, 1], [240, 24, 24, 24])
''')
"""Substitutions: k (name prefix), hq, hk, group, chunk, stages, scale, c (scale * log2 e), args,
the 2-D descriptors' step arguments (`q_steps`, `do_steps`, `k_steps`, `v_steps`, `dq_steps`,
and `in_steps`: Q's, dO's, K's and V's; see `hopper_functions`),
range_fn, walk_fn, mask_step, q_len, dv (pointer argument), dv_s0..3, dv_dtype (Gluon
dtype of the store), dk_store (the epilogue's lines that store dK * scale from
`dk`, `out_keys`, `out_cols`: a `gl.store`, or a device function that first rotates
dK back by K's RoPE), turns (the pointer argument of the
turn counters, [B, Hq, Sq / 64, 2] int32, zeroed) and turn (an expression of `t_start`
and `n`: how many key blocks add into the tile before block n).

The walk (`${k}_step`) goes down the q tiles (last first) with the heads of the group
inner: block n reaches each (tile, head) at the step block n - 1 does (head-outer
ascending walks waited 2 tiles per head for their turns)."""
