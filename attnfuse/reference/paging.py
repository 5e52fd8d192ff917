"""Paged KV caches in the reference: gather each sequence's pages into contiguous keys.

A paged `attn.scores` (`block_table`, `kv_lens`) reads K and V from page pools
`[num_pages, H, page_size, D]`. The reference gathers, for every sequence `b`, the rows
of the pages `block_table[b, :]` into a contiguous `[B, H, max_pages * page_size, D]`
tensor (`Paging.gather`) and evaluates the program on it as on any batch, with two
differences: the score ops see `kv_len = kv_lens[b]` (bottom-right masks align there),
and keys `j >= kv_lens[b]` are dropped at the softmax (like the scores that pair two
sequences of a packed batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Paging", "PagingError", "paging"]


class PagingError(ValueError):
    """A block table or lengths that do not describe keys of the page pool."""


@dataclass(frozen=True)
class Paging:
    """The block table (`[B, max_pages]`) and key counts (`[B]`) of a paged scores value."""

    block_table: torch.Tensor
    kv_lens: torch.Tensor
    q_len: int
    page_size: int

    def gather(self, pool: torch.Tensor) -> torch.Tensor:
        """`[B, H, max_pages * page_size, D]`: the keys (or values) of every sequence in
        order; rows at or past `kv_lens[b]` are zeros."""
        batch, max_pages = self.block_table.shape
        _, heads, page_size, dim = pool.shape
        pages = torch.where(self.used_pages(), self.block_table, 0)
        rows = pool[pages.reshape(-1)].view(batch, max_pages, heads, page_size, dim)
        rows = rows.permute(0, 2, 1, 3, 4).reshape(batch, heads, max_pages * page_size, dim)
        keys = torch.arange(max_pages * page_size, device=pool.device)
        return torch.where((keys < self.kv_lens.view(batch, 1))[:, None, :, None], rows, 0.0)

    def grid(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """b, q_idx and kv_idx, shaped to broadcast over `[B, H, Sq, L]`."""
        batch, max_pages = self.block_table.shape
        dev = self.kv_lens.device
        return (torch.arange(batch, device=dev).view(-1, 1, 1, 1), torch.arange(self.q_len, device=dev).view(1, 1, -1, 1),
                torch.arange(max_pages * self.page_size, device=dev).view(1, 1, 1, -1))

    def lengths(self) -> tuple[int, torch.Tensor]:
        """q_len, and kv_len of each sequence as `[B, 1, 1, 1]`."""
        return self.q_len, self.kv_lens.view(-1, 1, 1, 1)

    def same_sequence(self) -> torch.Tensor:
        """`[B, 1, 1, L]`: the key is one of its sequence's `kv_lens[b]` keys."""
        return self.grid()[2] < self.kv_lens.view(-1, 1, 1, 1)

    def used_pages(self) -> torch.Tensor:
        """`[B, max_pages]`: the pages holding at least one of the sequence's keys."""
        first_key = torch.arange(self.block_table.shape[1], device=self.block_table.device) * self.page_size
        return first_key.view(1, -1) < self.kv_lens.view(-1, 1)


def paging(block_table: torch.Tensor, kv_lens: torch.Tensor, q_len: int, num_pages: int, page_size: int) -> Paging:
    """Check a block table and lengths against a pool of `num_pages` pages of
    `page_size` keys; raise `PagingError` naming what is wrong."""
    if block_table.dim() != 2 or kv_lens.dim() != 1 or block_table.shape[0] != kv_lens.shape[0]:
        raise PagingError(f"block_table [B, max_pages] and kv_lens [B] disagree: shapes {tuple(block_table.shape)} "
                          f"and {tuple(kv_lens.shape)}")
    capacity = block_table.shape[1] * page_size
    if bool(((kv_lens < 0) | (kv_lens > capacity)).any()):
        raise PagingError(f"kv_lens must be in [0, {capacity}] (max_pages * page_size), got {kv_lens.tolist()}")
    found = Paging(block_table, kv_lens, q_len, page_size)
    bad = found.used_pages() & ((block_table < 0) | (block_table >= num_pages))
    if bool(bad.any()):
        b, p = (int(i) for i in bad.nonzero()[0])
        raise PagingError(f"block_table[{b}, {p}] = {int(block_table[b, p])} is not a page of the pool "
                          f"(0 <= page < {num_pages})")
    return found
