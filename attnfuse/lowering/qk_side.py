"""Q/K rows in the kernel: head-dim partitions, loads, QK-norm and RoPE on tiles.

RoPE pairs dimension `i` with a partner (`i + rd/2` in the half style, `i ^ 1` in the
interleaved one). Instead of permuting registers, a side is loaded as up to three column
*parts*: `a` (first of each pair), `b` (their partners) and `rest` (dims not rotated).
The rotation is then elementwise (`a' = a cos - b sin`, `b' = b cos + a sin`) and the
QK^T product is the sum of one dot per part, which is the same sum over head_dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.dialects.builtin import TensorType, f32, i32
from xdsl.ir import Attribute, SSAValue

from attnfuse.analysis.rope import RopeParams, yarn_attention_factor
from attnfuse.dialects.attn import QKNormOp, RopeOp
from attnfuse.dialects.tile_builder import TileBuilder, Value
from attnfuse.lowering.signature import KernelSignature, TensorArg


def padded(width: int) -> int:
    """Tile width for `width` columns: a power of two, at least 16 (tl.dot minimum)."""
    size = 16
    while size < width:
        size *= 2
    return size


@dataclass(frozen=True)
class Part:
    """Head-dim columns `start + step * i` for `i < width`."""

    role: str
    start: int
    step: int
    width: int

    @property
    def tile_width(self) -> int:
        return padded(self.width)

    def columns(self, b: TileBuilder) -> tuple[SSAValue, SSAValue]:
        """(column index [W], in-range mask [W]) of this part."""
        i = b.arange(0, self.tile_width, name=f"d_{self.role}")
        cols = b.add(b.mul(i, self.step), self.start) if (self.step, self.start) != (1, 0) else i
        return cols, b.lt(i, self.width)


def partition(rope: RopeOp | None, head_dim: int) -> tuple[Part, ...]:
    """The parts a side is loaded as (one part when nothing is rotated in the kernel)."""
    if rope is None:
        return (Part("all", 0, 1, head_dim),)
    rd = rope.rotary_width()
    half = rd // 2
    if rope.str_option("style") == "half":
        parts = [Part("a", 0, 1, half), Part("b", half, 1, half)]
    else:
        parts = [Part("a", 0, 2, half), Part("b", 1, 2, half)]
    if rd < head_dim:
        parts.append(Part("rest", rd, 1, head_dim - rd))
    return tuple(parts)


def splittable(rope: RopeOp, head_dim: int) -> bool:
    """Whether `split_parts` can regroup a full-width tile into `rope`'s two parts: the
    rotation covers the whole head dim, and each half is a tile width of its own (a
    power of two of at least 16, `padded`)."""
    return rope.rotary_width() == head_dim and padded(head_dim // 2) == head_dim // 2


def split_parts(b: TileBuilder, tile: SSAValue, layout: tuple[Part, ...]) -> dict[str, SSAValue]:
    """The two parts of a rope layout (`splittable`) taken out of a full-width [R, D] tile:
    a reshape to [R, 2, D/2] (half style) or [R, D/2, 2] (interleaved) and a select of
    each index of the size-2 axis. Meant for epilogues, where the layout conversion runs
    once per program."""
    first, second = layout
    rows = tile.type.get_shape()[0]  # type: ignore[attr-defined]
    if first.step == 1:
        grouped, axis = b.reshape(tile, [rows, 2, first.width]), 1
        which = b.expand_dims(b.expand_dims(b.arange(0, 2), 0), 2)
    else:
        grouped, axis = b.reshape(tile, [rows, first.width, 2]), 2
        which = b.expand_dims(b.expand_dims(b.arange(0, 2), 0), 0)
    return {part.role: b.reduce_sum(b.where(b.eq(which, i), grouped, 0.0), axis, name=f"split_{part.role}")
            for i, part in enumerate(layout)}


def side_layout(transforms: list[RopeOp | QKNormOp], head_dim: int) -> tuple[Part, ...]:
    """The parts of a side: those of its rope(s), which must agree."""
    from attnfuse.program import ProgramError

    ropes = [t for t in transforms if isinstance(t, RopeOp)]
    layouts = [partition(r, head_dim) for r in ropes]
    for rope, layout in zip(ropes[1:], layouts[1:]):
        if layout != layouts[0]:
            raise ProgramError(
                "two attn.rope on one side must share style and rotary_dim (they are applied "
                "to the same column pairs)",
                rope,
            )
    return layouts[0] if layouts else partition(None, head_dim)


@dataclass
class SideContext:
    """What transforms of one side need at kernel-build time."""

    sig: KernelSignature
    head_dim: int
    inv_freq: Callable[[RopeOp], SSAValue]
    """Host constant of a rope's (scaled) inverse frequencies, [rotary_dim / 2] f32."""
    rope_table: Callable[[RopeOp, Attribute], SSAValue] | None = None
    """Host value of a rope's cos/sin table in an element type (see `rope_table.py`);
    None evaluates cos and sin in the kernel."""
    table_type: Attribute | None = None
    """Element type of the tables read; None reads them in the rope's own element type
    (attention kernels), f32 gives pre-kernels the values they would evaluate."""


class SideTransforms:
    """Declares the kernel arguments of a side's transforms, then applies them."""

    def __init__(self, transforms: list[RopeOp | QKNormOp], ctx: SideContext, prefix: str) -> None:
        self.transforms = transforms
        self.ctx = ctx
        self.weights: dict[int, TensorArg] = {}
        self.positions: dict[int, TensorArg] = {}
        self.freqs: dict[int, TensorArg] = {}
        self.tables: dict[int, TensorArg] = {}
        self.bottom_right = any(isinstance(op, RopeOp) and op.bottom_right() for op in transforms)
        """A rope of this side is aligned bottom-right: `apply` needs `end`."""
        for n, op in enumerate(transforms):
            if isinstance(op, QKNormOp) and op.weight is not None:
                self.weights[n] = ctx.sig.tensor(f"{prefix}_norm_w{n}", op.weight)
            if isinstance(op, RopeOp) and ctx.rope_table is not None and not op.bottom_right():
                element = ctx.table_type or op.output.type.element_type  # type: ignore[attr-defined]
                self.tables[n] = ctx.sig.tensor(f"{prefix}_rope{n}", ctx.rope_table(op, element))
            elif isinstance(op, RopeOp):
                self.freqs[n] = ctx.sig.tensor(f"{prefix}_inv_freq{n}", ctx.inv_freq(op))
                if op.positions is not None:
                    self.positions[n] = ctx.sig.tensor(f"{prefix}_pos{n}", op.positions)

    def apply(
        self, b: TileBuilder, parts: dict[str, SSAValue], layout: tuple[Part, ...], rows: SSAValue,
        batch: Value, row_mask: SSAValue | None, cos_sin: tuple[SSAValue, SSAValue] | None = None,
        end: SSAValue | None = None,
    ) -> dict[str, SSAValue]:
        """Apply the transforms, in order, to fp32 parts of rows `rows` ([R] i32);
        `row_mask` None: every row is in bounds. `cos_sin`: the rope's cos and sin, when
        the caller has them (else they are read from its table or evaluated). `end`:
        the position of row 0 under a bottom-right rope (`kv_len - Sq` of the
        program's sequence; its cos/sin are evaluated here, never tabled)."""
        assert end is not None or not self.bottom_right, "a bottom-right rope needs the keys' end"
        for n, op in enumerate(self.transforms):
            if isinstance(op, QKNormOp):
                parts = self._qk_norm(b, n, op, parts, layout)
            else:
                parts = self._rope(b, n, op, parts, rows, batch, row_mask, cos_sin, end)
        return parts

    def _qk_norm(
        self, b: TileBuilder, n: int, op: QKNormOp, parts: dict[str, SSAValue], layout: tuple[Part, ...]
    ) -> dict[str, SSAValue]:
        total: SSAValue | None = None
        for x in parts.values():
            sq = b.reduce_sum(b.mul(x, x), 1)
            total = sq if total is None else b.add(total, sq)
        assert total is not None
        inv_rms = b.rsqrt(b.add(b.div(total, float(self.ctx.head_dim)), op.float_option("eps")), name="inv_rms")
        scale_rows = b.expand_dims(inv_rms, 1)
        out: dict[str, SSAValue] = {}
        for part in layout:
            x = b.mul(parts[part.role], scale_rows)
            w = self.norm_weight(b, n, op, part)
            out[part.role] = x if w is None else b.mul(x, w)
        return out

    def _rope(
        self, b: TileBuilder, n: int, op: RopeOp, parts: dict[str, SSAValue], rows: SSAValue,
        batch: Value, row_mask: SSAValue | None, cos_sin: tuple[SSAValue, SSAValue] | None = None,
        end: SSAValue | None = None,
    ) -> dict[str, SSAValue]:
        cos, sin = cos_sin or self.cos_sin(b, n, op, tile_width(parts["a"]), rows, batch, row_mask, end=end)
        a, bb = parts["a"], parts["b"]
        out = dict(parts)
        out["a"] = b.sub(b.mul(a, cos), b.mul(bb, sin), name="rot_a")
        out["b"] = b.add(b.mul(bb, cos), b.mul(a, sin), name="rot_b")
        return out


    def cos_sin(
        self, b: TileBuilder, n: int, op: RopeOp, width: int, rows: SSAValue,
        batch: Value, row_mask: SSAValue | None, *, end: SSAValue | None = None,
    ) -> tuple[SSAValue, SSAValue]:
        """cos and sin ([R, width] fp32, yarn factor included) for the pairs of part `a`:
        read from the rope's table when it has one, else evaluated (`end`: see `apply`)."""
        if n not in self.tables:
            return self.evaluate_cos_sin(b, n, op, width, rows, batch, row_mask, end=end)
        table = self.tables[n]
        half = op.rotary_width() // 2
        i = b.arange(0, width)
        offs = b.add(b.expand_dims(b.mul(rows, table.strides[1]), 1), b.expand_dims(b.mul(i, table.strides[2]), 0))
        base = table.base(b, batch)
        mask: SSAValue | None = b.expand_dims(b.lt(i, half), 0) if width != half else None
        if row_mask is not None:
            rows_ok = b.expand_dims(row_mask, 1)
            mask = rows_ok if mask is None else b.and_(rows_ok, mask)
        other = 0.0 if mask is not None else None
        cos = b.load(base, offs, mask=mask, other=other, name="cos")
        sin = b.load(base, b.add(offs, b.mul(half, table.strides[2])), mask=mask, other=other, name="sin")
        return b.cast(cos, f32), b.cast(sin, f32)

    def evaluate_cos_sin(
        self, b: TileBuilder, n: int, op: RopeOp, width: int, rows: SSAValue,
        batch: Value, row_mask: SSAValue | None, *, end: SSAValue | None = None,
    ) -> tuple[SSAValue, SSAValue]:
        """cos and sin ([R, width] fp32, yarn factor included), computed from positions
        (`end`: see `apply`)."""
        positions = self._positions(b, n, op, rows, batch, row_mask, end)
        half = op.rotary_width() // 2
        freq_arg = self.freqs[n]
        assert freq_arg.ptr is not None
        i = b.arange(0, width)
        freq = b.load(freq_arg.ptr, b.mul(i, freq_arg.strides[0]), mask=b.lt(i, half), other=0.0)
        angle = b.mul(b.expand_dims(positions, 1), b.expand_dims(freq, 0), name="angle")
        cos, sin = sin_cos(b, angle)
        if op.str_option("scaling") == "yarn":
            factor = _yarn_attention_factor(op)
            cos, sin = b.mul(cos, factor), b.mul(sin, factor)
        return cos, sin

    def norm_weight(self, b: TileBuilder, n: int, op: QKNormOp, part: Part) -> SSAValue | None:
        """The [1, W] fp32 weight (+ offset) of a qk_norm on one part, or None."""
        if n not in self.weights:
            return None
        cols, in_range = part.columns(b)
        w_arg = self.weights[n]
        assert w_arg.ptr is not None
        w = b.load(w_arg.ptr, b.mul(cols, w_arg.strides[0]), mask=in_range, other=0.0)
        return b.expand_dims(b.add(b.cast(w, f32), op.float_option("weight_offset")), 0)

    def _positions(
        self, b: TileBuilder, n: int, op: RopeOp, rows: SSAValue, batch: Value, row_mask: SSAValue | None,
        end: SSAValue | None,
    ) -> SSAValue:
        if op.bottom_right():
            assert end is not None
            return b.cast(b.add(b.add(rows, end), op.int_option("offset")), f32, name="pos")
        if n not in self.positions:
            return b.cast(b.add(rows, op.int_option("offset")), f32, name="pos")
        pos_arg = self.positions[n]
        assert pos_arg.ptr is not None
        if pos_arg.rank == 1:
            ptr, offs = pos_arg.ptr, b.mul(rows, pos_arg.strides[0])
        else:
            ptr, offs = pos_arg.base(b, batch), b.mul(rows, pos_arg.strides[1])
        if row_mask is None:
            return b.cast(b.load(ptr, offs), f32, name="pos")
        return b.cast(b.load(ptr, offs, mask=row_mask, other=0), f32, name="pos")


_HALF_PI_PARTS = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)
"""pi / 2 in three parts (Cody-Waite): the first two have few significant bits, so
`j * part` is exact for the quadrant counts of angles below about 10^4."""
_SIN_COEFFS = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS_COEFFS = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)
"""Minimax polynomials of sin(r) / r - 1 and (cos(r) - 1 + r^2 / 2) / r^4 in r^2 on
[-pi/4, pi/4] (Cephes `sinf` / `cosf`: about one ulp in f32)."""


def sin_cos(b: TileBuilder, angle: SSAValue) -> tuple[SSAValue, SSAValue]:
    """(cos, sin) of an f32 tile without branches: `angle = j pi/2 + r`, |r| <= pi/4,
    then polynomials in r and the quadrant `j mod 4`. `tl.cos` / `tl.sin` (libdevice)
    branch to a slow path for large arguments, and a kernel cannot issue its first K/V
    loads across that branch: a decode step's split kernel that rotates its queries
    waited for them (112 branches ahead of the first `cp.async` at sm_90)."""
    j = b.floor(b.fma(angle, 2 / math.pi, 0.5), name="quadrant")
    r = angle
    for part in _HALF_PI_PARTS:
        r = b.fma(j, -part, r)
    z = b.mul(r, r, name="r2")
    s = b.fma(b.fma(z, _SIN_COEFFS[0], _SIN_COEFFS[1]), z, _SIN_COEFFS[2])
    s = b.fma(b.mul(s, z), r, r, name="sin_r")
    c = b.fma(b.fma(z, _COS_COEFFS[0], _COS_COEFFS[1]), z, _COS_COEFFS[2])
    c = b.fma(b.mul(c, z), z, b.fma(z, -0.5, 1.0), name="cos_r")
    q = b.cast(j, i32)
    odd = b.ne(b.and_(q, 1), 0)
    sin = b.where(odd, c, s)
    cos = b.where(odd, s, c)
    sin = b.where(b.ne(b.and_(q, 2), 0), b.neg(sin), sin, name="sin")
    cos = b.where(b.ne(b.and_(b.add(q, 1), 2), 0), b.neg(cos), cos, name="cos")
    return cos, sin


def tile_width(tile: SSAValue) -> int:
    """The column count of a [R, W] tile."""
    assert isinstance(tile.type, TensorType)
    return tile.type.get_shape()[1]


def _yarn_attention_factor(op: RopeOp) -> float:
    return yarn_attention_factor(RopeParams.of(op))


def load_parts(
    b: TileBuilder, arg: TensorArg, base: SSAValue, rows: SSAValue, row_mask: SSAValue | None,
    layout: tuple[Part, ...], *, row_dim: int = 2, col_dim: int = 3, row_offsets: SSAValue | None = None,
) -> dict[str, SSAValue]:
    """Load rows `rows` of a [.., S, D] tensor as the parts of `layout`.

    `row_mask = None` means every row is in bounds (a full tile): parts whose width is a
    power of two then load without any mask. `row_offsets` ([R]) replaces
    `rows * stride` (rows gathered from the pages of a paged KV cache).
    """
    out: dict[str, SSAValue] = {}
    row_offs = b.expand_dims(b.mul(rows, arg.strides[row_dim]) if row_offsets is None else row_offsets, 1)
    for part in layout:
        cols, in_range = part.columns(b)
        offs = b.add(row_offs, b.expand_dims(b.mul(cols, arg.strides[col_dim]), 0))
        name = f"{arg.name}_{part.role}"
        if row_mask is None and part.width == part.tile_width:
            out[part.role] = b.load(base, offs, name=name)
            continue
        mask = b.expand_dims(in_range, 0)
        if row_mask is not None:
            mask = b.and_(b.expand_dims(row_mask, 1), mask)
        out[part.role] = b.load(base, offs, mask=mask, other=0.0, name=name)
    return out


def store_parts(
    b: TileBuilder, arg: TensorArg, base: SSAValue, rows: SSAValue, row_mask: SSAValue,
    layout: tuple[Part, ...], parts: dict[str, SSAValue], *, row_offsets: SSAValue | None = None,
) -> None:
    """Store parts (cast to the tensor's element type) into rows of a [.., S, D] tensor;
    `row_offsets` ([R]) replaces `rows * stride` (rows of the pages of a paged KV cache)."""
    assert isinstance(arg.host.type, TensorType)
    row_offs = b.expand_dims(b.mul(rows, arg.strides[2]) if row_offsets is None else row_offsets, 1)
    row_ok = b.expand_dims(row_mask, 1)
    for part in layout:
        cols, in_range = part.columns(b)
        offs = b.add(row_offs, b.expand_dims(b.mul(cols, arg.strides[3]), 0))
        mask = b.and_(row_ok, b.expand_dims(in_range, 0))
        b.store(base, offs, b.cast(parts[part.role], arg.host.type.element_type), mask=mask)
