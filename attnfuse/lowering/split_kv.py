"""Split-KV decoding: the split kernel, the combine kernel and the host code that picks them.

For a `#attn.split_kv<ROWSxBN, group G, ...>` plan (`split-kv` pass):

* `@f_split_kv`, grid `[splits, B * Hkv, 1]`: one program per (split, batch, KV head)
  packs the query rows of the G heads of its KV head into one tile (row `r` is query
  `r / G` of head `kv_head * G + r % G`), walks its share of the KV blocks the tile plan
  visits (the same band loops, masked / full / masked, cut at the split's bounds) and
  writes a partial output (fp32, normalised) and its base-2 log-sum-exp to a workspace.
  Split 0 starts its state from the sink logits, so the sinks count once. With one split
  the program writes `out` and `lse` itself.
  Beside it, `@f_split_kv_small` with 16-row tiles (calls whose packed rows fit them and
  whose programs fit one wave), `@f_split_kv_wide` for 16-bit inputs with head dims up
  to 128 (16 rows, `WIDE_BLOCK_N` keys per block, the whole SM's shared memory: those
  calls whose splits walk at least `WIDE_MIN_BLOCKS` blocks), with `persistent 1` its
  persistent twin `@f_split_kv_persistent` ahead of it (grid `[programs, 1, 1]`: calls
  of one split with many pairs over short caches, `split_host.persistent_taken`; each
  program walks pairs in a `tile.flatten` loop and stores `out` and `lse`) and, for a
  paged cache, after the wide one, `@f_split_kv_short`:
  the smaller tile, one masked loop over the split's keys, the contiguous pipeline depth
  (calls whose SMs each walk few blocks, `SHORT_SPLIT_BLOCKS`). The 16-row kernels skip
  loops without a block, and with `merge 1` their last program per (batch, KV head)
  merges the splits. A paged program's split kernels address the pools with i32
  offsets, for calls whose pools those reach (`host.fits_i32`); `@f_split_kv_i64`, the
  full tile with i64 offsets, takes the others.
* `@f_split_kv_combine`, grid `[Sq, B * Hq, 1]`: merges the partial results of one query
  row, weighted by `exp2(lse_s - lse)`, into `out` and the final `lse`.
* Host code: the split count (`auto`: about `waves` programs per SM, at least
  `min_blocks` KV blocks per split unless that leaves SMs idle; computed from
  `host.sm_count` once per launch plan), the split kernel, and the choice of path:
  calls whose `Sq * G` rows fit one tile run the split kernel (and the combine when
  there is more than one split); other calls run the usual forward kernel. A zero grid
  launches nothing.

Every score op sees each packed row with its own head and query index, so ALiBi, bias
tensors, score_mod regions, masks (bands bottom-right or top-left, windows, documents,
custom predicates) and in-kernel Q/K transforms keep their meaning.

```mlir
%decoding = arith.cmpi sle, %packed_rows, %c64 : i32
...
host.launch @f_split_kv[%split_grid, %split_bh, %one] (%q, %k, %v, %out, %lse, %batch, %q_len, %kv_len, %o_part, %lse_part) : ...
host.launch @f_split_kv_combine[%combine_grid, %combine_bh, %one] (%o_part, %lse_part, %out, %lse, %q_len, %split_grid) : ...
```
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects.builtin import DYNAMIC_INDEX, StringAttr, TensorType, f32, i32
from xdsl.ir import Operation, SSAValue

from attnfuse.analysis.split_kv import SMALL_ROWS, wide_block_n
from attnfuse.analysis.tile_plan import k_transformed_in_kernel
from attnfuse.dialects.attn_split_kv import SplitKVAttr
from attnfuse.dialects.host import FitsI32Op
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import Value
from attnfuse.lowering.forward import LN2, LOG2E, SINK_START_MAX, ForwardKernel, ForwardSpec
from attnfuse.lowering.host_code import HostCode
from attnfuse.lowering.qk_side import padded
from attnfuse.lowering.signature import TensorArg
from attnfuse.lowering.split_host import persistent_taken, split_count, tier_taken
from attnfuse.lowering.split_combine import build_combine, merge_in_kernel, merge_rows_limit, merge_slots_limit
from attnfuse.lowering.tile_fit import SHARED_MEMORY_BUDGET, kv_stages


def split_stages(spec: ForwardSpec, rows: int, block_n: int, *, paged_depth: bool = True,
                 whole_sm: bool = False) -> int:
    """Pipeline depth (`kv_stages`) whose tiles fit half of `SHARED_MEMORY_BUDGET`, so
    that two programs share an SM (all of it with `whole_sm`): the packed Q tile of
    `rows` rows plus the K and V tiles, counted as `pipeline_stages` counts them for the
    forward kernel; a paged program's two extra stages unless `paged_depth` is False."""
    q_type, v_type = spec.q.type, spec.v.type
    assert isinstance(q_type, TensorType) and isinstance(v_type, TensorType)
    return kv_stages(q_type, v_type, rows, block_n, SHARED_MEMORY_BUDGET // (1 if whole_sm else 2),
                     k_in_kernel=k_transformed_in_kernel(spec.program), f32_dot=spec.f32_dot,
                     paged=spec.paged is not None and paged_depth)


def split_warps(spec: ForwardSpec, rows: int) -> int:
    """4 warps for 16-bit tiles of up to 64 x 128 (packed rows x padded head dim), else 8
    (f32 dots run on FMA units and hold their tiles in registers)."""
    q_type, v_type = spec.q.type, spec.v.type
    assert isinstance(q_type, TensorType) and isinstance(v_type, TensorType)
    width = padded(max(q_type.get_shape()[3], v_type.get_shape()[3]))
    return 4 if rows * width <= 64 * 128 and q_type.element_type != f32 else 8


class SplitKernel(ForwardKernel):
    """The split kernel (see the module docstring); reuses the forward kernel's KV walk.
    `one_loop`: walk the split's keys in one masked loop instead of the band's loops
    (for splits of a few KV blocks, where each loop's pipeline prologue costs more than
    the mask code saves); `skip_empty`: skip the band's loops that have no block
    (`_kv_range`); `parts`: the workspace of partial outputs and lse, or None for the
    persistent kernel: one split, grid `[programs, 1, 1]`, each program walking the
    (batch, KV head) pairs `program_id, program_id + programs, ...` in a `tile.flatten`
    loop; `merge`: (the counters, the host's choice) for a kernel whose last program per
    (batch, KV head) merges the splits (`_merge_if_last`)."""

    def __init__(self, spec: ForwardSpec, name: str, plan: SplitKVAttr,
                 parts: tuple[SSAValue, SSAValue] | None, merge: tuple[SSAValue, SSAValue] | None = None, *,
                 one_loop: bool = False, skip_empty: bool = False) -> None:
        super().__init__(spec, name)
        self.one_loop = one_loop
        self.skip_empty = skip_empty
        self.group = plan.group.data
        self.parts = None
        if parts is not None:
            self.parts = self.sig.tensor("Opart", parts[0]), self.sig.tensor("LSEpart", parts[1])
        self.counts = self.merge = None
        if merge is not None:  # (the counters, whether this call merges)
            self.counts = self.sig.tensor("Counts", merge[0])
            self.merge = self.sig.scalar("merge", merge[1])

    def build(self) -> KernelOp:
        spec = self.spec
        b = self.sig.start(self.name, num_warps=spec.num_warps, num_stages=spec.num_stages, launch=spec.launch,
                           f32_dot=spec.f32_dot)
        self.b = b
        if self.parts is not None:
            self._pair(b.program_id(0, name="split"), b.program_id(1, name="pid_bh"), b.num_programs(0))
            return b.finish()
        assert self.batch_arg.value is not None
        pairs = b.mul(self.batch_arg.value, self.hk, name="pairs")
        with b.for_(b.program_id(0, name="first_pair"), pairs, b.num_programs(0), iv_name="pid_bh",
                    flatten=True) as loop:
            self._pair(b.constant(0, i32), loop.iv, None)
        return b.finish()

    def _pair(self, split: SSAValue, pid_bh: SSAValue, splits: SSAValue | None) -> None:
        """The work of split `split` of (batch, KV head) `pid_bh`; `splits`: the split
        count (None: one split, known when the kernel is built)."""
        b = self.b
        q_len, kv_len = self.q_len_arg.value, self.kv_len_arg.value
        assert q_len is not None and kv_len is not None
        batch = b.div(pid_bh, self.hk, name="batch")
        kv_head = b.rem(pid_bh, self.hk, name="kv_head")
        packed = b.arange(0, self.block_m, name="packed")
        rows = b.div(packed, self.group, name="rows")
        head = b.add(b.mul(kv_head, self.group), b.rem(packed, self.group), name="head")
        row_ok = b.lt(rows, q_len, name="row_ok")
        kv_len = self._kv_length(batch, kv_len)
        self.coords = (batch, b.expand_dims(head, 1), rows, q_len, kv_len)

        self._packed_q(split, batch, head, rows, row_ok)
        self._kv_bases(batch, kv_head, kv_head)
        self.seed_bh = None
        state, sink2 = self._start(split, head)
        ranges = self._loop_ranges(b.constant(0, q_len.type), q_len, kv_len)
        split_lo, split_hi = self._split_keys(split, ranges[0][0], ranges[-1][1], splits)
        if self.one_loop:
            ranges = [(ranges[0][0], ranges[-1][1], False)]
        for start, end, full in ranges:
            state = self._kv_range(b.maximum(start, split_lo), b.minimum(end, split_hi), state, full_tile=full)
        m_i, l_i, acc = state
        l_safe = b.where(b.eq(l_i, 0.0), 1.0, l_i)
        out = b.div(acc, b.expand_dims(l_safe, 1), name="out")
        lse2 = b.where(b.eq(l_i, 0.0), float("-inf"), b.add(m_i, b.log2(l_safe)), name="lse2")
        if sink2 is not None:
            lse2 = b.maximum(lse2, sink2)  # lse >= sink exactly; +inf for a +inf sink
        self._store(split, batch, head, rows, row_ok, out, lse2, (pid_bh, kv_head), splits)

    def _merge_if_last(self, pid_bh: SSAValue, batch: SSAValue, kv_head: SSAValue) -> None:
        """For a kernel built to merge, with `merge` set (the host's choice: few enough
        splits, `merge_rows_limit`), each program counts itself done once its partial
        results are stored; the last of its (batch, KV head) merges them all
        (`merge_in_kernel`) and sets the counter back to 0, as the next call expects."""
        b = self.b
        if self.merge is None or self.counts is None or self.parts is None:
            return
        assert self.merge.value is not None and self.counts.ptr is not None and self.q_len_arg.value is not None
        assert self.lse_arg is not None
        merging = b.if_(b.ne(self.merge.value, 0, name="merging"))
        with merging.then_():
            b.barrier()
            ticket = b.atomic_fetch_add(self.counts.ptr, pid_bh, 1, name="ticket")
            last = b.if_(b.eq(ticket, b.sub(b.num_programs(0), 1), name="last"))
            with last.then_():
                merge_in_kernel(b, *self.parts, self.o_arg, self.lse_arg, batch,
                                kv_head, self.q_len_arg.value, b.num_programs(0), group=self.group,
                                heads=self.hq, v_dim=self.v_dim, out_type=self._dtype(self.spec.out))
                b.store(self.counts.ptr, pid_bh, b.constant(0, i32))

    def _kv_range(self, lo: SSAValue, hi: SSAValue, state: list[SSAValue], *, full_tile: bool) -> list[SSAValue]:
        """The KV loop over [lo, hi), with `skip_empty` skipped when empty: the prologue of
        a pipelined loop runs even without an iteration (Triton 3.6 issues its first
        stages' loads, which zero-fill their shared-memory buffers). The masked loop an
        aligned cache leaves empty cost 0.7 us of a B = 1, Skv = 8192 decode step on the
        H200, and 0.7 us at B = 16, Skv = 1024 (run 38, call E). Only the 16-row tiles
        skip: the 64-row tile of gpt-oss (8 heads of 64, a window and sinks), at 255
        registers already, spilled under the branch on sm_90."""
        b = self.b
        if not self.skip_empty:
            return self._kv_loop(lo, hi, state, full_tile=full_tile)
        branch = b.if_(b.lt(lo, hi), [v.type for v in state])
        with branch.then_():
            branch.yield_(*self._kv_loop(lo, hi, state, full_tile=full_tile))
        with branch.else_():
            branch.yield_(*state)
        return list(branch.results)

    def _split_keys(self, split: SSAValue, lo: Value, hi: Value,
                    splits: SSAValue | None) -> tuple[Value, Value]:
        """[first, last) keys of this split: its share of whole KV blocks of [lo, hi)
        (all of them for one split)."""
        b = self.b
        if splits is None:
            return lo, hi
        blocks = b.cdiv(b.maximum(b.sub(hi, lo), 0), self.block_n)
        keys = b.mul(b.cdiv(blocks, splits), self.block_n, name="split_keys")
        split_lo = b.add(lo, b.mul(split, keys), name="split_lo")
        return split_lo, b.minimum(b.add(split_lo, keys), hi, name="split_hi")

    def _store(self, split: SSAValue, batch: SSAValue, head: SSAValue, rows: SSAValue, row_ok: SSAValue,
               out: SSAValue, lse2: SSAValue, group: tuple[SSAValue, SSAValue], splits: SSAValue | None) -> None:
        """One split: `out` and `lse` (natural log); several: the workspace row `slot` =
        `(batch * Hq + head) * Sq + query` of this split (fp32 output, base-2 lse), then
        the merge if this program is the last of its `group` (pid_bh, KV head).
        `splits` None: one split, known when the kernel is built."""
        b = self.b
        assert self.q_len_arg.value is not None and self.lse_arg is not None
        d = b.arange(0, padded(self.v_dim))
        mask = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(b.lt(d, self.v_dim), 0))

        def final() -> None:
            assert self.lse_arg is not None
            o_base, o_rows = self._packed_rows(self.o_arg, batch, head, rows)
            offs = b.add(b.expand_dims(o_rows, 1), b.expand_dims(b.mul(d, self.o_arg.strides[3]), 0))
            b.store(o_base, offs, b.cast(out, self._dtype(self.spec.out)), mask=mask)
            lse_base, lse_rows = self._packed_rows(self.lse_arg, batch, head, rows)
            b.store(lse_base, lse_rows, b.mul(lse2, LN2), mask=row_ok)

        if self.parts is None:  # the persistent kernel: one split
            final()
            return
        assert splits is not None
        o_part, lse_part = self.parts
        alone = b.if_(b.eq(splits, 1, name="one_split"))
        with alone.then_():
            final()
        with alone.else_():
            slot = b.add(b.mul(b.add(b.mul(batch, self.hq), head), self.q_len_arg.value), rows, name="slot")
            offs = b.add(b.expand_dims(b.mul(slot, o_part.strides[1]), 1),
                         b.expand_dims(b.mul(d, o_part.strides[2]), 0))
            b.store(o_part.base(b, split), offs, out, mask=mask)
            b.store(lse_part.base(b, split), b.mul(slot, lse_part.strides[1]), lse2, mask=row_ok)
            self._merge_if_last(group[0], batch, group[1])

    def _packed_rows(self, arg: TensorArg, batch: SSAValue, head: SSAValue,
                     rows: SSAValue) -> tuple[SSAValue, SSAValue]:
        """(batch base, [R] i64 offsets) of the packed rows in a [B, Hq, Sq, ...] tensor."""
        b = self.b
        offs = b.add(b.mul(b.to_i64(head), b.to_i64(arg.strides[1])), b.mul(b.to_i64(rows), b.to_i64(arg.strides[2])))
        return arg.base(b, batch), offs

    def _packed_q(self, split: SSAValue, batch: SSAValue, head: SSAValue, rows: SSAValue, row_ok: SSAValue) -> None:
        """Load the packed Q rows as the parts of the layout (transformed in fp32); split
        0 stores them transformed where the spec asks (`ForwardSpec.q_saved`)."""
        b, spec = self.b, self.spec
        base, offs = self._packed_rows(self.q_arg, batch, head, rows)
        parts: dict[str, SSAValue] = {}
        for part in self.layout:
            cols, in_range = part.columns(b)
            at = b.add(b.expand_dims(offs, 1), b.expand_dims(b.mul(cols, self.q_arg.strides[3]), 0))
            mask = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(in_range, 0))
            parts[part.role] = b.load(base, at, mask=mask, other=0.0, name=f"Q_{part.role}")
        if spec.q_transforms:
            dtype = self._dtype(spec.q)
            q32 = {r: b.cast(t, f32) for r, t in parts.items()}
            q32 = self.q_side.apply(b, q32, self.layout, rows, batch, row_ok, end=self._query_end())
            parts = {r: b.cast(t, dtype, name=f"q_{r}") for r, t in q32.items()}
            if self.q_saved_arg is not None:
                saved = self.q_saved_arg
                base, offs = self._packed_rows(saved, batch, head, rows)
                assert self.save_q_arg is not None and self.save_q_arg.value is not None
                wanted = b.and_(b.eq(split, 0), b.ne(self.save_q_arg.value, 0))
                first = b.and_(row_ok, b.broadcast_to(wanted, (self.block_m,)), name="q_saved_rows")
                for part in self.layout:
                    cols, in_range = part.columns(b)
                    at = b.add(b.expand_dims(offs, 1), b.expand_dims(b.mul(cols, saved.strides[3]), 0))
                    mask = b.and_(b.expand_dims(first, 1), b.expand_dims(in_range, 0))
                    b.store(base, at, parts[part.role], mask=mask)
        self.q_parts = parts

    def _start(self, split: SSAValue, head: SSAValue) -> tuple[list[SSAValue], SSAValue | None]:
        """The initial (m, l, acc) and the base-2 sink of each row (None without sinks):
        split 0 starts from the sinks (`m = sink, l = 1`), the others from nothing."""
        b, rows = self.b, self.block_m
        acc = b.zeros((rows, padded(self.v_dim)), f32, name="acc")
        if self.sinks_arg is None:
            return [b.full((rows,), float("-inf"), f32, name="m_i"), b.zeros((rows,), f32, name="l_i"), acc], None
        assert self.sinks_arg.ptr is not None
        sink = b.cast(b.load(self.sinks_arg.ptr, b.mul(head, self.sinks_arg.strides[0])), f32, name="sink")
        first = b.eq(split, 0)
        # A finite start for a +inf sink keeps the online rescaling free of inf - inf.
        m_i = b.where(first, b.mul(b.minimum(sink, SINK_START_MAX), LOG2E), float("-inf"), name="m_i")
        l_i = b.broadcast_to(b.where(first, 1.0, 0.0), (rows,), name="l_i")
        sink2 = b.where(first, b.mul(sink, LOG2E), float("-inf"), name="sink2")
        return [m_i, l_i, acc], sink2


@dataclass
class SplitKVPath:
    """The kernels of the split-KV path and the host value saying a call takes it."""

    kernels: list[Operation]
    decoding: SSAValue
    """i1: this call's packed rows fit one tile, so the split kernel serves it."""

    def unless_decoding(self, host: HostCode, grid: SSAValue, name: str) -> SSAValue:
        """`grid` for calls that do not decode, 0 (nothing launched) for those that do."""
        return host.emit(arith.SelectOp(self.decoding, host.const(0), grid), name)


def decoding_calls(host: HostCode, q_len: SSAValue, plan: SplitKVAttr) -> tuple[SSAValue, SSAValue]:
    """(packed rows `Sq * G`, the predicate of the calls that take the split-KV path:
    their packed rows fit the plan's tile). The forward kernel's launch, and the RoPE
    tables only it reads, are skipped under it."""
    packed_rows = host.mul(q_len, plan.group.data, "packed_rows")
    return packed_rows, host.emit(arith.CmpiOp(packed_rows, host.const(plan.rows.data), "sle"), "decoding")


def lower_split_kv(host: HostCode, spec: ForwardSpec, plan: SplitKVAttr, fname: str, one: SSAValue,
                   calls: tuple[SSAValue, SSAValue]) -> SplitKVPath:
    """Emit the host code of the split-KV path and build its kernels; `calls`:
    `decoding_calls`."""
    hq, hk, _ = spec.program.heads
    online = spec.program.online
    assert online is not None and spec.lse is not None
    rows, block_n = plan.rows.data, plan.block_n.data
    packed_rows, decoding = calls
    small_rows = SMALL_ROWS if plan.group.data <= SMALL_ROWS else rows
    rows_fit: dict[int, SSAValue] = {}

    def fits(tile_rows: int) -> SSAValue:
        """Whether the call's packed rows fit a tile of `tile_rows` (one compare per size)."""
        if tile_rows not in rows_fit:
            rows_fit[tile_rows] = host.emit(arith.CmpiOp(packed_rows, host.const(tile_rows), "sle"),
                                            f"fits_{tile_rows}_rows")
        return rows_fit[tile_rows]

    wide = wide_block_n(spec.program, rows, block_n, plan.group.data)
    wide_fits = fits(small_rows) if wide is not None else None
    splits, blocks_per_split = split_count(host, spec, plan, wide_fits)
    split_grid = host.emit(arith.SelectOp(decoding, splits, host.const(0)), "split_grid")
    assert isinstance(spec.v.type, TensorType)
    v_dim = spec.v.type.get_shape()[3]
    # One workspace row per (batch, head, query), padded so that the split stride is a
    # multiple of 16 whatever the split count; none for calls that do not decode.
    slots = host.emit(arith.MuliOp(host.mul(spec.batch, hq, "slot_bh"), spec.q_len), "slots")
    slots = host.mul(host.cdiv(slots, 16, "slot_tiles"), 16, "slots_padded")
    slots = host.emit(arith.SelectOp(decoding, slots, host.const(0)), "workspace_slots")
    o_part = host.alloc(TensorType(f32, [DYNAMIC_INDEX, DYNAMIC_INDEX, padded(v_dim)]),
                        {0: split_grid, 1: slots}, "o_part")
    lse_part = host.alloc(TensorType(f32, [DYNAMIC_INDEX, DYNAMIC_INDEX]), {0: split_grid, 1: slots}, "lse_part")
    name = f"{fname}_split_kv"
    split_bh = host.mul(spec.batch, hk, "split_bh")
    # With `merge 1`, few enough splits and a workspace its i32 offsets reach, the program
    # that finishes last merges them (one counter per (batch, KV head), kept zero between
    # calls); else the combine kernel.
    several = host.emit(arith.CmpiOp(split_grid, one, "sgt"), "several_splits")
    limit = merge_rows_limit(plan.group.data, v_dim) if plan.merge.data else 0
    merging: tuple[SSAValue, SSAValue] | None = None
    if limit:
        few = host.emit(arith.CmpiOp(split_grid, host.const(limit), "sle"), "few_splits")
        small = host.emit(arith.CmpiOp(slots, host.const(merge_slots_limit(plan.group.data, v_dim)), "sle"),
                          "narrow_workspace")
        merged = host.emit(arith.AndIOp(several, host.emit(arith.AndIOp(few, small))), "merge_in_kernel")
        counts = host.alloc(TensorType(i32, [DYNAMIC_INDEX]),
                            {0: host.emit(arith.SelectOp(merged, split_bh, host.const(0)))}, "split_counts",
                            zero=True, restored=True)
        merging = counts, host.emit(arith.SelectOp(merged, one, host.const(0)), "merge")
    kernels: list[Operation] = []
    # The first tier whose condition holds takes the call, the last takes the rest.
    tiers = [_Tier(name, rows, block_n)]
    if small_rows < rows:
        tiers.insert(0, _Tier(f"{name}_small", small_rows, block_n))
    narrow = None
    if spec.paged is not None:
        tiers.insert(0, _Tier(f"{name}_short", small_rows, block_n, short=True))
        # Paged kernels address the pools with i32 offsets; calls whose pools those do
        # not reach take the full tile with i64 offsets.
        narrow = host.emit(FitsI32Op([spec.k, spec.v]), "pools_fit_i32")
        tiers.append(_Tier(f"{name}_i64", rows, block_n))
    if wide is not None:
        tiers.insert(0, _Tier(f"{name}_wide", small_rows, wide, whole_sm=True))
        if plan.persistent.data:
            tiers.insert(0, _Tier(f"{name}_persistent", small_rows, wide, persistent=True))
    waves: tuple[SSAValue, SSAValue] | None = None  # what the conditions read
    if len(tiers) > 1:
        programs = host.emit(arith.MuliOp(split_grid, split_bh), "split_programs")
        waves = programs, host.emit(arith.CmpiOp(programs, host.sm_count(), "sle"), "one_wave")
    grid = split_grid
    unmerged: list[SSAValue] = []  # grids of the kernels that do not merge
    for i, tier in enumerate(tiers):
        tier_grid, pairs = grid, split_bh
        if i < len(tiers) - 1:
            assert waves is not None
            suffix = tier.name[len(name) + 1:]
            size = grid
            if tier.persistent:  # grid [programs, 1, 1], walking the pairs of one split
                taken, size = persistent_taken(host, fits(tier.rows), split_grid, waves[0], blocks_per_split)
                pairs = one
            else:
                taken = tier_taken(host, suffix, fits(tier.rows), tier.whole_sm, tier.short, waves, blocks_per_split)
            if narrow is not None:
                taken = narrow if taken is None else host.emit(arith.AndIOp(taken, narrow), f"{suffix}_narrow")
            assert taken is not None
            suffix = suffix or "full"
            tier_grid = host.emit(arith.SelectOp(taken, size, host.const(0)), f"{suffix}_split_grid")
            rest = "full_split_grid" if i == len(tiers) - 2 and narrow is None else f"after_{suffix}_grid"
            grid = host.emit(arith.SelectOp(taken, host.const(0), grid), rest)
        # The 16-row tiers (latency-bound calls) merge their own splits and skip empty
        # loops; a taller tile keeps the registers those would need. The persistent
        # kernel runs one split, whose loops its flattened walk must see unguarded.
        latency = tier.rows == SMALL_ROWS and not tier.persistent
        if not latency and not tier.persistent:  # (the persistent kernel's calls have one split)
            unmerged.append(tier_grid)
        tier_spec = _tier_spec(spec, tier, narrow=narrow is not None and not tier.name.endswith("_i64"))
        kernel = SplitKernel(tier_spec, tier.name, plan, None if tier.persistent else (o_part, lse_part),
                             merging if latency else None, one_loop=tier.short or tier.persistent, skip_empty=latency)
        kernels.append(kernel.build())
        host.launch(tier.name, [tier_grid, pairs, one], kernel.sig.host_operands())
    combined = several
    if limit:
        beyond = host.emit(arith.CmpiOp(split_grid, host.const(limit), "sgt"), "beyond_merge_limit")
        for full_grid in unmerged:  # calls that take a tile that does not merge combine
            full = host.emit(arith.CmpiOp(full_grid, host.const(0), "sgt"), "full_tile_splits")
            beyond = host.emit(arith.OrIOp(beyond, full), "combine_needed")
        combined = host.emit(arith.AndIOp(several, beyond), "combined")
    combine_grid = host.emit(arith.SelectOp(combined, spec.q_len, host.const(0)), "combine_grid")
    combine, operands = build_combine(f"{name}_combine", o_part, lse_part, spec.out, spec.lse, spec.q_len,
                                      split_grid, hq, v_dim)
    kernels.append(combine)
    host.launch(f"{name}_combine", [combine_grid, host.mul(spec.batch, hq, "combine_bh"), one], operands)
    return SplitKVPath(kernels, decoding)


@dataclass(frozen=True)
class _Tier:
    """One split kernel: its name, tile of `rows` x `block_n`, and how it runs
    (`_tier_spec`; `persistent`: `SplitKernel`)."""

    name: str
    rows: int
    block_n: int
    whole_sm: bool = False
    short: bool = False
    persistent: bool = False


def _tier_spec(spec: ForwardSpec, tier: _Tier, *, narrow: bool) -> ForwardSpec:
    """The forward spec of the split kernel with tiles of `rows` x `block_n` (`short`:
    at the pipeline depth of a contiguous cache; `whole_sm`: its pipeline sized for the
    whole of an SM's shared memory, for calls whose programs fit one wave;
    `persistent`: one stage less than that, `PERSISTENT_PROGRAMS_PER_SM` programs
    sharing an SM, since Triton 3.6 keeps `num_stages - 1` K/V buffers). It rotates
    its few query rows with cos/sin evaluated in the kernel (a table would cost a launch
    per decode step), and reads K's tables on every call it runs. `narrow`: a paged
    program's kernel with i32 offsets into the pools."""
    online = spec.program.online
    assert online is not None
    paged = dataclasses.replace(spec.paged, narrow=True) if narrow and spec.paged is not None else spec.paged
    rows, block_n = tier.rows, tier.block_n
    stages = split_stages(spec, rows, block_n, paged_depth=not tier.short, whole_sm=tier.whole_sm or tier.persistent)
    return dataclasses.replace(
        spec, paged=paged, block_m=rows, block_n=block_n, block_map=None, rope_table_unless=None, q_cos_sin_in_kernel=True,
        # Without an exact band every mask is applied to every tile (no block map here).
        planned_masks=spec.planned_masks if online.plan.is_exact() else set(),
        num_warps=split_warps(spec, rows), num_stages=stages - 1 if tier.persistent else stages,
        launch={"role": StringAttr("split_kv")})


__all__ = ["SplitKVPath", "SplitKernel", "decoding_calls", "lower_split_kv", "split_stages", "split_warps"]
