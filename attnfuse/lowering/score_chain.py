"""Lower the score ops between `attn.scores` and the softmax onto an S tile.

Every op is elementwise on the [BM, BN] fp32 tile of logits: bias (ALiBi slopes or a
broadcast bias tensor), softcap, masks (as `where(keep, s, -inf)`) and score_mod regions.
Masks that the tile plan covers are left out of tiles known to be full.

`apply_scaled` runs the chain on scores held as `t * k` with a positive compile-time
factor `k` (the scale, then whatever the ops leave), so that the kernels multiply by
`k * log2(e)` once, in the multiply-add before `exp2`: masks commute with `k`, a bias adds
`bias / k` (ALiBi folds `1 / k` into its slope), a softcap takes `k / cap` into its one
multiply and leaves `k = cap`; only a score_mod region needs the scores themselves.
ALiBi's `slope * (kv - q)` comes from a per-key and a per-query vector (`alibi_vectors`),
one subtraction per element instead of an integer subtraction, a conversion and a
multiply.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.dialects.builtin import TensorType, f32
from xdsl.ir import Operation, SSAValue

from attnfuse.dialects.attn import BiasOp, MaskOp, ScoreModOp, SoftcapOp
from attnfuse.dialects.tile_builder import TileBuilder, Value
from attnfuse.lowering.region_grad import region_backward
from attnfuse.lowering.regions import lower_region
from attnfuse.lowering.signature import KernelSignature, ScalarArg, TensorArg


@dataclass
class TileCoords:
    """Where an S tile sits: batch/head scalars, row and column index tiles."""

    batch: SSAValue
    head: SSAValue
    """A scalar, or a [BM, 1] tile when the rows of the tile belong to different heads
    (the split-KV kernel packs the heads of a GQA group into one tile)."""
    rows: SSAValue  # [BM] i32
    cols: SSAValue  # [BN] i32
    q_len: SSAValue
    kv_len: SSAValue
    valid: SSAValue  # [BM, BN] i1: in bounds ([BN, BM] when transposed)
    transposed: bool = False
    """The tile is [BN, BM]: keys along dim 0 (the dK/dV kernel's Sᵀ = K Qᵀ)."""
    kv_start: SSAValue | None = None
    """The first key of the tile (`cols[0]`): the origin of ALiBi's distance vectors."""

    def diag(self, b: TileBuilder, align: str) -> Value:
        return b.sub(self.kv_len, self.q_len) if align == "bottom_right" else 0

    def q_vector(self, b: TileBuilder, x: SSAValue) -> SSAValue:
        """A per-query [BM] vector as a 2-D tile that broadcasts along the keys."""
        return b.expand_dims(x, 0 if self.transposed else 1)

    def kv_vector(self, b: TileBuilder, x: SSAValue) -> SSAValue:
        """A per-key [BN] vector as a 2-D tile that broadcasts along the queries."""
        return b.expand_dims(x, 1 if self.transposed else 0)

    def shape(self) -> tuple[int, int]:
        m, n = len_of(self.rows), len_of(self.cols)
        return (n, m) if self.transposed else (m, n)


def alibi_slopes(heads: int, max_bias: float) -> list[float]:
    """Standard ALiBi slopes (Press et al.), generalised to any max_bias and head count."""
    def power_of_two(n: int) -> list[float]:
        base = 2.0 ** (-max_bias / n)
        return [base ** (i + 1) for i in range(n)]

    closest = 2 ** int(math.floor(math.log2(heads)))
    slopes = power_of_two(closest)
    if closest != heads:
        slopes += power_of_two(2 * closest)[0::2][: heads - closest]
    return slopes


class ScoreChain:
    """Declares what the score ops read, then applies them to S tiles."""

    def __init__(
        self,
        ops: list[Operation],
        sig: KernelSignature,
        host_table: Callable[[list[float]], SSAValue],
        planned: set[MaskOp],
        alibi_vectors: bool = True,
    ) -> None:
        self.ops = ops
        self.planned = planned
        self.alibi_vectors = alibi_vectors
        self.tensors: dict[tuple[int, int], TensorArg] = {}
        self.captures: dict[int, list[TensorArg | ScalarArg]] = {}
        for n, op in enumerate(ops):
            if isinstance(op, BiasOp):
                if op.kind_name == "tensor":
                    self.tensors[(n, 0)] = sig.tensor(f"bias{n}", op.bias[0])
                else:
                    heads = op.scores_type().dims[1]
                    host = op.slopes if op.slopes is not None else host_table(
                        alibi_slopes(heads, op.float_option("max_bias"))
                    )
                    self.tensors[(n, 0)] = sig.tensor(f"alibi_slopes{n}", host)
            elif isinstance(op, MaskOp) and op.kind_name in ("document", "prefix_lm"):
                for i, arg in enumerate(op.args):
                    self.tensors[(n, i)] = sig.tensor(f"mask{n}_arg{i}", arg)
            elif isinstance(op, (MaskOp, ScoreModOp)):
                values = op.args if isinstance(op, MaskOp) else op.captures
                caps: list[TensorArg | ScalarArg] = []
                for i, v in enumerate(values):
                    if hasattr(v.type, "get_shape"):
                        caps.append(sig.tensor(f"capture{n}_{i}", v))
                    else:
                        caps.append(sig.scalar(f"capture{n}_{i}", v))
                self.captures[n] = caps

    def apply_saving(
        self, b: TileBuilder, s: SSAValue, at: TileCoords, *, full_tile: bool
    ) -> tuple[SSAValue, list[SSAValue]]:
        """`apply`, also returning each op's input tile (for `backward`)."""
        inputs: list[SSAValue] = []
        for n, op in enumerate(self.ops):
            inputs.append(s)
            s = self._apply_one(b, n, op, s, at, full_tile)
        return s, inputs

    def apply(self, b: TileBuilder, s: SSAValue, at: TileCoords, *, full_tile: bool) -> SSAValue:
        """Run the chain on `s`; in a full tile, planned masks are skipped."""
        for n, op in enumerate(self.ops):
            s = self._apply_one(b, n, op, s, at, full_tile)
        return s

    def apply_scaled(
        self, b: TileBuilder, t: SSAValue, k: float, at: TileCoords, *, full_tile: bool
    ) -> tuple[SSAValue, float]:
        """The chain on scores `t * k` (`k > 0`), as `(t', k')` with output `t' * k'`
        (see the module docstring); in a full tile, planned masks are skipped."""
        assert k > 0
        for n, op in enumerate(self.ops):
            if isinstance(op, MaskOp):
                t = self._apply_one(b, n, op, t, at, full_tile)  # -inf * k = -inf
            elif isinstance(op, BiasOp):
                t = b.add(t, self._bias(b, n, op, at, 1.0 / k), name="s_biased")
            elif isinstance(op, SoftcapOp):
                cap = op.float_option("cap")
                t, k = b.tanh(b.mul(t, k / cap), name="s_tanh"), cap
            else:
                t = self._apply_one(b, n, op, t if k == 1.0 else b.mul(t, k, name="s"), at, full_tile)
                k = 1.0
        return t, k

    def scaled_factor(self, k: float) -> float:
        """The factor `apply_scaled` leaves on the chain's output for scores `t * k`."""
        for op in self.ops:
            if isinstance(op, SoftcapOp):
                k = op.float_option("cap")
            elif not isinstance(op, (MaskOp, BiasOp)):
                k = 1.0
        return k

    def _apply_one(
        self, b: TileBuilder, n: int, op: Operation, s: SSAValue, at: TileCoords, full_tile: bool
    ) -> SSAValue:
        if isinstance(op, MaskOp):
            if full_tile and op in self.planned:
                return s
            return b.where(self.keep(b, n, op, at), s, float("-inf"), name="s_masked")
        if isinstance(op, SoftcapOp):
            cap = op.float_option("cap")
            return b.mul(b.tanh(b.mul(s, 1.0 / cap)), cap, name="s_capped")
        if isinstance(op, BiasOp):
            return b.add(s, self._bias(b, n, op, at), name="s_biased")
        assert isinstance(op, ScoreModOp)
        args = [s, at.batch, at.head, at.q_vector(b, at.rows), at.kv_vector(b, at.cols)]
        return b.cast(lower_region(b, op.body.block, args, self.captures[n], at.valid), f32)

    def backward(
        self, b: TileBuilder, ds: SSAValue, inputs: list[SSAValue], at: TileCoords, *,
        full_tile: bool, on_bias: Callable[[int, SSAValue], None],
    ) -> tuple[SSAValue, dict[int, SSAValue]]:
        """Gradient with respect to the chain's input, given `ds` for its output.

        `on_bias(n, grad)` receives the gradient tile of a bias tensor; the returned dict
        holds per-tile sums for learnable ALiBi slopes (op index -> scalar).
        """
        slope_sums: dict[int, SSAValue] = {}
        for n in reversed(range(len(self.ops))):
            op, x = self.ops[n], inputs[n]
            if isinstance(op, MaskOp):
                if not (full_tile and op in self.planned):
                    ds = b.where(self.keep(b, n, op, at), ds, 0.0)
            elif isinstance(op, SoftcapOp):
                t = b.tanh(b.mul(x, 1.0 / op.float_option("cap")))
                ds = b.mul(ds, b.sub(1.0, b.mul(t, t)), name="ds_softcap")
            elif isinstance(op, BiasOp):
                if op.kind_name == "tensor":
                    on_bias(n, ds)
                elif op.slopes is not None:
                    distance = b.cast(b.sub(at.kv_vector(b, at.cols), at.q_vector(b, at.rows)), f32)
                    contribution = b.where(at.valid, b.mul(ds, distance), 0.0)
                    slope_sums[n] = b.reduce_sum(b.reduce_sum(contribution, 1), 0)
            else:
                assert isinstance(op, ScoreModOp)
                args = [x, at.batch, at.head, at.q_vector(b, at.rows), at.kv_vector(b, at.cols)]
                ds = region_backward(b, op.body.block, args, self.captures[n], at.valid, ds)
                # Padding elements (out of bounds) may give inf/NaN derivatives: drop them.
                ds = b.where(at.valid, ds, 0.0)
        return ds, slope_sums

    def _bias(self, b: TileBuilder, n: int, op: BiasOp, at: TileCoords, factor: float = 1.0) -> SSAValue:
        """The bias tile times `factor`."""
        arg = self.tensors[(n, 0)]
        assert arg.ptr is not None
        if op.kind_name == "alibi":
            slope = b.cast(b.load(arg.ptr, b.mul(at.head, arg.strides[0])), f32, name="slope")
            if factor != 1.0:
                slope = b.mul(slope, factor, name="slope")
            # (a per-row head, as split-KV's packed GQA rows have, gives a [BM, 1] slope)
            if self.alibi_vectors and at.kv_start is not None and not isinstance(at.head.type, TensorType):
                # slope * (kv - q) = slope * (kv - o) - slope * (q - o), o the tile's first
                # key: both vectors are exact integers times the slope, small near the band.
                kv = b.mul(b.cast(b.sub(at.cols, at.kv_start), f32), slope, name="alibi_kv")
                q = b.mul(b.cast(b.sub(at.rows, at.kv_start), f32), slope, name="alibi_q")
                return b.sub(at.kv_vector(b, kv), at.q_vector(b, q), name="alibi")
            distance = b.sub(at.kv_vector(b, at.cols), at.q_vector(b, at.rows))
            return b.mul(b.cast(distance, f32), slope)
        offs = b.add(
            at.q_vector(b, b.mul(at.rows, arg.strides[2])),
            at.kv_vector(b, b.mul(at.cols, arg.strides[3])),
        )
        if isinstance(at.head.type, TensorType):  # one head per row: [BM, 1]
            base = arg.base(b, at.batch)
            offs = b.add(offs, b.mul(b.to_i64(at.head), b.to_i64(arg.strides[1])))
        else:
            base = arg.base(b, at.batch, at.head)
        bias = b.cast(b.load(base, offs, mask=at.valid, other=0.0), f32, name="bias")
        return bias if factor == 1.0 else b.mul(bias, factor, name="bias")

    def keep(self, b: TileBuilder, n: int, op: MaskOp, at: TileCoords) -> SSAValue:
        """The i1 [BM, BN] tile of elements a mask keeps."""
        q = at.q_vector(b, at.rows)
        kv = at.kv_vector(b, at.cols)
        kind = op.kind_name
        if kind in ("causal", "sliding_window"):
            shifted = b.add(q, at.diag(b, op.str_option("align")))
            conds: list[SSAValue] = []
            if kind == "causal":
                conds.append(b.le(kv, shifted))
            else:
                if op.option("left") is not None:
                    conds.append(b.ge(kv, b.sub(shifted, op.int_option("left"))))
                if op.option("right") is not None:
                    conds.append(b.le(kv, b.add(shifted, op.int_option("right"))))
            keep = conds[0]
            for c in conds[1:]:
                keep = b.and_(keep, c)
            return b.name(keep, "keep")
        if kind == "document":
            q_ids = self.tensors[(n, 0)]
            kv_ids = self.tensors.get((n, 1), q_ids)
            row_ok = b.lt(at.rows, at.q_len)
            col_ok = b.lt(at.cols, at.kv_len)
            qi = b.load(q_ids.base(b, at.batch), b.mul(at.rows, q_ids.strides[1]), mask=row_ok, other=-1)
            ki = b.load(kv_ids.base(b, at.batch), b.mul(at.cols, kv_ids.strides[1]), mask=col_ok, other=-2)
            return b.eq(at.q_vector(b, qi), at.kv_vector(b, ki), name="same_doc")
        if kind == "prefix_lm":
            if op.args:
                arg = self.tensors[(n, 0)]
                assert arg.ptr is not None
                prefix: Value = b.load(arg.ptr, b.mul(at.batch, arg.strides[0]), name="prefix")
            else:
                prefix = op.int_option("prefix")
            return b.or_(b.le(kv, q), b.lt(kv, prefix), name="keep")
        args = [at.batch, at.head, q, kv]
        keep = lower_region(b, op.predicate.block, args, self.captures[n], at.valid)
        return b.broadcast_to(keep, at.shape())


def len_of(tile: SSAValue) -> int:
    shape = tile.type.get_shape()  # type: ignore[attr-defined]
    return int(shape[0])
