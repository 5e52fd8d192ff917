"""``drop-dropout``: remove ``attn.dropout`` for inference.

Dropout is the identity at inference time, and removing it lets the kernel skip the
random-number generation entirely. The seed operand simply loses a use.

```mlir
%pd = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x12x?x?xf32>, i64
%o = attn.weighted_sum %pd, %v : ...
```
becomes
```mlir
%o = attn.weighted_sum %p, %v : ...
```

Use it from the command line (any place before ``online-softmax``, which folds
dropout into the streaming softmax):

    attnfuse-opt model.attn --pass-plugin examples/passes/drop_dropout.py \\
        -p 'drop-dropout,attn-canonicalize,rope-fusion,online-softmax'

or from Python: ``register_pass(DropDropoutPass)``. See docs/extending.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.dialects.attn import DropoutOp


class RemoveDropout(RewritePattern):
    """Replace ``attn.dropout``'s result by its input probabilities."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: DropoutOp, rewriter: PatternRewriter) -> None:
        rewriter.replace(op, [], [op.input])


@dataclass(frozen=True)
class DropDropoutPass(ModulePass):
    """Remove attn.dropout ops (dropout is the identity at inference)."""

    name = "drop-dropout"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        walker = PatternRewriteWalker(RemoveDropout(), apply_recursively=False)
        walker.rewrite_module(op)
