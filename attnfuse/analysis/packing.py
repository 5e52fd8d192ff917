"""Packed batches: the cu_seqlens operands of a program and what a packed program holds.

An `attn.scores` with `cu_seqlens_q` / `cu_seqlens_k` packs its batch: q, k and v are
`[1, heads, total_tokens, head_dim]` and sequence `i` is tokens `cu[i] <= t < cu[i + 1]`
on each side. The program is then one attention per sequence: RoPE positions and mask
indices count from the sequence's first token, and no sequence sees another's keys.
Lowering (`lower-to-tile`, `lower-backward`) and the runtime's argument checks share
this analysis.

```mlir
%s = attn.scores %qr, %kr cu_seqlens_q %cq cu_seqlens_k %ck : ... -> !attn.scores<?x32x?x?xf32>
```
packs with `PackedBatch(cu_q=%cq, cu_k=%ck)`.

Operands indexed by a padded `[B, S]` batch have no meaning per sequence and are
rejected: RoPE `positions`, document ids, bias tensors, per-row prefix lengths, and
dropout (its counters number `[B, H, Sq, Skv]` elements).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue

from attnfuse.dialects.attn import BiasOp, MaskOp, RopeOp
from attnfuse.program import AttentionProgram, ProgramError


@dataclass(frozen=True)
class PackedBatch:
    """The cumulative sequence lengths of the query and the key side (maybe one value)."""

    cu_q: SSAValue
    cu_k: SSAValue

    def arguments(self, program: AttentionProgram) -> tuple[tuple[int, str], ...]:
        """(argument index, side) of each cu_seqlens operand, side `Sq` or `Skv`."""
        return (program.arg(self.cu_q), "Sq"), (program.arg(self.cu_k), "Skv")


def packed_batch(program: AttentionProgram) -> PackedBatch | None:
    """The packing of `program`, or None; a `ProgramError` for what a packed program
    cannot hold (see the module docstring)."""
    scores = program.scores
    if scores.cu_seqlens_q is None or scores.cu_seqlens_k is None:
        return None
    packed = PackedBatch(scores.cu_seqlens_q, scores.cu_seqlens_k)
    packed.arguments(program)  # both must be function arguments
    v_type = program.v_type
    assert isinstance(v_type, TensorType)
    if v_type.get_shape()[0] != 1:
        raise ProgramError("v of a packed batch has batch dim 1 ([1, heads, total_k, head_dim])", scores)
    if packed.cu_q is not packed.cu_k and program.q.arg_index in (program.k.arg_index, program.v_arg):
        raise ProgramError("q and k / v read one argument but different cu_seqlens", scores)
    for op in program.q.transforms + program.k.transforms:
        if isinstance(op, RopeOp) and op.positions is not None:
            raise ProgramError(
                "attn.rope positions: in a packed batch positions restart at 0 in every sequence "
                "(add `offset` for a shift); a positions operand is not supported there", op)
        if isinstance(op, RopeOp) and op.bottom_right():
            raise ProgramError(
                'attn.rope align = "bottom_right" is not supported on a packed batch (positions '
                "restart at 0 in every sequence; add `offset` for a shift)", op)
    reject_padded_batch_ops(program, "in a packed batch", document_note=" (cu_seqlens already keep sequences apart)")
    return packed


def reject_padded_batch_ops(program: AttentionProgram, where: str, *, document_note: str = "",
                            dropout_note: str = "") -> None:
    """Raise a ProgramError at the first op that a batch without a padded [B, S] layout
    (packed or paged, `where`) cannot hold: masks and biases whose operands index that
    layout, and dropout."""
    for op in program.score_ops:
        if isinstance(op, MaskOp) and (op.kind_name == "document" or (op.kind_name == "prefix_lm" and op.args)):
            raise ProgramError(
                f"attn.mask {op.kind_name} with an operand indexes a padded [B, S] batch: not supported "
                f"{where}{document_note}", op)
        if isinstance(op, BiasOp) and op.kind_name == "tensor":
            raise ProgramError(f"attn.bias tensor indexes a padded [B, H, Sq, Skv] batch: not supported {where}", op)
    if program.dropout is not None or (program.online is not None and program.online.dropout_seed is not None):
        raise ProgramError(f"attn.dropout is not supported {where}{dropout_note}", program.dropout or program.online)
