"""Common-subexpression elimination and loop-invariant code motion over `tile.kernel`s.

The kernel builders write each index computation where it is used (a tile's offsets
next to its load, the same `tl.arange` in every loop body). Triton's own compiler
removes the repeats on the GPU (its TTIR pipeline runs CSE and LICM), so the machine
code does not change; the Triton interpreter, which runs the kernel source op by op,
does not, and there every op costs Python overhead per program instance: hoisting and
merging them takes about two fifths off an interpreted backward. xDSL's passes do the
work (`cse`, and the `licm` pass's pattern applied to one kernel); a kernel's loads,
stores and atomics have memory effects and stay where they are.

```mlir
scf.for %i = %lo to %hi step %c16 : i32 {
  %d = tile.arange 0 to 16 : tensor<16xi32>   // hoisted above the loop
  ...
}
```
"""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.pattern_rewriter import PatternRewriteWalker
from xdsl.transforms.common_subexpression_elimination import cse
from xdsl.transforms.loop_invariant_code_motion import LoopInvariantCodeMotion

from attnfuse.dialects.tile import KernelOp


def simplify_kernels(kernels: Iterable[KernelOp]) -> None:
    """Merge repeated pure ops of each kernel, hoist loop-invariant ones out of its
    `scf.for` loops (innermost first), and merge again what the hoisting lined up."""
    for kernel in kernels:
        cse(kernel)
        PatternRewriteWalker(
            LoopInvariantCodeMotion(), apply_recursively=False, walk_regions_first=True
        ).rewrite_region(kernel.body)
        cse(kernel)
