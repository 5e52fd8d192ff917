"""`online-softmax`: softmax + weighted_sum -> the streaming (running max / sum) form.

```mlir
%p = attn.softmax %s sinks %sk : !attn.scores<?x8x?x?xf32>, tensor<8xf32> -> !attn.probs<?x8x?x?xf32>
%o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf16>
```
becomes
```mlir
%o = attn.online_softmax %s, %v sinks %sk : !attn.scores<?x8x?x?xf32>, tensor<?x8x?x64xf16>, tensor<8xf32> -> tensor<?x8x?x64xf16>
```
An `attn.dropout` between them folds in as `dropout_seed` / `dropout_p`; the lse result
is kept when the softmax had one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.dialects.attn import DropoutOp, OnlineSoftmaxOp, SoftmaxOp, WeightedSumOp


class StreamSoftmaxWeightedSum(RewritePattern):
    """Fuse `softmax [-> dropout] -> weighted_sum` into `attn.online_softmax`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: WeightedSumOp, rewriter: PatternRewriter) -> None:
        probs = op.probs.owner
        dropout: DropoutOp | None = None
        if isinstance(probs, DropoutOp):
            dropout, probs = probs, probs.input.owner
        if not isinstance(probs, SoftmaxOp):
            return
        if len(list(probs.output.uses)) != 1 or (dropout and len(list(dropout.output.uses)) != 1):
            return
        properties: dict[str, Attribute] = {}
        seed: list[SSAValue] = []
        if dropout is not None:
            properties["dropout_p"] = dropout.properties["p"]
            seed = [dropout.seed]
        result_types: list[Attribute | list[Attribute]] = [op.output.type, []]
        if probs.lse is not None:
            result_types[1] = [probs.lse.type]
        online = OnlineSoftmaxOp.build(
            operands=[probs.input, op.v, [probs.sinks] if probs.sinks else [], seed],
            result_types=result_types,
            properties=properties,
        )
        rewriter.replace(op, online, [online.output])
        if dropout is not None:
            rewriter.erase(dropout)
        if probs.lse is not None and online.lse is not None:
            rewriter.replace_all_uses_with(probs.lse, online.lse)
            online.lse.name_hint = probs.lse.name_hint
        rewriter.erase(probs)


@dataclass(frozen=True)
class OnlineSoftmaxPass(ModulePass):
    """Rewrite softmax + weighted_sum into the running-max / running-sum form."""

    name = "online-softmax"
    requires: ClassVar[tuple[str, ...]] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(StreamSoftmaxWeightedSum(), apply_recursively=False).rewrite_module(op)
