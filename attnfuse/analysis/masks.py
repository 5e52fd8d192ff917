"""What the masks of a program keep: a band, a prefix, or data only known at run time.

* causal masks and sliding windows are bands (`mask_band`), and so are custom predicates
  that compare `kv_idx - q_idx` with constants (`predicate_band`);
* `prefix_lm` keeps a prefix of keys (static, or `-1` for its per-batch operand);
* document ids and other predicates need a block map built at run time.

`plan_masks` combines the masks whose `-inf` reaches the softmax (`effective_masks`) into
one `MaskPlan`:

```mlir
%c = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
%m = attn.mask sliding_window %c {left = 4095} : !attn.scores<?x4x?x?xf32>
```
plans `MaskPlan(Band(-4095, 0), prefix=None, exact=True, runtime_map=False)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr
from xdsl.ir import Operation, Region, SSAValue

from attnfuse.analysis.bands import Band
from attnfuse.dialects.attn import BiasOp, MaskOp

BAND_KINDS = ("causal", "sliding_window")
"""Mask kinds whose kept set is a band."""


@dataclass(frozen=True)
class Affine:
    """`q_coef * q_idx + kv_coef * kv_idx + const` over a predicate's index arguments."""

    q_coef: int
    kv_coef: int
    const: int

    def __sub__(self, other: Affine) -> Affine:
        return Affine(self.q_coef - other.q_coef, self.kv_coef - other.kv_coef, self.const - other.const)

    def __add__(self, other: Affine) -> Affine:
        return Affine(self.q_coef + other.q_coef, self.kv_coef + other.kv_coef, self.const + other.const)


def _compare_band(pred: str, diff: Affine) -> Band | None:
    """Band of `diff <pred> 0` where diff = a * (kv - q) + c with a = +-1."""
    a, c = diff.kv_coef, diff.const
    if diff.q_coef != -a or a not in (1, -1):
        return None
    # a*t + c (pred) 0, with t = kv - q
    if a == 1:
        bounds = {"slt": (None, -c - 1), "sle": (None, -c), "sgt": (-c + 1, None), "sge": (-c, None), "eq": (-c, -c)}
    else:
        bounds = {"slt": (c + 1, None), "sle": (c, None), "sgt": (None, c - 1), "sge": (None, c), "eq": (c, c)}
    if pred not in bounds:
        return None
    lower, upper = bounds[pred]
    return Band(lower, upper)


def predicate_band(region: Region) -> Band | None:
    """The band of a custom mask predicate, or None when it is not affine in (q, kv)."""
    block = region.block
    q_arg, kv_arg = block.args[2], block.args[3]
    forms: dict[SSAValue, Affine] = {q_arg: Affine(1, 0, 0), kv_arg: Affine(0, 1, 0)}
    bands: dict[SSAValue, Band] = {}
    for op in block.ops:
        if isinstance(op, arith.ConstantOp) and isinstance(op.value, IntegerAttr):
            forms[op.result] = Affine(0, 0, op.value.value.data)
        elif isinstance(op, (arith.AddiOp, arith.SubiOp)) and op.lhs in forms and op.rhs in forms:
            lhs, rhs = forms[op.lhs], forms[op.rhs]
            forms[op.result] = lhs + rhs if isinstance(op, arith.AddiOp) else lhs - rhs
        elif isinstance(op, arith.IndexCastOp) and op.input in forms:
            forms[op.result] = forms[op.input]
        elif isinstance(op, arith.CmpiOp) and op.lhs in forms and op.rhs in forms:
            pred = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"][op.predicate.value.data]
            band = _compare_band(pred, forms[op.lhs] - forms[op.rhs])
            if band is None:
                return None
            bands[op.result] = band
        elif isinstance(op, arith.AndIOp) and op.lhs in bands and op.rhs in bands:
            band = bands[op.lhs].intersect(bands[op.rhs])
            if band is None:
                return None
            bands[op.result] = band
        elif op is block.last_op:
            value = op.operands[0]
            return bands.get(value)
        else:
            return None
    return None


def mask_band(mask: MaskOp) -> Band:
    """The band of a causal or sliding-window mask (`mask.kind_name in BAND_KINDS`)."""
    align = mask.str_option("align")
    if mask.kind_name == "causal":
        return Band(None, 0, align)
    left, right = mask.option("left"), mask.option("right")
    return Band(None if left is None else -int(left), None if right is None else int(right), align)


def effective_masks(score_ops: list[Operation]) -> list[MaskOp]:
    """Masks whose -inf reaches the softmax: those after the last softcap/score_mod.

    A softcap maps -inf to -cap and a score_mod may map it anywhere, so a mask before
    them does not make its elements vanish and cannot be used to skip tiles.
    """
    masks: list[MaskOp] = []
    for op in score_ops:
        if isinstance(op, MaskOp):
            masks.append(op)
        elif not isinstance(op, BiasOp):
            masks = []
    return masks


@dataclass(frozen=True)
class MaskPlan:
    """What a kernel may skip: tiles outside `band` (plus keys below `prefix`, `-1`: the
    mask's operand); `exact`: band and prefix are the whole mask, so tiles inside need no
    mask code; `runtime_map`: a data-dependent mask classifies tiles at run time."""

    band: Band | None
    prefix: int | None
    exact: bool
    runtime_map: bool


def plan_masks(masks: list[MaskOp]) -> MaskPlan:
    """Combine the masks of a program (all ANDed) into one plan."""
    band: Band | None = None
    exact = True
    runtime_map = False
    prefix: int | None = None
    prefix_masks = 0
    for mask in masks:
        kind = mask.kind_name
        if kind in BAND_KINDS:
            this = mask_band(mask)
        elif kind == "prefix_lm":
            prefix_masks += 1
            prefix = -1 if mask.args else mask.int_option("prefix")
            continue
        elif kind == "custom" and not mask.args and (affine := predicate_band(mask.predicate)) is not None:
            this = affine
        else:  # document ids, other predicates
            runtime_map = True
            exact = False
            continue
        if band is None:
            band = this
        else:
            merged = band.intersect(this)
            if merged is None:
                exact = False  # keep the first band for skipping; the rest is elementwise
            else:
                band = merged
    if prefix_masks:
        if prefix_masks == 1 and band is None:
            band = Band(None, 0)
        else:  # prefix-lm mixed with other bands: visit by the bands, mask elementwise
            prefix = None
            exact = False
    if runtime_map:
        exact = False
    # No mask at all is exact too: every in-bounds tile is full.
    return MaskPlan(band, prefix, exact, runtime_map)
