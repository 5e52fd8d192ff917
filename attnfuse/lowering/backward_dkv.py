"""The dK/dV kernel of an attention program's backward (see `backward.py`).

`DkvKernel`: one program per (KV block, batch x KV head), its K tile transformed once;
it loops over the query heads of its GQA group and the query blocks the tile plan
allows (`q_walk`; or, for data-dependent masks, those its transposed block map lists,
full ones without mask code): `dV += P^T dO`, `dK += dS^T Q`; the epilogue takes dK back
through K's transforms. dK/dV are summed over the group inside the program, so no
atomics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from attnfuse.dialects.attn import TilePlanAttr
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import TileBuilder, Value
from attnfuse.lowering.backward import BackwardSpec, Recompute, epilogue_side, rotate_back, store_weight_partial
from attnfuse.lowering.forward import ForwardKernel, in_bounds, load_rows, walk_block_map
from attnfuse.lowering.qk_side import load_parts, padded, store_parts
from attnfuse.lowering.qk_side_grad import backward as side_backward
from attnfuse.lowering.qk_side_grad import forward_saving
from attnfuse.lowering.score_chain import TileCoords
from attnfuse.lowering.signature import TensorArg


class DkvKernel(Recompute):
    """dK and dV for one KV block of one KV head (see the module docstring)."""

    q_len: SSAValue
    kv_len: SSAValue
    """Query and key counts of the program's (batch element or packed) sequence."""

    def __init__(self, spec: BackwardSpec, name: str) -> None:
        # Same layout decisions, arguments and chain as the forward; the q-block walk
        # reads the transposed map, not the forward's.
        fwd = replace(spec.forward, block_map=None)
        self.bspec, self.spec, self.name = spec, fwd, name
        base = ForwardKernel(fwd, name)
        self.base = base
        self.layout, self.chain, self.scale = base.layout, base.chain, base.scale
        self.fold_scale = base.fold_scale
        self.online = base.online
        self.dropout_p = self.online.float_option("dropout_p")
        sig = base.sig
        self.map_args: list[TensorArg] = []
        if spec.kv_block_map is not None:
            m = spec.kv_block_map
            self.map_args = [sig.tensor(n, v) for n, v in (
                ("t_partial_count", m.partial_count), ("t_partial_index", m.partial_index),
                ("t_full_count", m.full_count), ("t_full_index", m.full_index))]
        self.do_arg = sig.tensor("dOut", spec.d_out)
        self.lse_in = sig.tensor("LSE_in", spec.lse)
        self.delta_arg = sig.tensor("Delta", spec.delta)
        self.dk_arg = sig.tensor("dK", spec.dk)
        self.dv_arg = sig.tensor("dV", spec.dv)
        self.kw_args = {n: sig.tensor(f"d_k_norm_w{n}", v) for n, v in spec.grads.k_weights.items()}
        self.k_epilogue = epilogue_side(spec.k_epilogue, fwd, sig, base.head_dim, "k_epi")
        self.options = spec.dkdv
        # Split the q walk into masked and full blocks (planned masks only, as the forward).
        self.full_tiles = spec.dkdv.full_tiles and self.online.plan.is_exact() and spec.kv_block_map is None

    def build(self) -> KernelOp:
        fwd, base = self.spec, self.base
        warps = self.options.num_warps or fwd.num_warps
        b = base.sig.start(self.name, num_warps=warps, num_stages=fwd.num_stages, launch=fwd.launch,
                           f32_dot=fwd.f32_dot)
        self.b = base.b = b
        bm, bn = base.block_m, base.block_n
        q_len, kv_len = base.q_len_arg.value, base.kv_len_arg.value
        pid_n, pid_bh = b.program_id(0, name="pid_n"), b.program_id(1, name="pid_bh")
        batch, kv_head = b.div(pid_bh, base.hk, name="batch"), b.rem(pid_bh, base.hk, name="kv_head")
        kv_block = pid_n
        if base.view is not None:  # a packed batch: (sequence, KV block) from the schedule
            at = base.view.enter(b, pid_n)
            batch, kv_block, q_len, kv_len = at.seq, at.block, at.q_len, at.kv_len
        assert q_len is not None and kv_len is not None
        self.q_len, self.kv_len = q_len, kv_len
        n_start = b.mul(kv_block, bn, name="n_start")
        self.n_start = n_start
        cols = b.add(n_start, b.arange(0, bn), name="cols")
        col_ok = b.lt(cols, kv_len, name="col_ok")
        dtype = base._dtype(fwd.k)
        k_in = load_parts(b, base.k_arg, base.k_arg.base(b, batch, kv_head), cols, col_ok, self.layout)
        k_states = forward_saving(base.k_side, b, {r: b.cast(t, f32) for r, t in k_in.items()},
                                  self.layout, cols, batch, col_ok)
        k_parts = {r: b.cast(t, dtype) for r, t in k_states[-1].items()}
        v = load_rows(b, base.v_arg, base.v_arg.base(b, batch, kv_head), cols, col_ok, base.v_dim, False)
        group = base.hq // base.hk
        dv_pad = padded(base.v_dim)
        state = [b.zeros((bn, p.tile_width), f32, name=f"dk_{p.role}") for p in self.layout]
        state.append(b.zeros((bn, dv_pad), f32, name="dv"))
        self.batch = batch
        ranges = self._q_ranges(n_start, q_len, kv_len) if not self.map_args else []
        with b.for_(0, group, 1, inits=state, iv_name="g") as heads:
            head = b.add(b.mul(kv_head, group), heads.iv, name="head")
            self.seed_bh = None
            if base.seed_arg is not None:
                assert base.seed_arg.value is not None
                bh = b.add(b.mul(batch, base.hq), head)
                self.seed_bh = b.add(base.seed_arg.value, b.mul(b.to_i64(bh), 2**32), name="seed_bh")
            carried = list(heads.carried)

            def tile(start_m: SSAValue, state: list[SSAValue], full: bool, head: SSAValue = head) -> list[SSAValue]:
                return self._tile(start_m, state, batch, head, cols, col_ok, k_parts, v, full)

            if self.map_args:
                carried = self._walk_map(carried, batch, head, pid_n, tile)
            for lo, hi, full in ranges:
                with b.for_(lo, hi, bm, inits=carried, iv_name="start_m") as loop:
                    loop.yield_(*tile(loop.iv, list(loop.carried), full))
                carried = list(loop.results)
            heads.yield_(*carried)
        *dk_acc, dv = heads.results
        dk = {p.role: b.mul(acc, self.scale) for p, acc in zip(self.layout, dk_acc)}
        grad, side_grads = side_backward(base.k_side, b, dk, k_states, self.layout, cols, batch, col_ok)
        grad, layout = rotate_back(self.k_epilogue, b, grad, self.layout, base.head_dim, cols, batch, col_ok)
        store_parts(b, self.dk_arg, self.dk_arg.base(b, batch, kv_head), cols, col_ok, layout, grad)
        d = b.arange(0, dv_pad)
        offs = b.add(b.expand_dims(b.mul(cols, self.dv_arg.strides[2]), 1), b.expand_dims(b.mul(d, self.dv_arg.strides[3]), 0))
        mask = b.and_(b.expand_dims(col_ok, 1), b.expand_dims(b.lt(d, base.v_dim), 0))
        b.store(self.dv_arg.base(b, batch, kv_head), offs, b.cast(dv, base._dtype(fwd.v)), mask=mask)
        slot = b.add(b.mul(pid_bh, b.num_programs(0)), pid_n, name="slot")
        for (n, role), column_sums in side_grads.weights.items():
            store_weight_partial(b, self.kw_args[n], slot, next(p for p in self.layout if p.role == role), column_sums)
        return b.finish()

    def _walk_map(self, state: list[SSAValue], batch: SSAValue, head: SSAValue, pid_n: SSAValue,
                  tile: Callable[[SSAValue, list[SSAValue], bool], list[SSAValue]]) -> list[SSAValue]:
        """The partial, then the full q blocks the transposed block map lists for this kv
        block (of query head `head` when the map is per head)."""
        assert self.bspec.kv_block_map is not None
        return walk_block_map(self.b, self.map_args, self.bspec.kv_block_map.per_head, self.base.hq, batch, head,
                              pid_n, self.base.block_m, state, tile, "q_block", "start_m")

    def _q_ranges(self, n_start: SSAValue, q_len: SSAValue, kv_len: SSAValue) -> list[tuple[Value, Value, bool]]:
        """[(lo, hi, full)]: the q blocks whose band reaches this kv block, split where the
        tile plan is exact into masked blocks, blocks inside every planned mask (no mask
        code) and masked blocks again."""
        plan, base = self.online.plan, self.base
        prefix = plan.get_prefix()
        prefix_v: Value | None = None
        if prefix is not None:
            prefix_v = base.prefix_value(self.batch) if int(prefix) < 0 else int(prefix)
        lo, f0, f1, hi = q_walk(self.b, plan, n_start, q_len, kv_len, base.block_m, base.block_n,
                                split=self.full_tiles and prefix is None, prefix=prefix_v)
        if f0 is None:
            return [(lo, hi, False)]
        return [(lo, f0, False), (f0, f1, True), (f1, hi, False)]

    def _tile(self, start_m: SSAValue, state: list[SSAValue], batch: SSAValue, head: SSAValue,
              cols: SSAValue, col_ok: SSAValue, k_parts: dict[str, SSAValue], v: SSAValue,
              full_tile: bool) -> list[SSAValue]:
        """One q block against this program's keys. Transposed, Sᵀ, Pᵀ and
        dSᵀ are [BN, BM] tiles, so K, V, Pᵀ and dSᵀ are register operands of the dots and
        no computed tile is transposed; otherwise S, P and dS are [BM, BN] and P and dS
        are transposed for the dK and dV products."""
        b, base, fwd = self.b, self.base, self.spec
        t = self.options.transposed
        q_len, kv_len = self.q_len, self.kv_len
        rows = b.add(start_m, b.arange(0, base.block_m), name="rows")
        row_ok = b.lt(rows, q_len, name="row_ok")
        base.count_tile()
        dtype = base._dtype(fwd.q)
        q_in = load_parts(b, base.q_arg, base.q_arg.base(b, batch, head), rows, None if full_tile else row_ok,
                          self.layout)
        if fwd.q_transforms:
            q32 = base.q_side.apply(b, {r: b.cast(t, f32) for r, t in q_in.items()}, self.layout, rows, batch, row_ok)
            q_in = {r: b.cast(t, dtype) for r, t in q32.items()}
        else:
            q_in = {r: b.cast(t, dtype) for r, t in q_in.items()}
        valid = in_bounds(b, row_ok, col_ok, full_tile, transposed=t)
        at = TileCoords(batch, head, rows, cols, q_len, kv_len, valid, transposed=t, kv_start=self.n_start)
        lse_base, delta_base = self.lse_in.base(b, batch, head), self.delta_arg.base(b, batch, head)
        lse_offs, delta_offs = b.mul(rows, self.lse_in.strides[2]), b.mul(rows, self.delta_arg.strides[2])
        if full_tile:
            lse, delta = b.load(lse_base, lse_offs), b.load(delta_base, delta_offs)
        else:
            lse = b.load(lse_base, lse_offs, mask=row_ok, other=float("-inf"))
            delta = b.load(delta_base, delta_offs, mask=row_ok, other=0.0)
        p, inputs = self.probabilities(q_in, k_parts, self.layout, at, lse, full_tile=full_tile)
        d_out = load_rows(b, self.do_arg, self.do_arg.base(b, batch, head), rows, row_ok, base.v_dim, full_tile)
        dp = b.dot(v, b.trans(d_out), name="dp_t") if t else b.dot(d_out, b.trans(v), name="dp")
        p_used = p
        if self.seed_bh is not None:
            keep = self.keep(at)
            rescale = 1.0 / (1.0 - self.dropout_p)
            p_used = b.where(keep, b.mul(p, rescale), 0.0)
            dp = b.where(keep, b.mul(dp, rescale), 0.0)
        ds = b.mul(p, b.sub(dp, at.q_vector(b, delta)), name="ds")
        ds, _ = self.chain.backward(b, ds, inputs, at, full_tile=full_tile, on_bias=lambda n, g: None)
        ds_low = b.cast(ds, dtype)
        p_low = b.cast(p_used, base._dtype(fwd.v))
        if not t:
            ds_low, p_low = b.trans(ds_low), b.trans(p_low)
        n_parts = len(self.layout)
        out = [b.dot(ds_low, q_in[part.role], acc) for part, acc in zip(self.layout, state[:n_parts])]
        out.append(b.dot(p_low, d_out, state[n_parts]))
        return out


def q_walk(b: TileBuilder, plan: TilePlanAttr, n_start: SSAValue, q_len: SSAValue, kv_len: SSAValue, bm: int,
           bn: int, *, split: bool, prefix: Value | None = None) -> tuple[Value, Value | None, Value | None, Value]:
    """(lo, full_lo, full_hi, hi): the query rows whose band can reach keys [n_start,
    n_start + bn) (the tile plan inverted, `lo` a multiple of `bm`), and with `split` the
    rows [full_lo, full_hi) (multiples of `bm` inside it) whose blocks see every key of
    the block inside every planned mask; None for both without `split`. `prefix` is
    the prefix-LM length when the plan has one (keys below it are visible to every query)."""
    (lower, upper) = plan.get_band()
    diag: Value = b.sub(kv_len, q_len) if plan.is_bottom_right() else 0
    lo: Value = 0
    hi: Value = q_len
    if upper is not None:  # kv - q - diag <= upper  =>  q >= kv - diag - upper
        first = b.maximum(b.sub(b.sub(n_start, diag), int(upper)), 0)
        lo = b.mul(b.div(first, bm), bm, name="q_lo")
    if lower is not None:  # kv - q - diag >= lower  =>  q <= kv - diag - lower
        last = b.sub(b.sub(b.add(n_start, bn - 1), diag), int(lower))
        hi = b.minimum(q_len, b.maximum(b.add(last, 1), 0), name="q_hi")
    if upper is not None and prefix is None:
        # No query of the block is kept when the band ends before the first query.
        hi = b.where(b.ge(b.sub(b.sub(n_start, diag), int(upper)), q_len), lo, hi)
    if prefix is not None and upper is not None:
        lo = b.where(b.lt(n_start, prefix), 0, lo)
    if not split:
        return lo, None, None, hi
    full_lo: Value = lo
    if upper is not None:  # every key of the block kept from above: q >= n_start + bn - 1 - diag - upper
        first = b.maximum(b.sub(b.sub(b.add(n_start, bn - 1), diag), int(upper)), 0)
        full_lo = b.mul(b.div(b.add(first, bm - 1), bm), bm)
    full_hi: Value = b.mul(b.div(q_len, bm), bm)
    if lower is not None:  # and from below: q <= n_start - diag - lower
        last = b.sub(b.sub(n_start, diag), int(lower))
        full_hi = b.minimum(full_hi, b.mul(b.div(b.maximum(b.add(last, 1), 0), bm), bm))
    # Keys past the end make the whole block partial.
    keys_in = b.le(b.add(n_start, bn), kv_len)
    f0 = b.minimum(b.maximum(full_lo, lo), hi, name="q_full_lo")
    f1 = b.where(keys_in, b.minimum(b.maximum(full_hi, f0), hi), f0, name="q_full_hi")
    return lo, f0, f1, hi


__all__ = ["DkvKernel", "q_walk"]
