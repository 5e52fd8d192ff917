"""`attn-canonicalize`: simplify attn programs into one normal form.

* two adjacent band masks (causal / sliding window) of the same alignment merge into
  one: `causal` then `sliding_window{left = 4095}` is `sliding_window{left = 4095,
  right = 0}`; a band with neither bound left is `causal` only when it is exactly `right = 0`;
* a mask repeated verbatim right after itself is dropped;
* `attn.dropout` with `p = 0.0` is removed.

```mlir
%m = attn.mask causal %s : !attn.scores<?x16x?x?xf32>
%w = attn.mask sliding_window %m {left = 4095} : !attn.scores<?x16x?x?xf32>
```
becomes
```mlir
%w = attn.mask sliding_window %s {left = 4095, right = 0} : !attn.scores<?x16x?x?xf32>
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import Attribute, Region
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.analysis.masks import BAND_KINDS, mask_band
from attnfuse.dialects.attn import DropoutOp, MaskOp


class MergeBandMasks(RewritePattern):
    """mask(band1, mask(band2, s)) -> mask(band1 & band2, s), same alignment."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        inner = op.input.owner
        if not isinstance(inner, MaskOp) or op.kind_name not in BAND_KINDS:
            return
        if inner.kind_name not in BAND_KINDS or len(list(inner.output.uses)) != 1:
            return
        merged = mask_band(op).intersect(mask_band(inner))
        if merged is None:
            return
        props: dict[str, Attribute] = {}
        if merged.lower is None and merged.upper == 0:
            props["kind"] = StringAttr("causal")
        else:
            props["kind"] = StringAttr("sliding_window")
            if merged.lower is not None:
                props["left"] = IntegerAttr(-merged.lower, i64)
            if merged.upper is not None:
                props["right"] = IntegerAttr(merged.upper, i64)
        if merged.align != "top_left":
            props["align"] = StringAttr(merged.align)
        new = MaskOp.build(
            operands=[inner.input, []], result_types=[op.output.type], properties=props, regions=[Region()]
        )
        rewriter.replace(op, new)
        rewriter.erase(inner)


class DropRepeatedMask(RewritePattern):
    """mask(k, mask(k, s)) with identical kind, options and operands -> mask(k, s)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        inner = op.input.owner
        if (
            isinstance(inner, MaskOp)
            and op.kind_name != "custom"
            and inner.kind_name == op.kind_name
            and dict(inner.properties) == dict(op.properties)
            and list(inner.args) == list(op.args)
        ):
            rewriter.replace(op, [], [inner.output])


class DropZeroDropout(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: DropoutOp, rewriter: PatternRewriter) -> None:
        if op.float_option("p") == 0.0:
            rewriter.replace(op, [], [op.input])


@dataclass(frozen=True)
class AttnCanonicalizePass(ModulePass):
    """Normalise attn programs: merge band masks, drop no-op masks and dropout."""

    name = "attn-canonicalize"
    requires: ClassVar[tuple[str, ...]] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier([MergeBandMasks(), DropRepeatedMask(), DropZeroDropout()])
        ).rewrite_module(op)
