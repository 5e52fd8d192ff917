"""Load-balanced (zigzag) sequence sharding for causal ring attention.

The sequence is cut into `2 * world` equal chunks; rank r holds chunks `r` and
`2 * world - 1 - r`, concatenated. Under a causal mask every rank then has the same
number of visible (query, key) pairs, so every ring step costs every rank the same: the
diagonal step is one causal block of the local shard, every other step one unmasked
block of half the local queries or half the local keys.

```python
local = shard(full, dim=2, rank=rank, world=world)        # [B, H, S / world, D]
full = unshard(local, dim=2, group=None)                  # all-gather, back in order
```
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["global_positions", "shard", "unshard"]


def _chunk(length: int, world: int, what: str) -> int:
    if length % (2 * world):
        raise ValueError(f"attnfuse.distributed: {what} ({length}) must be a multiple of 2 * world = {2 * world} "
                         "(zigzag sharding cuts it into 2 * world equal chunks)")
    return length // (2 * world)


def global_positions(local_length: int, rank: int, world: int, device: torch.device | str | None = None
                     ) -> torch.Tensor:
    """The global sequence positions (int64 `[local_length]`) of rank's zigzag shard."""
    chunk = _chunk(local_length * world, world, "the sequence length")
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    return torch.cat([first, first + (2 * world - 1 - 2 * rank) * chunk])


def shard(x: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank's zigzag shard of `x` along `dim` (a copy, contiguous)."""
    chunk = _chunk(x.shape[dim], world, f"size {x.shape[dim]} of dim {dim}")
    last = 2 * world - 1 - rank
    return torch.cat([x.narrow(dim, rank * chunk, chunk), x.narrow(dim, last * chunk, chunk)], dim=dim)


def unshard(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The full tensor from every rank's zigzag shard along `dim` (an all-gather; not
    differentiable)."""
    world = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    halves = [p.chunk(2, dim=dim) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=dim)
