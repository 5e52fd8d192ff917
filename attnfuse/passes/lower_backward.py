"""`lower-backward`: derive the backward of every attention program.

Runs after `mask-tiling` and before `lower-to-tile` (which consumes the attn ops). For a
function `@f` it adds a host function

```mlir
func.func @f_backward(<f's arguments>, %out, %lse, %d_out, %d_lse) -> (dq, dk, dv, <d learnable operands>)
```

with the kernels of `attnfuse.lowering.backward`: the preprocess (`delta`), the dQ
kernel, the dK/dV kernel, and — for transforms placed in pre-kernels — the pre-kernel
recomputed and its transpose; a packed batch adds the schedule kernels of its sequences
(`attnfuse.lowering.varlen`). The function's `attnfuse.grad_of` attribute lists, for each
result, the index of the argument it is the gradient of. Learnable operands: QK-norm
weights, bias tensors, ALiBi slopes given as an operand, sink logits.

Where the forward's pre-kernel computes a side (Q or K) exactly as the backward would
recompute it, RoPE alone (`BackwardHost.saved_sides`), `@f` gets the attribute
`attnfuse.saved` (the indices of those arguments) and a twin
`@f_backward_saved` takes those arguments transformed: `lower-to-tile` returns the
pre-kernel's output after out and lse, the autograd formula saves it in place of the
input, and no pre-kernel runs again in the backward (at Llama-3-8B, S = 2048, K's
took 20 us of a 2.4 ms step, H200 run 23). `@f_backward` keeps taking the inputs
(`AttentionFunction.gradients`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from attnfuse.analysis.paging import no_backward
from attnfuse.analysis.rope import NO_BACKWARD_BOTTOM_RIGHT, bottom_right_rope
from attnfuse.analysis.tile_plan import backward_block_sizes, resolve_f32_dot
from attnfuse.dialects.tile import KernelOp
from attnfuse.lowering.backward import DkvOptions
from attnfuse.lowering.backward_host import BackwardHost
from attnfuse.lowering.host_code import LAYOUT_ORDERS
from attnfuse.lowering.regions import RegionLoweringError
from attnfuse.lowering.simplify import simplify_kernels
from attnfuse.lowering.tile_fit import check_tile_rows
from attnfuse.program import ProgramError, analyze, find_functions


@dataclass(frozen=True)
class LowerBackwardPass(ModulePass):
    """Derive `@f_backward` host code and kernels from each attention program."""

    name = "lower-backward"
    requires: ClassVar[tuple[str, ...]] = ("rope-fusion", "online-softmax", "mask-tiling")

    block_m: int = 0
    """Query rows per dQ program and per step of the dK/dV loop; 0 picks
    `backward_block_sizes` (64; for f32 inputs 32, or 16 beyond head dim 128)."""
    block_n: int = 0
    """Keys per dK/dV program and per step of the dQ loop; 0 as `block-m`."""
    num_warps: int = 4
    num_stages: int = 2
    """The backward keeps more tiles live than the forward (Q, dO, dQ or dK/dV
    accumulators), so it uses smaller blocks and a shallower pipeline to fit in shared
    memory."""
    rope_table: bool = True
    """In-kernel RoPE reads cos/sin from a table built once per call; false is the ablation."""
    transforms_in_kernel: bool = False
    """Keep in-kernel Q/K transforms in the backward kernels instead of pre-kernels."""
    dkdv_transposed: bool = False
    """dK/dV kernel computes Sᵀ = K Qᵀ (no transposes of computed tiles, but K and V become
    register operands: measured 25% slower on an H200, run 12)."""
    dkdv_full_tiles: bool = True
    """dK/dV kernel walks q blocks inside the planned masks without mask code; false is the ablation."""
    dkdv_num_warps: int = 0
    """Warps per dK/dV program; 0 uses `num-warps`."""
    dkdv_block_map: bool = True
    """With a runtime block map (data-dependent masks), the dK/dV kernel walks a transposed
    map (per kv block, the partial and full q blocks that visit it); false walks every q
    block of the band with mask code (the ablation)."""
    count_tiles: bool = False
    """Debug: count the tiles the dQ and dK/dV kernels visit, in a buffer returned after
    the gradients (`AttentionFunction.count_backward_tiles`)."""
    fold_scale: bool = True
    """Recompute P with the scale carried through masks and biases to the exp2
    multiply-add (as `lower-to-tile`); false is the ablation."""
    alibi_vectors: bool = True
    """ALiBi distances from per-key and per-query vectors (as `lower-to-tile`)."""
    f32_dot: str = ""
    """Precision of the dots of f32 programs (as `lower-to-tile`; empty:
    `DEFAULT_F32_DOT`, tf32x3)."""
    rotate_in_epilogue: bool = True
    """Sides whose pre-kernel transforms are all RoPE over the whole head dim get dQ / dK
    rotated back in the main kernels' epilogue, written once in the input dtype, instead
    of by transpose pre-kernels on f32 buffers (no f32 dQ / dK buffers). The main loops
    keep full-width dots; the epilogue splits the gradient into the rope's halves
    (`qk_side.split_parts`). Until run 16 the rotation used the half-split layout in the
    whole loop, whose half-width dots made it slower (docs/benchmarks.md)."""
    hopper_backward: bool = True
    """Also build the warp-specialized Gluon backward (`lowering/hopper_backward.py`: dQ,
    dK and dV in one kernel, 5 matmuls per tile pair instead of 7) for the programs it
    serves, run on sm_90 for shape classes whose operands TMA can read (the Triton kernels
    otherwise). dQ is summed across CTAs by TMA reduce-adds in key-block order, so the
    gradients are bitwise reproducible. false keeps the Triton kernels only (the ablation)."""
    hopper_block_map: bool = False
    """The Gluon backward also serves runtime block maps (document ids, custom predicates
    that do not read the head): its CTAs walk a transposed map of 128 x 128 tiles and add
    dQ in the order of a map's ranks. Its GPU test passes (run 26); off until a
    benchmark shows it faster than the Triton kernels' walk."""
    grad_layout: str = "bhsd"
    """Memory layout of the gradients of `[B, H, S, D]` arguments: `bhsd` (contiguous) or
    `bshd` (stored as `[B, S, H, D]`, as `lower-to-tile{out-layout}`: the layout of the
    projections a Hugging Face model's q, k and v are views of, so their backward needs
    no copy). Internal f32 buffers stay `bhsd`; the kernels write the gradients through
    their strides either way."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        f32_dot = resolve_f32_dot(self.name, self.f32_dot)
        if self.grad_layout not in LAYOUT_ORDERS:
            raise ValueError(f"{self.name}: grad-layout must be one of {', '.join(LAYOUT_ORDERS)}, "
                             f"got {self.grad_layout!r}")
        grad_order = LAYOUT_ORDERS[self.grad_layout]
        functions = find_functions(op)
        if not functions and any(o.name == "tile.kernel" for o in op.ops):
            raise ProgramError(
                f"{self.name} found no attn program: the module is already lowered "
                "(lower-backward must run before lower-to-tile)"
            )
        existing = {o for o in op.ops if isinstance(o, KernelOp)}
        for function in functions:
            program = analyze(function)
            if program.online is None or program.online.tile_plan is None:
                raise ProgramError("lower-backward runs after online-softmax and mask-tiling", program.scores)
            reason = no_backward(program) or (NO_BACKWARD_BOTTOM_RIGHT if bottom_right_rope(program) else None)
            if reason is not None:
                # Inference only; asking such a program for a gradient reports this.
                function.attributes["attnfuse.no_backward"] = StringAttr(reason)
                continue
            default_m, default_n = backward_block_sizes(program)
            block_m, block_n = self.block_m or default_m, self.block_n or default_n
            check_tile_rows(program, block_m, block_n, "lower-backward{block-m block-n}")
            options = (program, block_m, block_n, self.num_warps, self.num_stages,
                       self.rope_table, self.transforms_in_kernel,
                       DkvOptions(self.dkdv_transposed, self.dkdv_full_tiles, self.dkdv_num_warps,
                                  self.dkdv_block_map),
                       self.rotate_in_epilogue, self.count_tiles, self.fold_scale, self.alibi_vectors,
                       f32_dot, self.hopper_backward, self.hopper_block_map, grad_order)
            builder = BackwardHost(*options)
            try:
                backward = builder.build()
            except RegionLoweringError as err:
                # The forward stays usable; asking for a gradient reports why there is none.
                function.attributes["attnfuse.no_backward"] = StringAttr(str(err))
                continue
            op.body.block.add_op(backward)
            kernels: dict[str, Operation] = {}
            for kernel in builder.kernels:
                op.body.block.add_op(kernel)
                kernels[kernel.sym_name.data] = kernel  # type: ignore[attr-defined]
            saved = builder.saved_sides()
            if saved:
                twin = BackwardHost(*options, given=saved)
                twin_backward = twin.build()
                # the same kernels, less the pre-kernels; kernels are named in the order
                # they are built (`_rope_table<n>`), so without a pre-kernel a twin may
                # name another table alike: then the backward recomputes (no twin)
                new = [k for k in twin.kernels if k.sym_name.data not in kernels]  # type: ignore[attr-defined]
                if all(k in new or k.is_structurally_equivalent(kernels[k.sym_name.data])  # type: ignore[attr-defined]
                       for k in twin.kernels):
                    op.body.block.add_op(twin_backward)
                    for kernel in new:
                        op.body.block.add_op(kernel)
                    side_args = {"q": program.q.arg_index, "k": program.k.arg_index}
                    function.attributes["attnfuse.saved"] = ArrayAttr([IntegerAttr(side_args[s], i64) for s in saved])
        simplify_kernels(o for o in op.ops if isinstance(o, KernelOp) and o not in existing)
