"""The transpose of Q/K transforms, for the backward kernels.

Given the gradient with respect to transformed rows (in the parts layout), walk the
transforms backwards:

* RoPE is a rotation, so its transpose rotates back: `da = da' cos + db' sin`,
  `db = db' cos - da' sin` (the yarn factor is inside cos and sin);
* QK-norm `y = x r w` with `r = rsqrt(mean(x^2) + eps)` gives
  `dx = r (w dy) - x r^3 / D * sum(x w dy)` and, per column, `dw = sum_rows(dy x r)`.

The forward values are recomputed from the input rows (never stored).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.ir import SSAValue

from attnfuse.dialects.attn import QKNormOp, RopeOp
from attnfuse.dialects.tile_builder import TileBuilder, Value
from attnfuse.lowering.qk_side import Part, SideTransforms, tile_width

Parts = dict[str, SSAValue]


@dataclass
class SideGrads:
    """Per-column weight-gradient sums of one program: (transform index, part role) -> [W]."""

    weights: dict[tuple[int, str], SSAValue] = field(default_factory=dict)


def forward_saving(
    side: SideTransforms, b: TileBuilder, parts: Parts, layout: tuple[Part, ...],
    rows: SSAValue, batch: Value, row_mask: SSAValue,
) -> list[Parts]:
    """[input, after transform 0, after transform 1, ...] (fp32 parts)."""
    states = [parts]
    for n, op in enumerate(side.transforms):
        if isinstance(op, QKNormOp):
            parts = side._qk_norm(b, n, op, parts, layout)  # noqa: SLF001
        else:
            parts = side._rope(b, n, op, parts, rows, batch, row_mask)  # noqa: SLF001
        states.append(parts)
    return states


def backward(
    side: SideTransforms, b: TileBuilder, grad: Parts, states: list[Parts], layout: tuple[Part, ...],
    rows: SSAValue, batch: Value, row_mask: SSAValue,
) -> tuple[Parts, SideGrads]:
    """Gradient with respect to the untransformed rows, and the weight gradients."""
    grads = SideGrads()
    for n in reversed(range(len(side.transforms))):
        op = side.transforms[n]
        x = states[n]
        if isinstance(op, RopeOp):
            cos, sin = side.cos_sin(b, n, op, tile_width(x["a"]), rows, batch, row_mask)
            da, db = grad["a"], grad["b"]
            grad = dict(grad)
            grad["a"] = b.add(b.mul(da, cos), b.mul(db, sin), name="d_a")
            grad["b"] = b.sub(b.mul(db, cos), b.mul(da, sin), name="d_b")
            continue
        assert isinstance(op, QKNormOp)
        head_dim = float(side.ctx.head_dim)
        total: SSAValue | None = None
        for t in x.values():
            sq = b.reduce_sum(b.mul(t, t), 1)
            total = sq if total is None else b.add(total, sq)
        assert total is not None
        r = b.expand_dims(b.rsqrt(b.add(b.div(total, head_dim), op.float_option("eps"))), 1)
        scaled_grad: Parts = {}
        dot: SSAValue | None = None
        for part in layout:
            w = side.norm_weight(b, n, op, part)
            g = grad[part.role] if w is None else b.mul(grad[part.role], w)
            scaled_grad[part.role] = g
            term = b.reduce_sum(b.mul(x[part.role], g), 1)
            dot = term if dot is None else b.add(dot, term)
            if w is not None:
                contribution = b.reduce_sum(b.mul(b.mul(grad[part.role], x[part.role]), r), 0)
                grads.weights[(n, part.role)] = contribution
        assert dot is not None
        r3 = b.div(b.mul(b.mul(r, r), r), head_dim)
        correction = b.mul(r3, b.expand_dims(dot, 1))
        grad = {
            role: b.sub(b.mul(r, g), b.mul(x[role], correction), name=f"d_{role}")
            for role, g in scaled_grad.items()
        }
    return grad, grads


def rope_transpose(
    side: SideTransforms, b: TileBuilder, grad: Parts, layout: tuple[Part, ...],
    rows: SSAValue, batch: Value, row_mask: SSAValue,
) -> Parts:
    """`grad` rotated back through `side`'s transforms, all of them RoPE (rotations need
    no saved forward values)."""
    assert all(isinstance(op, RopeOp) for op in side.transforms)
    states = [grad] * (len(side.transforms) + 1)
    return backward(side, b, grad, states, layout, rows, batch, row_mask)[0]
