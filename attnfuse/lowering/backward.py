"""The backward kernels of an attention program, derived from its forward structure.

* (`preprocess.py`: `delta = rowsum(dO * O) - dlse` per query row, fp32, before these);
* `DqKernel`: one program per (query block, batch x query head), walking the same KV
  tiles as the forward (its plan and block map): recompute `S` (Q/K transforms, score
  chain) and `P = exp(S - lse)`, then `dS = P (dP - delta)` with `dP = dO V^T`
  (dropout regenerated from the seed), back through the score chain, and
  `dQ += dS K`; the epilogue takes dQ back through Q's transforms. It also writes the
  bias-tensor gradient and per-program partial sums for sinks, ALiBi slopes and Q-norm
  weights;
* `DkvKernel`: one program per (KV block, batch x KV head), its K tile transformed once;
  it loops over the query heads of its GQA group and the query blocks the tile plan
  allows (or, for data-dependent masks, those its transposed block map lists, full
  ones without mask code): `dV += P^T dO`, `dK += dS^T Q`; the epilogue takes dK back
  through K's transforms. dK/dV are summed over the group inside the program.

No atomics: every gradient is written once, and vector gradients are per-program
partials reduced on the host, so results are deterministic. In a packed batch the dQ
kernel walks (sequence, q block) slots and the dK/dV kernel (sequence, KV block) slots
(`attnfuse.lowering.varlen`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from attnfuse.dialects.attn import BiasOp, MaskOp, QKNormOp, RopeOp, TilePlanAttr
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import TileBuilder, Value
from attnfuse.lowering.forward import (
    LOG2E,
    BlockMap,
    ForwardKernel,
    ForwardSpec,
    in_bounds,
    load_rows,
    walk_block_map,
)
from attnfuse.lowering.qk_side import (
    Part,
    SideContext,
    SideTransforms,
    load_parts,
    padded,
    partition,
    split_parts,
    store_parts,
)
from attnfuse.lowering.qk_side_grad import backward as side_backward
from attnfuse.lowering.qk_side_grad import forward_saving, rope_transpose
from attnfuse.lowering.score_chain import ScoreChain, TileCoords
from attnfuse.lowering.signature import KernelSignature, TensorArg


@dataclass
class GradBuffers:
    """Host buffers the backward kernels write, besides dQ/dK/dV."""

    bias: dict[int, SSAValue] = field(default_factory=dict)
    """score-op index -> [B, Hq, Sq, Skv] fp32 gradient of a bias tensor."""
    slopes: dict[int, SSAValue] = field(default_factory=dict)
    """score-op index -> [B, Hq, nQ] fp32 partial sums of a learnable ALiBi slope."""
    sinks: SSAValue | None = None
    """[B, Hq, nQ] fp32 partial sums of the sink-logit gradient."""
    q_weights: dict[int, SSAValue] = field(default_factory=dict)
    """Q transform index -> [B, Hq, nQ, D] fp32 partial sums of a norm weight gradient."""
    k_weights: dict[int, SSAValue] = field(default_factory=dict)
    """K transform index -> [B, Hkv, nKV, D] fp32 partial sums."""


@dataclass(frozen=True)
class DkvOptions:
    """How the dK/dV kernel is built (each is a `lower-backward` option)."""

    transposed: bool = False
    """Compute Sᵀ = K Qᵀ, Pᵀ and dSᵀ as [BN, BM] tiles: no computed tile is transposed."""
    full_tiles: bool = True
    """Walk q blocks inside every planned mask without mask code or bounds masks."""
    num_warps: int = 0
    """Warps per dK/dV program; 0 uses the dQ kernel's."""
    block_map: bool = True
    """Walk a transposed runtime block map when the plan has a runtime block map."""


@dataclass
class BackwardSpec:
    forward: ForwardSpec
    d_out: SSAValue
    lse: SSAValue
    delta: SSAValue
    dq: SSAValue
    dk: SSAValue
    dv: SSAValue
    grads: GradBuffers
    dkdv: DkvOptions = field(default_factory=DkvOptions)
    q_epilogue: list[RopeOp] = field(default_factory=list)
    """RoPEs of Q whose forward ran in a pre-kernel: the dQ kernel rotates dQ back by them
    before storing it, so no transpose pre-kernel and no f32 dQ buffer are needed."""
    k_epilogue: list[RopeOp] = field(default_factory=list)
    """The same for K, in the dK/dV kernel."""
    kv_block_map: BlockMap | None = None
    """The transposed runtime block map the dK/dV kernel walks (per kv block, its partial
    and full q blocks); None walks the q blocks of the plan's band."""


def _epilogue_side(ropes: list[RopeOp], fwd: ForwardSpec, sig: KernelSignature, head_dim: int,
                   prefix: str) -> SideTransforms | None:
    """The epilogue rotations of one side, reading f32 cos/sin tables (the values its
    transpose pre-kernel would use), or None."""
    if not ropes:
        return None
    table = fwd.rope_table  # a RopeTables, or None to evaluate cos/sin once per program
    return SideTransforms(list(ropes), SideContext(sig, head_dim, fwd.inv_freq, table, f32), prefix)  # type: ignore[arg-type]


def rotate_back(epilogue: SideTransforms | None, b: TileBuilder, grad: dict[str, SSAValue],
                layout: tuple[Part, ...], head_dim: int, rows: SSAValue, batch: SSAValue,
                row_ok: SSAValue) -> tuple[dict[str, SSAValue], tuple[Part, ...]]:
    """(gradient, its layout) after the epilogue's RoPE transposes: a full-width gradient
    (the main loop's dots stay full width) is first split into the rope's two halves."""
    if epilogue is None:
        return grad, layout
    rope_layout = partition(epilogue.transforms[0], head_dim)  # type: ignore[arg-type]
    if layout != rope_layout:
        grad, layout = split_parts(b, grad[layout[0].role], rope_layout), rope_layout
    return rope_transpose(epilogue, b, grad, layout, rows, batch, row_ok), layout


class _Recompute:
    """Per-tile recomputation shared by the dQ and dK/dV kernels."""

    b: TileBuilder
    chain: ScoreChain
    scale: float
    dropout_p: float
    seed_bh: SSAValue | None
    fold_scale: bool

    def probabilities(
        self, q_parts: dict[str, SSAValue], k_parts: dict[str, SSAValue], layout: tuple[Part, ...],
        at: TileCoords, lse: SSAValue, *, full_tile: bool,
    ) -> tuple[SSAValue, list[SSAValue]]:
        """(P, chain inputs) of one [BM, BN] tile; lse is [BM] (natural log)."""
        b = self.b
        s: SSAValue | None = None
        for part in layout:
            if at.transposed:  # Sᵀ = K Qᵀ: K is the register operand, no transpose of a computed tile
                s = b.dot(k_parts[part.role], b.trans(q_parts[part.role]), s, name="qk_t")
            else:
                s = b.dot(q_parts[part.role], b.trans(k_parts[part.role]), s, name="qk")
        assert s is not None
        lse_safe = at.q_vector(b, b.where(b.eq(lse, float("-inf")), 0.0, lse))
        if self.fold_scale and all(isinstance(op, (MaskOp, BiasOp)) for op in self.chain.ops):
            # Masks and biases need no saved inputs: keep the scale symbolic (`apply_scaled`),
            # P = exp2(t * k * log2e - lse * log2e), one multiply-add.
            t, k = self.chain.apply_scaled(b, s, self.scale, at, full_tile=full_tile)
            if not full_tile:
                t = b.where(at.valid, t, float("-inf"))
            p = b.exp2(b.sub(b.mul(t, k * LOG2E), b.mul(lse_safe, LOG2E)), name="p")
            return p, [s for _ in self.chain.ops]
        s = b.mul(s, self.scale, name="s")
        s, inputs = self.chain.apply_saving(b, s, at, full_tile=full_tile)
        if not full_tile:
            s = b.where(at.valid, s, float("-inf"))
        p = b.exp2(b.mul(b.sub(s, lse_safe), LOG2E), name="p")
        return p, inputs

    def keep(self, at: TileCoords) -> SSAValue:
        b = self.b
        assert self.seed_bh is not None
        counters = b.add(at.q_vector(b, b.mul(at.rows, at.kv_len)), at.kv_vector(b, at.cols))
        return b.ge(b.rand(self.seed_bh, counters), self.dropout_p, name="keep")


class DqKernel(ForwardKernel, _Recompute):
    """dQ (and bias / sink / slope / Q-norm-weight gradients): see the module docstring."""

    def __init__(self, spec: BackwardSpec, name: str) -> None:
        super().__init__(spec.forward, name)
        self.bspec = spec
        sig = self.sig
        self.do_arg = sig.tensor("dOut", spec.d_out)
        self.lse_in = sig.tensor("LSE_in", spec.lse)
        self.delta_arg = sig.tensor("Delta", spec.delta)
        self.dq_arg = sig.tensor("dQ", spec.dq)
        self.q_epilogue = _epilogue_side(spec.q_epilogue, spec.forward, sig, self.head_dim, "q_epi")
        grads = spec.grads
        self.bias_args = {n: sig.tensor(f"d_bias{n}", v) for n, v in grads.bias.items()}
        self.slope_args = {n: sig.tensor(f"d_slopes{n}", v) for n, v in grads.slopes.items()}
        self.sinks_grad = sig.tensor("d_sinks", grads.sinks) if grads.sinks is not None else None
        self.qw_args = {n: sig.tensor(f"d_q_norm_w{n}", v) for n, v in grads.q_weights.items()}
        self.dropout_p = self.online.float_option("dropout_p")

    def build(self) -> KernelOp:
        fwd = self.spec
        b = self.sig.start(self.name, num_warps=fwd.num_warps, num_stages=fwd.num_stages, launch=fwd.launch,
                           f32_dot=fwd.f32_dot)
        self.b = b
        bm = self.block_m
        pid_m, pid_bh, batch, head, kv_head, v_head, q_start, rows, row_ok = self._program_coords()
        q_len, kv_len = self.coords[3], self.coords[4]
        dtype = self._dtype(fwd.q)
        q_in = load_parts(b, self.q_arg, self.q_arg.base(b, batch, head), rows, row_ok, self.layout)
        q32 = {r: b.cast(t, f32) for r, t in q_in.items()}
        self.q_states = forward_saving(self.q_side, b, q32, self.layout, rows, batch, row_ok)
        self.q_parts = {r: b.cast(t, dtype) for r, t in self.q_states[-1].items()}
        self.k_base = self.k_arg.base(b, batch, kv_head)
        self.v_base = self.v_arg.base(b, batch, v_head)
        self.seed_bh = None
        if self.seed_arg is not None:
            assert self.seed_arg.value is not None
            self.seed_bh = b.add(self.seed_arg.value, b.mul(b.to_i64(pid_bh), 2**32), name="seed_bh")
        dv_pad = padded(self.v_dim)
        d = b.arange(0, dv_pad)
        d_mask = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(b.lt(d, self.v_dim), 0))
        do_offs = b.add(b.expand_dims(b.mul(rows, self.do_arg.strides[2]), 1),
                        b.expand_dims(b.mul(d, self.do_arg.strides[3]), 0))
        self.d_out = b.load(self.do_arg.base(b, batch, head), do_offs, mask=d_mask, other=0.0, name="d_out")
        self.lse = b.load(self.lse_in.base(b, batch, head), b.mul(rows, self.lse_in.strides[2]), mask=row_ok,
                          other=float("-inf"), name="lse")
        self.delta = b.load(self.delta_arg.base(b, batch, head), b.mul(rows, self.delta_arg.strides[2]),
                            mask=row_ok, other=0.0, name="delta")

        state = [b.zeros((bm, p.tile_width), f32, name=f"dq_{p.role}") for p in self.layout]
        state += [b.constant(0.0, f32, name=f"d_slope{n}") for n in self.slope_args]
        if fwd.block_map is not None:
            state = self._walk_block_map(state, batch, head, pid_m)
        else:
            for lo, hi, full in self._loop_ranges(q_start, q_len, kv_len):
                state = self._kv_loop(lo, hi, state, full_tile=full)
        n_parts = len(self.layout)
        dq = {p.role: b.mul(v, self.scale) for p, v in zip(self.layout, state[:n_parts])}
        slot = b.add(b.mul(pid_bh, b.num_programs(0)), pid_m, name="slot")
        for (n, arg), total in zip(self.slope_args.items(), state[n_parts:]):
            assert arg.ptr is not None
            b.store(arg.ptr, b.mul(slot, 1), total)
        if self.sinks_grad is not None and self.sinks_arg is not None:
            assert self.sinks_arg.ptr is not None and self.sinks_grad.ptr is not None
            sink = b.cast(b.load(self.sinks_arg.ptr, b.mul(head, self.sinks_arg.strides[0])), f32)
            lse_safe = b.where(b.eq(self.lse, float("-inf")), 0.0, self.lse)
            p_sink = b.exp(b.where(b.eq(sink, self.lse), 0.0, b.sub(sink, lse_safe)))  # +inf sink: 1
            contribution = b.where(row_ok, b.neg(b.mul(p_sink, self.delta)), 0.0)
            b.store(self.sinks_grad.ptr, slot, b.reduce_sum(contribution, 0))
        grad, side_grads = side_backward(self.q_side, b, dq, self.q_states, self.layout, rows, batch, row_ok)
        grad, layout = rotate_back(self.q_epilogue, b, grad, self.layout, self.head_dim, rows, batch, row_ok)
        store_parts(b, self.dq_arg, self.dq_arg.base(b, batch, head), rows, row_ok, layout, grad)
        for (n, role), column_sums in side_grads.weights.items():
            store_weight_partial(b, self.qw_args[n], slot, next(p for p in self.layout if p.role == role), column_sums)
        return b.finish()

    def _tile(self, start_n: SSAValue, state: list[SSAValue], *, full_tile: bool) -> list[SSAValue]:
        b, fwd = self.b, self.spec
        batch, head, rows, q_len, kv_len = self.coords
        cols = b.add(start_n, b.arange(0, self.block_n), name="cols")
        col_ok = b.lt(cols, kv_len, name="col_ok")
        self.count_tile()
        k_in = load_parts(b, self.k_arg, self.k_base, cols, None if full_tile else col_ok, self.layout)
        dtype = self._dtype(fwd.k)
        if fwd.k_transforms:
            k32 = self.k_side.apply(b, {r: b.cast(t, f32) for r, t in k_in.items()}, self.layout, cols, batch, col_ok)
            k_in = {r: b.cast(t, dtype) for r, t in k32.items()}
        valid = in_bounds(b, b.lt(rows, q_len), col_ok, full_tile)
        at = TileCoords(batch, head, rows, cols, q_len, kv_len, valid, kv_start=start_n)
        p, inputs = self.probabilities(self.q_parts, k_in, self.layout, at, self.lse, full_tile=full_tile)
        v = load_rows(b, self.v_arg, self.v_base, cols, col_ok, self.v_dim, full_tile)
        dp = b.dot(self.d_out, b.trans(v), name="dp")
        if self.seed_bh is not None:
            dp = b.where(self.keep(at), b.mul(dp, 1.0 / (1.0 - self.dropout_p)), 0.0)
        ds = b.mul(p, b.sub(dp, b.expand_dims(self.delta, 1)), name="ds")

        def on_bias(n: int, grad: SSAValue) -> None:
            arg = self.bias_args[n]
            offs = b.add(b.expand_dims(b.mul(rows, arg.strides[2]), 1), b.expand_dims(b.mul(cols, arg.strides[3]), 0))
            b.store(arg.base(b, batch, head), offs, grad, mask=valid)

        ds, slope_sums = self.chain.backward(b, ds, inputs, at, full_tile=full_tile, on_bias=on_bias)
        ds_low = b.cast(ds, dtype)
        n_parts = len(self.layout)
        out = [b.dot(ds_low, k_in[part.role], acc) for part, acc in zip(self.layout, state[:n_parts])]
        for n, acc in zip(self.slope_args, state[n_parts:]):
            out.append(b.add(acc, slope_sums[n]))
        return out


class DkvKernel(_Recompute):
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
        self.k_epilogue = _epilogue_side(spec.k_epilogue, fwd, sig, base.head_dim, "k_epi")
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


def store_weight_partial(b: TileBuilder, arg: TensorArg, slot: SSAValue, part: Part, column_sums: SSAValue) -> None:
    """Row `slot` of a [programs, D] partial-sum buffer, at the part's columns."""
    assert arg.ptr is not None
    cols, in_range = part.columns(b)
    row = b.ptr_add(arg.ptr, b.mul(b.to_i64(slot), b.to_i64(arg.strides[0])))
    b.store(row, b.mul(cols, arg.strides[1]), column_sums, mask=in_range)


__all__ = ["BackwardSpec", "DkvKernel", "DqKernel", "GradBuffers", "q_walk",
           "BiasOp", "QKNormOp", "RopeOp", "SideContext", "SideTransforms"]
