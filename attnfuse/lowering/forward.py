"""The fused forward kernel of an attention program.

One program per (query block of `block_m` rows, batch x query head). Q is loaded (and
transformed: QK-norm, RoPE) once; the program walks the KV blocks its tile plan allows,
transforming each K tile after its load when K's transforms are fused, and keeps the
online-softmax state (running max `m`, sum `l`, fp32 accumulator) in base 2. The KV walk
has up to three loops: masked tiles before the full ones, full tiles (no mask code) and
masked tiles after them; a runtime block map instead walks lists of partial and full
tiles. In a packed batch a program is one (sequence, q block) slot instead
(`attnfuse.lowering.varlen`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from xdsl.dialects.builtin import TensorType, f32
from xdsl.ir import Attribute
from xdsl.ir import SSAValue

from attnfuse.dialects.attn import MaskOp, OnlineSoftmaxOp, QKNormOp, RopeOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import TileBuilder, Value
from attnfuse.lowering.paged import PagedKV, PageView, sequence_length
from attnfuse.lowering.qk_side import SideContext, SideTransforms, load_parts, padded, side_layout, store_parts
from attnfuse.lowering.score_chain import ScoreChain, TileCoords, len_of
from attnfuse.lowering.signature import KernelSignature, TensorArg
from attnfuse.lowering.varlen import PackedRows, SequenceView
from attnfuse.program import AttentionProgram, ProgramError

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
SINK_START_MAX = 1.0e38
"""Sinks above this start the running max here (x LOG2E stays finite in fp32)."""


@dataclass
class BlockMap:
    """Host buffers of a runtime block map (see `block_map.py`)."""

    partial_count: SSAValue
    partial_index: SSAValue
    full_count: SSAValue
    full_index: SSAValue
    per_head: bool
    rank: SSAValue | None = None
    """[slots, inner blocks] i32, with `ranks`: at each kept tile, how many kept tiles
    come before it in its row (the Hopper backward's dQ turn of that key block)."""


@dataclass
class ForwardSpec:
    """Everything the forward kernel reads and writes, as host values."""

    program: AttentionProgram
    q: SSAValue
    k: SSAValue
    v: SSAValue
    out: SSAValue
    lse: SSAValue | None
    batch: SSAValue
    q_len: SSAValue
    kv_len: SSAValue
    q_transforms: list[RopeOp | QKNormOp]
    k_transforms: list[RopeOp | QKNormOp]
    planned_masks: set[MaskOp]
    inv_freq: object
    host_table: object
    block_map: BlockMap | None = None
    tile_counter: SSAValue | None = None
    num_warps: int = 4
    num_stages: int = 3
    launch: dict[str, Attribute] = field(default_factory=dict)
    remap: dict[SSAValue, SSAValue] = field(default_factory=dict)
    """Program values -> the host values a kernel reads instead (backward functions)."""
    block_m: int | None = None
    """Overrides the tile plan's block sizes (the band is in elements, so any size works)."""
    block_n: int | None = None
    rope_table: object = None
    """Builds a rope's cos/sin table (`RopeTables`); None evaluates cos/sin in the kernel."""
    rope_table_unless: SSAValue | None = None
    """A host predicate under which this kernel is not launched (the split-KV calls of
    the forward kernel): the tables only it reads are not computed then."""
    q_cos_sin_in_kernel: bool = False
    """Evaluate Q's cos/sin in the kernel rather than read a table (split-KV kernels
    rotate a few query rows once per program: cheaper than a table kernel's launch)."""
    fold_scale: bool = True
    """Carry the scale through the score chain (`ScoreChain.apply_scaled`) and apply it
    with log2(e) after the row max, in the multiply-add before exp2."""
    alibi_vectors: bool = True
    """ALiBi distances from per-key and per-query vectors (`ScoreChain`)."""
    f32_dot: str = "ieee"
    """`precision` of the dots of f32 tiles (`tile.dot`): ieee, tf32x3 or tf32."""
    packed: PackedRows | None = None
    """A packed batch: programs walk the slots of this schedule (grid axis 0)."""
    paged: PagedKV | None = None
    """A paged KV cache: K/V tiles are gathered through its block table (`paged.py`)."""
    kv_lens: SSAValue | None = None
    """A contiguous cache with lengths: sequence `b` holds its first `kv_lens[b]` keys."""
    q_saved: tuple[SSAValue, SSAValue] | None = None
    """(buffer, i32 flag): where the kernel also stores Q as its in-kernel transforms
    leave it (in Q's dtype), for the backward (`attnfuse.saved`), when the flag
    (`host.keeps_results`) is set; None: nowhere."""

    def table_reader(self) -> Callable[..., SSAValue] | None:
        """`rope_table` as this kernel's sides read it: under `rope_table_unless`."""
        if self.rope_table is None or self.rope_table_unless is None:
            return self.rope_table  # type: ignore[return-value]
        return partial(self.rope_table, unless=self.rope_table_unless)  # type: ignore[arg-type]


def _dims(value: SSAValue) -> tuple[int, ...]:
    assert isinstance(value.type, TensorType)
    return tuple(value.type.get_shape())


class ForwardKernel:
    """Builds the forward `tile.kernel` from a `ForwardSpec`."""


    def __init__(self, spec: ForwardSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        program = spec.program
        online = program.online
        assert isinstance(online, OnlineSoftmaxOp)
        self.online = online
        self.block_m = spec.block_m or online.plan.block_m.data
        self.block_n = spec.block_n or online.plan.block_n.data
        self.hq, self.hk, self.hv = program.heads
        self.head_dim = _dims(spec.q)[3]
        self.v_dim = _dims(spec.v)[3]
        self.scale = program.scores.scale_value()
        # Carry the scale through the score chain to the multiply-add before exp2.
        self.fold_scale = spec.fold_scale and self.scale > 0

        layout_q = side_layout(spec.q_transforms, self.head_dim)
        layout_k = side_layout(spec.k_transforms, self.head_dim)
        rope_q = next((t for t in spec.q_transforms if isinstance(t, RopeOp)), None)
        rope_k = next((t for t in spec.k_transforms if isinstance(t, RopeOp)), None)
        if rope_q is not None and rope_k is not None and layout_q != layout_k:
            raise ProgramError(
                "q and k RoPE fused in one kernel must share style and rotary_dim; "
                "place one of them in a pre-kernel (rope-fusion{strategy=hybrid})",
                rope_k,
            )
        self.layout = layout_q if rope_q is not None else layout_k

        sig = KernelSignature(spec.remap)
        self.sig = sig
        self.q_arg = sig.tensor("Q", spec.q)
        self.k_arg = sig.tensor("K", spec.k)
        self.v_arg = sig.tensor("V", spec.v)
        self.o_arg = sig.tensor("Out", spec.out)
        self.lse_arg = sig.tensor("LSE", spec.lse) if spec.lse is not None else None
        self.q_saved_arg = sig.tensor("Q_saved", spec.q_saved[0]) if spec.q_saved is not None else None
        self.save_q_arg = sig.scalar("save_q", spec.q_saved[1]) if spec.q_saved is not None else None
        side = SideContext(sig, self.head_dim, spec.inv_freq, spec.table_reader())  # type: ignore[arg-type]
        q_side = dataclasses.replace(side, rope_table=None) if spec.q_cos_sin_in_kernel else side
        self.q_side = SideTransforms(spec.q_transforms, q_side, "q")
        self.k_side = SideTransforms(spec.k_transforms, side, "k")
        self.chain = ScoreChain(program.score_ops, sig, spec.host_table, spec.planned_masks,  # type: ignore[arg-type]
                                spec.alibi_vectors)
        self.sinks_arg = sig.tensor("sinks", online.sinks) if online.sinks is not None else None
        self.seed_arg = sig.scalar("seed", online.dropout_seed) if online.dropout_seed is not None else None
        self.map_args: list[TensorArg] = []
        if spec.block_map is not None:
            bm = spec.block_map
            self.map_args = [
                sig.tensor(n, v)
                for n, v in (("partial_count", bm.partial_count), ("partial_index", bm.partial_index),
                             ("full_count", bm.full_count), ("full_index", bm.full_index))
            ]
        self.counter_arg = sig.tensor("tile_counter", spec.tile_counter) if spec.tile_counter is not None else None
        self.batch_arg = sig.scalar("B", spec.batch)
        self.q_len_arg = sig.scalar("Sq", spec.q_len)
        self.kv_len_arg = sig.scalar("Skv", spec.kv_len)
        self.view = SequenceView(sig, spec.packed) if spec.packed is not None else None
        self.pages = PageView(sig, spec.paged, self.k_arg, self.v_arg) if spec.paged is not None else None
        self.lens_arg = sig.tensor("kv_lens", spec.kv_lens) if spec.kv_lens is not None else None

    # ------------------------------------------------------------------ build

    def build(self) -> KernelOp:
        spec = self.spec
        b = self.sig.start(self.name, num_warps=spec.num_warps, num_stages=spec.num_stages, launch=spec.launch,
                           f32_dot=spec.f32_dot)
        self.b = b
        bm = self.block_m
        pid_m, pid_bh, batch, head, kv_head, v_head, q_start, rows, row_ok = self._program_coords()
        q_len, kv_len = self.coords[3], self.coords[4]

        q_base = self.q_arg.base(b, batch, head)
        dtype = self._dtype(spec.q)
        self._q_parts(q_base, rows, row_ok, batch, dtype)
        self._kv_bases(batch, kv_head, v_head)
        self.seed_bh: SSAValue | None = None
        if self.seed_arg is not None:
            assert self.seed_arg.value is not None
            self.seed_bh = b.add(self.seed_arg.value, b.mul(b.to_i64(pid_bh), 2**32), name="seed_bh")

        dv_pad = padded(self.v_dim)
        if self.sinks_arg is not None:
            assert self.sinks_arg.ptr is not None
            sink = b.cast(b.load(self.sinks_arg.ptr, b.mul(head, self.sinks_arg.strides[0])), f32)
            # A finite start for a +inf sink keeps the online rescaling free of inf - inf.
            m_i = b.broadcast_to(b.mul(b.minimum(sink, SINK_START_MAX), LOG2E), (bm,))
            m_i = b.name(m_i, "m_i")
            l_i = b.full((bm,), 1.0, f32, name="l_i")
        else:
            m_i = b.full((bm,), float("-inf"), f32, name="m_i")
            l_i = b.zeros((bm,), f32, name="l_i")
        acc = b.zeros((bm, dv_pad), f32, name="acc")
        state = [m_i, l_i, acc]

        if spec.block_map is not None:
            state = self._walk_block_map(state, batch, head, pid_m)
        else:
            for lo, hi, full in self._loop_ranges(q_start, q_len, kv_len):
                state = self._kv_loop(lo, hi, state, full_tile=full)
        m_i, l_i, acc = state

        l_safe = b.where(b.eq(l_i, 0.0), 1.0, l_i)
        out = b.div(acc, b.expand_dims(l_safe, 1), name="out")
        o_base = self.o_arg.base(b, batch, head)
        d = b.arange(0, dv_pad)
        offs = b.add(b.expand_dims(b.mul(rows, self.o_arg.strides[2]), 1),
                     b.expand_dims(b.mul(d, self.o_arg.strides[3]), 0))
        mask = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(b.lt(d, self.v_dim), 0))
        b.store(o_base, offs, b.cast(out, self._dtype(spec.out)), mask=mask)
        if self.lse_arg is not None:
            lse = b.where(b.eq(l_i, 0.0), float("-inf"), b.mul(b.add(m_i, b.log2(l_safe)), LN2), name="lse")
            if self.sinks_arg is not None:
                lse = b.maximum(lse, sink)  # lse >= sink exactly; +inf for a +inf sink
            base = self.lse_arg.base(b, batch, head)
            b.store(base, b.mul(rows, self.lse_arg.strides[2]), lse, mask=row_ok)
        return b.finish()

    def _program_coords(self) -> tuple[SSAValue, ...]:
        """Program ids and the rows of this (q block, batch x head) program; sets `coords`.

        Causal-like plans number q blocks heavy-first: later q blocks visit more tiles. In
        a packed batch the slot of a schedule gives the sequence (as `batch`) and q block.
        """
        b, bm = self.b, self.block_m
        q_len, kv_len = self.q_len_arg.value, self.kv_len_arg.value
        assert q_len is not None and kv_len is not None
        pid_m = q_block = b.program_id(0, name="pid_m")
        lower, upper = self.online.plan.get_band()
        sequence: SSAValue | None = None
        if self.view is not None:
            at = self.view.enter(b, pid_m)
            sequence, q_block, q_len, kv_len = at.seq, at.block, at.q_len, at.kv_len
            assert q_len is not None and kv_len is not None
        elif upper is not None and lower is None:
            pid_m = q_block = b.sub(b.sub(b.num_programs(0), 1), pid_m, name="pid_m")
        pid_bh = b.program_id(1, name="pid_bh")
        batch = sequence if sequence is not None else b.div(pid_bh, self.hq, name="batch")
        kv_len = self._kv_length(batch, kv_len)
        head = b.rem(pid_bh, self.hq, name="head")
        kv_head = b.div(head, self.hq // self.hk, name="kv_head")
        v_head = b.div(head, self.hq // self.hv, name="v_head")
        q_start = b.mul(q_block, bm, name="q_start")
        rows = b.add(q_start, b.arange(0, bm), name="rows")
        row_ok = b.lt(rows, q_len, name="row_ok")
        self.coords = (batch, head, rows, q_len, kv_len)
        return pid_m, pid_bh, batch, head, kv_head, v_head, q_start, rows, row_ok

    def _query_end(self) -> SSAValue | None:
        """`kv_len - Sq` of the program's sequence (`coords`), where a bottom-right Q rope
        puts query 0; None without one."""
        if not self.q_side.bottom_right:
            return None
        q_len, kv_len = self.coords[3], self.coords[4]
        return self.b.sub(kv_len, q_len, name="query_end")

    def _kv_length(self, batch: SSAValue, kv_len: SSAValue) -> SSAValue:
        """The keys of sequence `batch`: `kv_len`, or its `kv_lens` entry (a paged cache,
        or a contiguous one with lengths; at most `kv_len`, the cache's capacity)."""
        if self.pages is not None:
            return self.pages.enter(self.b, batch, kv_len)
        if self.lens_arg is not None:
            return sequence_length(self.b, self.lens_arg, batch, kv_len)
        return kv_len

    def _kv_bases(self, batch: SSAValue, kv_head: SSAValue, v_head: SSAValue) -> None:
        """Where K and V tiles are read from: the (batch, head) slices, or the heads of
        the page pools."""
        b = self.b
        if self.pages is None:
            self.k_base = self.k_arg.base(b, batch, kv_head)
            self.v_base = self.v_arg.base(b, batch, v_head)
        else:
            self.k_base = self.pages.pool_base(b, self.k_arg, kv_head)
            self.v_base = self.pages.pool_base(b, self.v_arg, v_head)

    def _q_parts(self, q_base: SSAValue, rows: SSAValue, row_ok: SSAValue, batch: SSAValue, dtype: Attribute) -> None:
        """Load Q as the column parts of the layout, transforming them in fp32."""
        b = self.b
        q_parts = load_parts(b, self.q_arg, q_base, rows, row_ok, self.layout)
        if self.spec.q_transforms:
            q32 = {r: b.cast(t, f32) for r, t in q_parts.items()}
            q32 = self.q_side.apply(b, q32, self.layout, rows, batch, row_ok, end=self._query_end())
            q_parts = {r: b.cast(t, dtype, name=f"q_{r}") for r, t in q32.items()}
        if self.q_saved_arg is not None and self.save_q_arg is not None:
            assert self.save_q_arg.value is not None
            saved = self.q_saved_arg
            with b.if_(b.ne(self.save_q_arg.value, 0, name="save_q_set")).then_():
                store_parts(b, saved, saved.base(b, batch, self.coords[1]), rows, row_ok, self.layout, q_parts)
        self.q_parts = q_parts

    # ------------------------------------------------------------------ KV walk

    def _loop_ranges(self, q_start: SSAValue, q_len: SSAValue, kv_len: SSAValue) -> list[tuple[Value, Value, bool]]:
        """[(lo, hi, full)] KV ranges of this q block, from the tile plan: one masked
        range for an inexact plan; else masked / full / masked, without the first where
        the band has no lower edge (it would be empty)."""
        b, online, bn = self.b, self.online, self.block_n
        q_last = b.sub(b.minimum(b.add(q_start, self.block_m), q_len), 1, name="q_last")
        plan = online.plan
        lower, upper = plan.get_band()
        prefix = plan.get_prefix()
        diag: Value = b.sub(kv_len, q_len, name="diag") if plan.is_bottom_right() else 0
        exact = plan.is_exact()
        kv_end_tiles = b.mul(b.div(kv_len, bn), bn, name="kv_full_end")

        lo: Value = 0
        full_lo: Value = 0
        if lower is not None:
            lo = b.mul(b.div(b.maximum(b.add(b.add(q_start, diag), int(lower)), 0), bn), bn, name="kv_lo")
            first_full = b.maximum(b.add(b.add(q_last, diag), int(lower)), 0)
            full_lo = b.mul(b.div(b.add(first_full, bn - 1), bn), bn)
        hi: Value = kv_len
        full_hi: Value = kv_end_tiles
        if upper is not None:
            band_end = b.maximum(b.add(b.add(q_last, diag), int(upper) + 1), 0)
            hi = b.minimum(kv_len, band_end)
            full_end = b.maximum(b.add(b.add(q_start, diag), int(upper) + 1), 0)
            full_hi = b.mul(b.div(full_end, bn), bn)
        if prefix is not None:
            prefix_v = int(prefix) if int(prefix) >= 0 else self.prefix_value(self.coords[0])
            prefix_end = b.minimum(prefix_v, kv_len)
            hi = b.maximum(hi, prefix_end)
            full_hi = b.maximum(full_hi, b.mul(b.div(prefix_end, bn), bn))
        hi = b.name(b.add(hi, 0), "kv_hi") if isinstance(hi, int) else hi
        if lower is not None and prefix is None:
            # No key of this q block is kept when its band starts past the last key.
            first_kept = b.add(b.add(q_start, diag), int(lower))
            hi = b.where(b.ge(first_kept, kv_len), lo, hi, name="kv_hi")
        if not exact:
            return [(lo, hi, False)]
        full_hi = b.minimum(full_hi, kv_end_tiles)
        hi_tiles = b.mul(b.div(b.add(hi, bn - 1), bn), bn)
        if lower is None:
            # No lower band edge: the full tiles start at key 0 and the leading masked
            # range is [0, 0). It gets no loop, whose software-pipeline prologue would
            # run for nothing (run 35: up to 6% of a contiguous decode call, 12% paged).
            f1 = b.minimum(b.maximum(full_hi, 0), hi_tiles, name="full_hi")
            return [(0, f1, True), (f1, hi, False)]
        f0 = b.minimum(b.maximum(full_lo, lo), hi_tiles, name="full_lo")
        f1 = b.minimum(b.maximum(full_hi, f0), hi_tiles, name="full_hi")
        return [(lo, f0, False), (f0, f1, True), (f1, hi, False)]

    def prefix_value(self, batch: SSAValue) -> SSAValue:
        """The prefix length of batch element `batch` (prefix_lm with an operand)."""
        b = self.b
        mask = next(op for op in self.spec.program.score_ops if isinstance(op, MaskOp) and op.kind_name == "prefix_lm")
        arg = self.chain.tensors[(self.spec.program.score_ops.index(mask), 0)]
        assert arg.ptr is not None
        return b.load(arg.ptr, b.mul(batch, arg.strides[0]), name="prefix_len")

    def _kv_loop(self, lo: Value, hi: Value, state: list[SSAValue], *, full_tile: bool) -> list[SSAValue]:
        b = self.b
        with b.for_(lo, hi, self.block_n, inits=state, iv_name="start_n") as loop:
            loop.yield_(*self._tile(loop.iv, list(loop.carried), full_tile=full_tile))
        return list(loop.results)

    def _walk_block_map(self, state: list[SSAValue], batch: SSAValue, head: SSAValue, pid_m: SSAValue) -> list[SSAValue]:
        assert self.spec.block_map is not None
        return walk_block_map(
            self.b, self.map_args, self.spec.block_map.per_head, self.hq, batch, head, pid_m, self.block_n, state,
            lambda start_n, carried, full: self._tile(start_n, carried, full_tile=full), "kv_block", "start_n")

    def _tile(self, start_n: SSAValue, state: list[SSAValue], *, full_tile: bool) -> list[SSAValue]:
        """One KV tile of the online softmax; returns the new (m, l, acc)."""
        b, spec = self.b, self.spec
        m_i, l_i, acc = state
        batch, head, rows, q_len, kv_len = self.coords
        cols = b.add(start_n, b.arange(0, self.block_n), name="cols")
        col_ok = b.lt(cols, kv_len, name="col_ok")
        self.count_tile()

        # Full tiles lie inside [0, Skv): their loads need no bounds mask.
        load_mask = None if full_tile else col_ok
        k_base, v_base, k_rows, v_rows = self.k_base, self.v_base, None, None
        if self.pages is not None:
            k_base, k_rows, v_base, v_rows = self.pages.tile(b, (k_base, v_base), start_n, cols, load_mask)
        k_parts = load_parts(b, self.k_arg, k_base, cols, load_mask, self.layout, row_offsets=k_rows)
        dtype = self._dtype(spec.k)
        if spec.k_transforms:
            k32 = {r: b.cast(t, f32) for r, t in k_parts.items()}
            k32 = self.k_side.apply(b, k32, self.layout, cols, batch, col_ok)
            k_parts = {r: b.cast(t, dtype, name=f"k_{r}") for r, t in k32.items()}
        s: SSAValue | None = None
        for part in self.layout:
            s = b.dot(self.q_parts[part.role], b.trans(k_parts[part.role]), s, name="qk")
        assert s is not None
        valid = in_bounds(b, b.lt(rows, q_len), col_ok, full_tile)
        at = TileCoords(batch, head, rows, cols, q_len, kv_len, valid, kv_start=start_n)
        if self.fold_scale:
            # The scores are s * k: take the row max of s, then scale by k * log2(e) and
            # subtract in one multiply-add per element.
            s, k = self.chain.apply_scaled(b, s, self.scale, at, full_tile=full_tile)
        else:
            s, k = self.chain.apply(b, b.mul(s, self.scale, name="s"), at, full_tile=full_tile), 1.0
        if not full_tile:
            s = b.where(b.expand_dims(col_ok, 0), s, float("-inf"), name="s_in")

        c = k * LOG2E
        row_max = b.mul(b.reduce_max(s, 1), c)
        m_new = b.maximum(m_i, row_max, name="m_new")
        m_safe = b.where(b.eq(m_new, float("-inf")), 0.0, m_new, name="m_safe")
        p = b.exp2(b.sub(b.mul(s, c, name="s2"), b.expand_dims(m_safe, 1)), name="p")
        alpha = b.exp2(b.sub(m_i, m_safe), name="alpha")
        l_new = b.add(b.mul(l_i, alpha), b.reduce_sum(p, 1), name="l_new")
        if self.seed_bh is not None:
            drop = self.online.float_option("dropout_p")
            counters = b.add(b.expand_dims(b.mul(rows, kv_len), 1), b.expand_dims(cols, 0))
            u = b.rand(self.seed_bh, counters, name="u")
            p = b.where(b.ge(u, drop), b.mul(p, 1.0 / (1.0 - drop)), 0.0, name="p_dropped")
        v = load_rows(b, self.v_arg, v_base, cols, col_ok, self.v_dim, full_tile, v_rows)
        acc = b.mul(acc, b.expand_dims(alpha, 1))
        acc = b.dot(b.cast(p, self._dtype(spec.v)), v, acc, name="acc")
        return [m_new, l_new, acc]

    def count_tile(self) -> None:
        """Add 1 to the tile counter (`count-tiles`), if there is one."""
        if self.counter_arg is not None:
            assert self.counter_arg.ptr is not None
            self.b.atomic_add(self.counter_arg.ptr, 0, 1)

    @staticmethod
    def _dtype(value: SSAValue) -> Attribute:
        assert isinstance(value.type, TensorType)
        return value.type.element_type


def in_bounds(b: TileBuilder, row_ok: SSAValue, col_ok: SSAValue, full_tile: bool, *, transposed: bool = False) -> SSAValue:
    """The [BM, BN] (transposed: [BN, BM]) tile of in-bounds elements. A full tile's keys
    are all in bounds: its mask is the row mask alone, constant along the keys, so loads
    and stores of key-contiguous tensors (a bias) stay vectorized."""
    rows = b.expand_dims(row_ok, 0 if transposed else 1)
    if full_tile:
        n = len_of(col_ok)
        m = len_of(row_ok)
        return b.broadcast_to(rows, (n, m) if transposed else (m, n), name="valid")
    return b.and_(rows, b.expand_dims(col_ok, 1 if transposed else 0), name="valid")


def walk_block_map(b: TileBuilder, map_args: list[TensorArg], per_head: bool, heads: int, batch: SSAValue,
                   head: SSAValue, pid: SSAValue, block: int, state: list[SSAValue],
                   tile: Callable[[SSAValue, list[SSAValue], bool], list[SSAValue]], block_name: str,
                   start_name: str) -> list[SSAValue]:
    """Walk the partial, then the full blocks a runtime block map lists for program `pid`
    along grid axis 0 (`map_args`: partial count / index, full count / index; of query
    head `head` when the map is per head), calling `tile(start, carried, full)` on each.
    The forward walks KV blocks of a q block, the dK/dV kernel q blocks of a KV block."""
    map_head: Value = head if per_head else 0
    map_heads = heads if per_head else 1
    slot = b.add(b.mul(b.add(b.mul(batch, map_heads), map_head), b.num_programs(0)), pid, name="map_slot")
    for (count_arg, index_arg), full in (((map_args[0], map_args[1]), False), ((map_args[2], map_args[3]), True)):
        assert count_arg.ptr is not None and index_arg.ptr is not None
        count = b.load(count_arg.ptr, b.mul(slot, count_arg.strides[0]), name="n_tiles")
        row_base = b.ptr_add(index_arg.ptr, b.mul(b.to_i64(slot), b.to_i64(index_arg.strides[0])))
        with b.for_(0, count, 1, inits=state, iv_name="j") as loop:
            index = b.load(row_base, b.mul(loop.iv, index_arg.strides[1]), name=block_name)
            loop.yield_(*tile(b.mul(index, block, name=start_name), list(loop.carried), full))
        state = list(loop.results)
    return state


def load_rows(b: TileBuilder, arg: TensorArg, base: SSAValue, rows: SSAValue, row_ok: SSAValue,
              width: int, full_tile: bool, row_offsets: SSAValue | None = None) -> SSAValue:
    """Rows `rows` of a [.., S, width] tensor as one [R, pow2(width)] tile; a full tile of
    power-of-two width loads without a mask. `row_offsets` ([R]) replaces `rows * stride`
    (rows gathered from the pages of a paged KV cache)."""
    d = b.arange(0, padded(width))
    row_offs = b.mul(rows, arg.strides[2]) if row_offsets is None else row_offsets
    offs = b.add(b.expand_dims(row_offs, 1), b.expand_dims(b.mul(d, arg.strides[3]), 0))
    if full_tile and width == padded(width):
        return b.load(base, offs, name="v")
    mask = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(b.lt(d, width), 0))
    return b.load(base, offs, mask=mask, other=0.0, name="v")


