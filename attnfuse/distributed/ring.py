"""Ring attention over a process group, built on the compiled kernels' lse.

Each rank holds a zigzag shard (`attnfuse.distributed.sharding`) of q, k and v. K and V
(and the K side's positions and document ids) travel around the ring, the transfer of the next shard
overlapping the current block's kernels; partial results merge exactly in f32:
`lse = logaddexp(lse, lse_j)`, `out = out * exp(lse_old - lse) + out_j * exp(lse_j - lse)`.

The backward runs each block's compiled backward with the *global* merged out and lse
(so `P_ij = exp(s_ij - lse_i)` and `D_i = rowsum(dO_i * O_i)` are exact per block); dQ
accumulates locally, dK and dV accumulate in f32 buffers that travel with their shard
and reach its owner after one full turn. Softmax sinks are added once to the merged rows
(the blocks run without them) and their gradient is computed from the merged lse.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import attnfuse.api
from attnfuse.builder import Program, ProgramBuilder
from attnfuse.distributed import sharding
from attnfuse.ring_split import PositionSource, RingSplit, split_for_ring

__all__ = ["RingAttention"]

Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class _Ring:
    """The process group as a ring: this rank, its size, its neighbours' global ranks."""

    group: dist.ProcessGroup | None
    rank: int
    world: int
    next: int
    prev: int

    @staticmethod
    def of(group: dist.ProcessGroup | None) -> _Ring:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("attnfuse.distributed.RingAttention: torch.distributed is not initialised "
                               "(call torch.distributed.init_process_group first)")
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        return _Ring(group, rank, world, peer((rank + 1) % world), peer((rank - 1) % world))

    def exchange(self, tensors: Tensors) -> tuple[Tensors, list[Any]]:
        """Start sending `tensors` to the next rank and receiving their like from the
        previous one: (receive buffers, requests to wait on)."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
        return received, dist.batch_isend_irecv(ops)


def _wait(requests: list[Any]) -> None:
    for request in requests:
        request.wait()


@dataclass(frozen=True)
class _Block:
    """One ring step's block: which program and which halves of the local shards."""

    fn: attnfuse.api.AttentionFunction
    q_rows: slice
    kv_rows: slice


class _Plan:
    """The compiled block programs and the ring; chooses each step's block."""

    def __init__(self, split: RingSplit, ring: _Ring, compile_kw: Mapping[str, Any]) -> None:
        self.split, self.ring = split, ring
        self.unmasked = attnfuse.api.compile(split.unmasked, **compile_kw)
        self.diagonal = attnfuse.api.compile(split.diagonal, **compile_kw) if split.diagonal else None

    def block(self, step: int, length: int) -> _Block:
        """Step `step`'s block for local shards of `length` (zigzag halves of `length // 2`)."""
        every, half = slice(0, length), length // 2
        if self.diagonal is None:
            return _Block(self.unmasked, every, every)
        if step == 0:
            return _Block(self.diagonal, every, every)
        source = (self.ring.rank - step) % self.ring.world
        if source < self.ring.rank:  # its first chunk precedes both of ours, its second follows them
            return _Block(self.unmasked, every, slice(0, half))
        return _Block(self.unmasked, slice(half, length), every)  # both its chunks precede our second

    def args(self, block: _Block, q: torch.Tensor, kv: Tensors, passed: Tensors, q_extra: Tensors) -> list[Any]:
        """The block program's arguments: `kv` is `[k, v, <K-side positions / document ids>]`,
        `q_extra` the Q side's positions / document ids (`[..., S]`)."""
        k, v, *kv_extra = kv
        rows, cols = block.q_rows, block.kv_rows
        args: list[Any] = [q[:, :, rows], k[:, :, cols], v[:, :, cols], *passed]
        args += [t[..., rows] for t in q_extra]
        return args + [t[..., cols] for t in kv_extra]


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Merge a block's (out, lse) into the running f32 (out, lse), in place."""
    merged = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - merged).unsqueeze(-1))
    out.add_(block_out.float() * torch.exp(block_lse - merged).unsqueeze(-1))
    lse.copy_(merged)


class _RingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, plan: _Plan, q_extra: Tensors, kv_extra: Tensors, sinks: torch.Tensor | None,
                q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *passed: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        ring, length = plan.ring, q.shape[2]
        kv = [t.contiguous() for t in (k, v, *kv_extra)]
        out = lse = None
        dtype = q.dtype
        for step in range(ring.world):
            received, requests = ring.exchange(kv) if step + 1 < ring.world else (kv, [])
            block = plan.block(step, length)
            block_out, block_lse = block.fn(*plan.args(block, q, kv, list(passed), q_extra), return_lse=True)
            if out is None or lse is None:
                out, lse, dtype = block_out.float(), block_lse.clone(), block_out.dtype
            else:
                _merge(out[:, :, block.q_rows], lse[:, :, block.q_rows], block_out, block_lse)
            _wait(requests)
            kv = received
        assert out is not None and lse is not None
        if sinks is not None:  # once, in the merged denominator: lse = log(sum exp(s) + exp(sink))
            merged = torch.logaddexp(lse, sinks.float().view(1, -1, 1).expand_as(lse))
            out.mul_(torch.exp(lse - merged).unsqueeze(-1))
            lse = merged
        result = out.to(dtype)  # the program's output dtype
        ctx.plan, ctx.q_extra, ctx.kv_extra = plan, q_extra, kv_extra  # integer tensors: no gradient
        ctx.save_for_backward(q, k, v, result, lse, sinks, *passed)
        return result, lse

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor | None, d_lse: torch.Tensor | None) -> tuple[Any, ...]:
        plan: _Plan = ctx.plan
        ring = plan.ring
        q, k, v, out, lse, sinks, *passed = ctx.saved_tensors
        length = q.shape[2]
        d_out = torch.zeros_like(out) if d_out is None else d_out.contiguous()
        kv = [t.contiguous() for t in (k, v, *ctx.kv_extra)]
        dq = torch.zeros_like(q, dtype=torch.float32)
        d_kv = [torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
        d_passed: list[torch.Tensor | None] = [None] * len(passed)
        d_kv_requests: list[Any] = []
        for step in range(ring.world):
            received, requests = ring.exchange(kv) if step + 1 < ring.world else (kv, [])
            block = plan.block(step, length)
            rows, cols = block.q_rows, block.kv_rows
            args = plan.args(block, q, kv, list(passed), ctx.q_extra)
            grads = block.fn.gradients(args, out[:, :, rows], lse[:, :, rows].contiguous(), d_out[:, :, rows],
                                       None if d_lse is None else d_lse[:, :, rows].contiguous())
            dq[:, :, rows] += grads[0]
            for i, grad in enumerate(grads[3:3 + len(passed)]):
                if grad is not None:
                    d_passed[i] = grad.float() if d_passed[i] is None else d_passed[i] + grad
            _wait(d_kv_requests)
            d_kv[0][:, :, cols] += grads[1]
            d_kv[1][:, :, cols] += grads[2]
            if ring.world > 1:
                d_kv, d_kv_requests = ring.exchange(d_kv)
            _wait(requests)
            kv = received
        _wait(d_kv_requests)  # after a full turn: the gradients of this rank's own k and v
        grads_passed = [g if g is None else g.to(p.dtype) for g, p in zip(d_passed, passed)]
        d_sinks = None if sinks is None else _sinks_gradient(sinks, out, lse, d_out, d_lse)
        return (None, None, None, d_sinks, dq.to(q.dtype), d_kv[0].to(k.dtype), d_kv[1].to(v.dtype),
                *grads_passed)


def _sinks_gradient(sinks: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                    d_lse: torch.Tensor | None) -> torch.Tensor:
    """This rank's share of d(loss)/d(sinks[h]) = sum over its rows of P_sink * (d_lse - rowsum(dO * O))."""
    p_sink = torch.exp(sinks.float().view(1, -1, 1) - lse)
    delta = (d_out.float() * out.float()).sum(-1)
    return (p_sink * ((0 if d_lse is None else d_lse) - delta)).sum((0, 2)).to(sinks.dtype)


class RingAttention:
    """Context-parallel attention of one program over a process group (see the module
    docstring and docs/pytorch.md, "Context parallelism").

    `program` is what `attnfuse.compile` takes (a built program, a builder, text or a
    path, with `params`); it is split into block programs (`attnfuse.ring_split`), which
    refuses programs with position- or row-dependent ops. Construct it after
    `torch.distributed.init_process_group`; `group` is the context-parallel group
    (default: the whole world).
    """

    def __init__(self, program: Program | ProgramBuilder | str | os.PathLike[str], *,
                 group: dist.ProcessGroup | None = None, params: Mapping[str, object] | None = None,
                 pipeline: str | None = None, target: str | None = None) -> None:
        self.split = split_for_ring(program, params)
        self.ring = _Ring.of(group)
        self._plan = _Plan(self.split, self.ring, {"pipeline": pipeline, "target": target})
        self.name = self.split.name

    @property
    def rank(self) -> int:
        return self.ring.rank

    @property
    def world(self) -> int:
        return self.ring.world

    def shard(self, x: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """This rank's zigzag shard of a full tensor (q, k, v: dim 2; `[B, S]` positions: dim 1)."""
        return sharding.shard(x, dim, self.rank, self.world)

    def unshard(self, x: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """The full tensor from every rank's shard (an all-gather, not differentiable)."""
        return sharding.unshard(x, dim, self.ring.group)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *operands: torch.Tensor,
                 return_lse: bool = False) -> Any:
        """Attention of this rank's shards `[B, H, S / world, D]` (zigzag, `shard`) against
        the whole sequence; the program's other operands follow in its order (positions
        and document ids as this rank's shard). Returns this rank's shard of the output (and of the
        f32 lse `[B, H, S / world]` with `return_lse` or when the program returns it)."""
        self._check(q, k, v, operands)
        length = q.shape[2]
        user = (q, k, v, *operands)
        split = self.split
        q_extra = self._extra(split.q_positions, split.q_doc, user, length, q.device)
        kv_extra = self._extra(split.kv_positions, split.kv_doc, user, length, q.device)
        passed = [user[i] for i in split.passed]
        sinks = None if split.sinks is None else user[split.sinks]
        out, lse = _RingFunction.apply(self._plan, q_extra, kv_extra, sinks, q, k, v, *passed)
        return (out, lse) if return_lse or self.split.returns_lse else out

    def _extra(self, positions: PositionSource | None, doc: int | None, user: Sequence[torch.Tensor], length: int,
               device: torch.device) -> Tensors:
        """One side's block operands: its rope positions (global, or the user's shard) and
        its document ids, as int32."""
        extra = []
        if positions is not None and positions.operand is None:
            extra.append(sharding.global_positions(length, self.rank, self.world, device) + positions.offset)
        elif positions is not None:
            extra.append(user[positions.operand])
        if doc is not None:
            extra.append(user[doc])
        return [t.to(torch.int32) for t in extra]

    def _check(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, operands: Sequence[torch.Tensor]) -> None:
        where = f"attnfuse.distributed.RingAttention(@{self.name})"
        names = self.split.operands
        if len(operands) != len(names):
            raise TypeError(f"{where}: takes q, k, v and {len(names)} operand(s) ({', '.join(names) or 'none'}), "
                            f"got {len(operands)}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{where}: {name} must be this rank's shard [B, H, S / world, D], got {got}")
        length = q.shape[2]
        if k.shape[2] != length or v.shape[2] != length or k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
            raise ValueError(f"{where}: q, k and v must be shards of one sequence: [B, H, S / world, D] with the "
                             f"same B and S / world, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if length % 2:
            raise ValueError(f"{where}: the local length S / world ({length}) must be even (two zigzag chunks)")
        split = self.split
        sources = [s.operand for s in (split.q_positions, split.kv_positions) if s is not None]
        for index in {i for i in (*sources, split.q_doc, split.kv_doc) if i is not None}:
            ids = operands[index - 3]
            if not isinstance(ids, torch.Tensor) or ids.shape[-1] != length:
                got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
                raise ValueError(f"{where}: operand '{names[index - 3]}' (positions or document ids) must be this "
                                 f"rank's shard ([B, S / world] or [S / world], S / world = {length}), got {got}")
