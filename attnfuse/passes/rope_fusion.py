"""`rope-fusion{strategy=auto|fused|hybrid|separate}`: decide where Q/K transforms run.

RoPE and QK-norm act on Q and K *before* the QK matmul. This pass sets each transform's
`placement`:

* `fused`: all of them run inside the attention kernel (Q in the prologue, each K tile
  right after its load);
* `hybrid`: Q's inside the kernel, K's once in a generated pre-kernel, so the kernel
  reads K already transformed;
* `separate`: both sides in generated pre-kernels (what an unfused stack does);
* `auto`: with a `target` (`rope-fusion{target=h100-sxm}`, or `attnfuse-opt --device`),
  the placement the cost model (`attnfuse.cost`, docs/cost-model.md) predicts fastest
  for each program at `seq-len` (0: the program's static S, else 4096; batch x S =
  16384); without one, `hybrid`, the fastest measured on an H200 for Llama-3-8B shapes
  at S = 512..16384 (docs/benchmarks.md, runs 11 and 13).

```mlir
%kr = attn.rope %k {theta = 500000.0} : tensor<?x8x?x128xbf16>
```
with `strategy=hybrid` becomes
```mlir
%kr = attn.rope %k {theta = 500000.0, placement = "prekernel"} : tensor<?x8x?x128xbf16>
```
Placements already written in the program are kept, which lets users pin one transform.
A Q rope with `align = "bottom_right"` is always placed in the kernel.

The kernel rotates Q and K in one column layout, so RoPEs of Q and K that differ in
style or `rotary_dim` cannot both run in it: when a strategy would put both there
(`fused`), K's transforms move to a pre-kernel (the `hybrid` placement), or Q's when K's
are pinned to the kernel; if both are pinned, the pass reports the conflict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr

from xdsl.passes import ModulePass

from attnfuse.cost import model
from attnfuse.cost.program_shape import shape_of
from attnfuse.cost.target import Target, get_target
from attnfuse.dialects.attn import RopeOp
from attnfuse.program import AttentionProgram, ProgramError, Side, analyze, find_functions

STRATEGIES = ("auto", "fused", "hybrid", "separate")


def choose_strategy(
    strategy: str, target: Target | None, program: AttentionProgram | None = None, seq_len: int = 0
) -> str:
    """Resolve `auto`: the cost model's choice for `program` on `target` at `seq_len`,
    `hybrid` without a target."""
    if strategy != "auto" or target is None:
        return strategy if strategy != "auto" else "hybrid"
    if program is None:
        raise ValueError("rope-fusion: the cost model needs the program to choose for a target")
    return model.choose(shape_of(program, seq_len, target=target), target)


def _pin_bottom_right(side: Side) -> None:
    """A Q rope aligned bottom-right runs in the attention kernel, which knows each
    sequence's key count (`kv_lens[b]` of a cache); a pre-kernel does not."""
    for op in side.transforms:
        if isinstance(op, RopeOp) and op.bottom_right():
            if op.str_option("placement") == "prekernel":
                raise ProgramError(
                    'attn.rope align = "bottom_right" runs in the attention kernel (its positions '
                    "depend on the keys' length): it cannot be placed in a pre-kernel", op)
            op.properties["placement"] = StringAttr("kernel")


def _place(side: Side, placement: str) -> None:
    for op in side.transforms:
        if op.str_option("placement") == "auto":
            op.properties["placement"] = StringAttr(placement)
    placements = side.placements()
    if "prekernel" in placements and "kernel" in placements:
        first_kernel = placements.index("kernel")
        if "prekernel" in placements[first_kernel:]:
            raise ProgramError(
                "a transform placed in a pre-kernel cannot follow one placed in the kernel",
                side.transforms[placements.index("prekernel", first_kernel)],
            )


def _kernel_rope(side: Side) -> RopeOp | None:
    """The first RoPE of a side that runs in the kernel (it fixes the side's layout)."""
    return next(
        (t for t in side.transforms if isinstance(t, RopeOp) and t.str_option("placement") == "kernel"), None
    )


def _layout(rope: RopeOp) -> tuple[str, int]:
    return rope.str_option("style"), rope.rotary_width()


def _separate_mismatched_ropes(q: Side, k: Side, unpinned: set[int]) -> None:
    """Move one side's transforms to a pre-kernel when Q's and K's in-kernel RoPEs
    differ in layout (see the module docstring); `unpinned` holds the ids of the
    transforms whose placement this pass chose."""
    rope_q, rope_k = _kernel_rope(q), _kernel_rope(k)
    if rope_q is None or rope_k is None or _layout(rope_q) == _layout(rope_k):
        return
    for side in (k, q):
        moved = [
            "prekernel" if id(t) in unpinned else t.str_option("placement") for t in side.transforms
        ]
        in_kernel = [t for t, p in zip(side.transforms, moved) if p == "kernel"]
        ordered = "kernel" not in moved or "prekernel" not in moved[moved.index("kernel"):]
        if ordered and not any(isinstance(t, RopeOp) for t in in_kernel):
            for op, placement in zip(side.transforms, moved):
                op.properties["placement"] = StringAttr(placement)
            return
    raise ProgramError(
        "q and k RoPE placed in the kernel must share style and rotary_dim; "
        "place one side in a pre-kernel",
        rope_k,
    )


@dataclass(frozen=True)
class RopeFusionPass(ModulePass):
    """Place RoPE / QK-norm inside the attention kernel or in pre-kernels."""

    name = "rope-fusion"
    requires: ClassVar[tuple[str, ...]] = ()

    strategy: str = "auto"
    target: str | None = None
    """GPU the cost model plans `auto` for (`attnfuse.cost.known_targets()`)."""
    seq_len: int = 0
    """Sequence length `auto` plans for; 0: the program's static S, else 4096."""

    def __post_init__(self) -> None:
        if self.target is not None:
            get_target(self.target)  # an unknown name lists the known ones
        if self.seq_len < 0:
            raise ValueError(f"rope-fusion: seq-len must be >= 0, got {self.seq_len}")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"rope-fusion: strategy must be one of {', '.join(STRATEGIES)}, got '{self.strategy}'"
            )
        target = get_target(self.target) if self.target is not None else None
        for function in find_functions(op):
            program = analyze(function)
            strategy = choose_strategy(self.strategy, target, program, self.seq_len)
            _pin_bottom_right(program.q)
            q_place = "prekernel" if strategy == "separate" else "kernel"
            k_place = "kernel" if strategy == "fused" else "prekernel"
            unpinned = {
                id(t) for t in program.q.transforms + program.k.transforms if t.str_option("placement") == "auto"
            }
            _place(program.q, q_place)
            _place(program.k, k_place)
            _separate_mismatched_ropes(program.q, program.k, unpinned)
