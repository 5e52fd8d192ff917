"""Packed batches in the reference: one attention per sequence, evaluated densely.

A packed `attn.scores` (`cu_seqlens_q`, `cu_seqlens_k`) makes its program one attention
per sequence. The reference computes its scores as one `[1, H, Tq, Tk]` tensor whose
block `(i, i)` holds sequence `i`'s `[len_q(i), len_k(i)]` scores; the entries pairing
tokens of two sequences belong to no sequence and are dropped at the softmax (after the
score ops, which may map `-inf` to a finite value). Everything before sees each sequence
on its own: RoPE positions restart at every sequence's first token, and the score ops'
indices are `b` = the sequence, `q_idx` / `kv_idx` counted from its first token, with
its own lengths for bottom-right alignment.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from xdsl.dialects.func import FuncOp
from xdsl.ir import Operation, SSAValue

from attnfuse.dialects.attn import QKNormOp, RopeOp, ScoresOp

__all__ = ["Packing", "PackingError", "Segments", "segments", "transform_segments"]


class PackingError(ValueError):
    """cu_seqlens that do not describe the tokens of a packed operand."""


@dataclass(frozen=True)
class Segments:
    """The tokens of one side of a packed batch, by sequence."""

    seq: torch.Tensor
    """[T] int64: the sequence of each token."""
    local: torch.Tensor
    """[T] int64: each token's index within its sequence."""
    lengths: torch.Tensor
    """[N] int64: the length of every sequence."""


def segments(cu: torch.Tensor, total: int, what: str) -> Segments:
    """The segments `cu` (`[N + 1]`, from 0 to `total`, non-decreasing) cut `total` tokens into."""
    if cu.dim() != 1 or cu.numel() == 0:
        raise PackingError(f"{what} must be a non-empty [N + 1] tensor, got shape {tuple(cu.shape)}")
    cu = cu.to(torch.int64)
    if int(cu[0]) != 0 or int(cu[-1]) != total or bool((cu[1:] < cu[:-1]).any()):
        raise PackingError(f"{what} must rise from 0 to {total} (the packed tokens), got {cu.tolist()}")
    tokens = torch.arange(total, device=cu.device)
    seq = torch.searchsorted(cu[1:], tokens, right=True)
    return Segments(seq, tokens - cu[seq], cu[1:] - cu[:-1])


@dataclass(frozen=True)
class Packing:
    """The query and key segments of a packed scores value."""

    q: Segments
    k: Segments

    def grid(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """b (the sequence), q_idx and kv_idx, shaped to broadcast over `[1, H, Tq, Tk]`."""
        return self.q.seq.view(1, 1, -1, 1), self.q.local.view(1, 1, -1, 1), self.k.local.view(1, 1, 1, -1)

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """q_len and kv_len of each query's sequence, as `[1, 1, Tq, 1]`."""
        return (self.q.lengths[self.q.seq].view(1, 1, -1, 1), self.k.lengths[self.q.seq].view(1, 1, -1, 1))

    def same_sequence(self) -> torch.Tensor:
        """`[1, 1, Tq, Tk]`: query and key belong to one sequence."""
        return (self.q.seq.view(1, 1, -1, 1) == self.k.seq.view(1, 1, 1, -1))


def transform_segments(function: FuncOp) -> dict[Operation, SSAValue]:
    """The RoPEs before a packed `attn.scores` -> the cu_seqlens of their side."""
    found: dict[Operation, SSAValue] = {}
    for scores in (op for op in function.walk() if isinstance(op, ScoresOp)):
        if scores.cu_seqlens_q is None or scores.cu_seqlens_k is None:
            continue
        for value, cu in ((scores.q, scores.cu_seqlens_q), (scores.k, scores.cu_seqlens_k)):
            while isinstance(value.owner, (RopeOp, QKNormOp)):
                found[value.owner] = cu
                value = value.owner.input
    return found
