"""`mask-tiling{block-m=128 block-n=64}`: plan which (q block, kv block) tiles run.

Analyses every `attn.mask` of a program and records a tile plan on its
`attn.online_softmax` (see that op for the fields):

* affine masks (causal of either alignment, sliding windows, and custom predicates that
  compare `kv_idx - q_idx` with constants) become a *band*
  `band_lower <= kv - q - diag <= band_upper`, from which `lower-to-tile` derives, per q
  block, the KV loop bounds (empty tiles are never visited) and the range of full tiles
  (run without mask code);
* `prefix_lm` adds a prefix (static, or `-1` for its per-batch operand);
* data-dependent masks (document ids, other predicates) ask for a block map built on the
  GPU at run time (`block_map = "runtime"`), which still skips empty tiles.

```mlir
%o = attn.online_softmax %m, %v : !attn.scores<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
```
becomes, for a causal mask,
```mlir
%o = attn.online_softmax %m, %v {block_m = 128, block_n = 64, band_upper = 0, band_exact = 1} : ...
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, TensorType, f32, i64
from xdsl.ir import Attribute, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from attnfuse.dialects.attn import BiasOp, MaskOp
from attnfuse.program import AttentionProgram, ProgramError, analyze, find_functions


@dataclass(frozen=True)
class Band:
    """`lower <= kv - q - diag <= upper` (None: unbounded), diag set by `align`."""

    lower: int | None
    upper: int | None
    align: str = "top_left"

    def intersect(self, other: Band) -> Band | None:
        """The band of both constraints, or None when the alignments differ."""
        if self.align != other.align:
            return None

        def pick(a: int | None, b: int | None, f: type[max] | type[min]) -> int | None:
            return b if a is None else a if b is None else f(a, b)

        return Band(pick(self.lower, other.lower, max), pick(self.upper, other.upper, min), self.align)


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


@dataclass(frozen=True)
class TilePlan:
    band: Band | None
    prefix: int | None
    exact: bool
    runtime_map: bool

    def properties(self, block_m: int, block_n: int) -> dict[str, Attribute]:
        props: dict[str, Attribute] = {
            "block_m": IntegerAttr(block_m, i64),
            "block_n": IntegerAttr(block_n, i64),
        }
        if self.band is not None:
            if self.band.lower is not None:
                props["band_lower"] = IntegerAttr(self.band.lower, i64)
            if self.band.upper is not None:
                props["band_upper"] = IntegerAttr(self.band.upper, i64)
            if self.band.align != "top_left":
                props["band_align"] = StringAttr(self.band.align)
        if self.prefix is not None:
            props["prefix"] = IntegerAttr(self.prefix, i64)
        if self.exact:
            props["band_exact"] = IntegerAttr(1, i64)
        if self.runtime_map:
            props["block_map"] = StringAttr("runtime")
        return props


def plan_masks(masks: list[MaskOp]) -> TilePlan:
    """Combine the masks of a program (all ANDed) into one tile plan."""
    band: Band | None = None
    exact = True
    runtime_map = False
    prefix: int | None = None
    prefix_masks = 0
    for mask in masks:
        kind, align = mask.kind_name, mask.str_option("align")
        this: Band | None = None
        if kind == "causal":
            this = Band(None, 0, align)
        elif kind == "sliding_window":
            left, right = mask.option("left"), mask.option("right")
            this = Band(None if left is None else -int(left), None if right is None else int(right), align)
        elif kind == "prefix_lm":
            prefix_masks += 1
            prefix = -1 if mask.args else mask.int_option("prefix")
            continue
        elif kind == "custom":
            this = predicate_band(mask.predicate) if not mask.args else None
            if this is None:
                runtime_map = True
                exact = False
                continue
        else:  # document ids
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
    return TilePlan(band, prefix, exact and (band is not None or prefix is not None), runtime_map)


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


def _narrow_16bit(program: AttentionProgram) -> bool:
    q_type = program.scores.q.type
    assert isinstance(q_type, TensorType)
    return max(q_type.get_shape()[3], program.v_type.get_shape()[3]) <= 128 and q_type.element_type != f32


def k_transformed_in_kernel(program: AttentionProgram) -> bool:
    """Whether the forward kernel transforms K tiles itself (`fused` placements)."""
    return any(t.str_option("placement") != "prekernel" for t in program.k.transforms)


def default_block_sizes(program: AttentionProgram, k_in_kernel: bool | None = None) -> tuple[int, int]:
    """(query rows, keys) per block when the pass options leave them at 0; `k_in_kernel`
    None reads the placement `rope-fusion` gave K's transforms.

    - K transformed in the kernel, 16-bit, head dims <= 128: 256 x 64. Each K tile is
      transformed once per q block that visits it, so taller q blocks halve that work;
      256 x 64 with 8 warps and 3 stages fits an SM and was 11% faster than 128 x 128
      for fused Llama-3-8B at S = 16384 (H200, run 14).
    - Other 16-bit inputs with head dims <= 128: 128 x 128 (3 stages fit; the fastest
      forward measured for Llama-3-8B, docs/benchmarks.md run 12).
    - Else 128 x 64 (wider rows or f32 leave room for fewer stages of 128 keys).
    """
    if not _narrow_16bit(program):
        return 128, 64
    if k_in_kernel is None:
        k_in_kernel = k_transformed_in_kernel(program)
    return (256, 64) if k_in_kernel else (128, 128)


@dataclass(frozen=True)
class MaskTilingPass(ModulePass):
    """Record the tile plan (loop bounds, full tiles, block map) of every program."""

    name = "mask-tiling"
    requires: ClassVar[tuple[str, ...]] = ("online-softmax",)

    block_m: int = 0
    """Query rows per program; 0 picks `default_block_sizes` (256 when K is transformed
    in the kernel, else 128)."""
    block_n: int = 0
    """Keys per KV block; 0 picks `default_block_sizes` (128 or 64)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for size, what in ((self.block_m, "block-m"), (self.block_n, "block-n")):
            if size and (size < 16 or size & (size - 1)):
                raise ValueError(f"mask-tiling: {what} must be a power of two >= 16, got {size}")
        for function in find_functions(op):
            program = analyze(function)
            if program.online is None:
                raise ProgramError("mask-tiling runs after online-softmax", program.scores)
            plan = plan_masks(effective_masks(program.score_ops))
            default_m, default_n = default_block_sizes(program)
            block_m = self.block_m or default_m
            block_n = self.block_n or default_n
            for key, value in plan.properties(block_m, block_n).items():
                program.online.properties[key] = value

