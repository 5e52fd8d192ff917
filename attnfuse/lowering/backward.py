"""The backward kernels of an attention program, derived from its forward structure.

* (`preprocess.py`: `delta = rowsum(dO * O) - dlse` per query row, fp32, before these);
* `DqKernel`: one program per (query block, batch x query head), walking the same KV
  tiles as the forward (its plan and block map): recompute `S` (Q/K transforms, score
  chain) and `P = exp(S - lse)`, then `dS = P (dP - delta)` with `dP = dO V^T`
  (dropout regenerated from the seed), back through the score chain, and
  `dQ += dS K`; the epilogue takes dQ back through Q's transforms. It also writes the
  bias-tensor gradient and per-program partial sums for sinks, ALiBi slopes and Q-norm
  weights;
* `DkvKernel` (`backward_dkv.py`): one program per (KV block, batch x KV head), its K tile transformed once;
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

from dataclasses import dataclass, field

from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from attnfuse.dialects.attn import BiasOp, MaskOp, QKNormOp, RopeOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.lowering.forward import (
    LOG2E,
    BlockMap,
    ForwardKernel,
    ForwardSpec,
    in_bounds,
    load_rows,
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


def epilogue_side(ropes: list[RopeOp], fwd: ForwardSpec, sig: KernelSignature, head_dim: int,
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


class Recompute:
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


class DqKernel(ForwardKernel, Recompute):
    """dQ (and bias / sink / slope / Q-norm-weight gradients): see the module docstring."""

    def __init__(self, spec: BackwardSpec, name: str) -> None:
        super().__init__(spec.forward, name)
        self.bspec = spec
        sig = self.sig
        self.do_arg = sig.tensor("dOut", spec.d_out)
        self.lse_in = sig.tensor("LSE_in", spec.lse)
        self.delta_arg = sig.tensor("Delta", spec.delta)
        self.dq_arg = sig.tensor("dQ", spec.dq)
        self.q_epilogue = epilogue_side(spec.q_epilogue, spec.forward, sig, self.head_dim, "q_epi")
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


def store_weight_partial(b: TileBuilder, arg: TensorArg, slot: SSAValue, part: Part, column_sums: SSAValue) -> None:
    """Row `slot` of a [programs, D] partial-sum buffer, at the part's columns."""
    assert arg.ptr is not None
    cols, in_range = part.columns(b)
    row = b.ptr_add(arg.ptr, b.mul(b.to_i64(slot), b.to_i64(arg.strides[0])))
    b.store(row, b.mul(cols, arg.strides[1]), column_sums, mask=in_range)


__all__ = ["BackwardSpec", "DqKernel", "GradBuffers", "Recompute", "epilogue_side", "rotate_back", "store_weight_partial",
           "BiasOp", "QKNormOp", "RopeOp", "SideContext", "SideTransforms"]
