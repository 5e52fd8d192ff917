"""Zeroed memory for the counters of captured calls (`runtime/counters.py`), on the CPU."""

from __future__ import annotations

import pytest
import torch

from attnfuse.runtime import counters
from attnfuse.runtime.counters import ZeroedPool, restored_zeros

CPU = torch.device("cpu")


def test_slices_are_zero_and_never_handed_out_twice() -> None:
    pool = ZeroedPool()
    assert pool.take((4,), torch.int32, CPU) is None  # nothing reserved yet
    pool.reserve(1000, CPU)
    a = pool.take((4,), torch.int32, CPU)
    b = pool.take((3, 5), torch.int32, CPU)
    assert a is not None and b is not None
    assert a.shape == (4,) and b.shape == (3, 5) and a.dtype == b.dtype == torch.int32
    assert not a.any() and not b.any()
    a.fill_(7)  # a graph's counters are its own: another slice stays zero
    assert not b.any() and b.data_ptr() >= a.data_ptr() + 16


def test_a_dry_pool_says_so_and_stops_growing_at_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counters, "CHUNK_BYTES", 512)
    monkeypatch.setattr(counters, "ALIGN", 256)
    monkeypatch.setattr(counters, "POOL_BYTES", 1024)
    pool = ZeroedPool()
    pool.reserve(100, CPU)
    assert pool.take((128,), torch.int32, CPU) is not None  # 512 bytes: the whole chunk
    assert pool.take((1,), torch.int32, CPU) is None
    pool.reserve(100, CPU)  # a second chunk: the pool holds its cap
    assert pool.held[CPU] == 1024
    assert pool.take((64,), torch.int32, CPU) is not None
    assert pool.take((64,), torch.int32, CPU) is not None
    pool.reserve(100, CPU)  # at the cap: no third chunk
    assert pool.held[CPU] == 1024 and pool.take((1,), torch.int32, CPU) is None


def test_restored_zeros_outside_a_capture_is_a_fresh_zero_tensor() -> None:
    t = restored_zeros((2, 3), dtype=torch.int32, device=CPU)
    assert t.shape == (2, 3) and not t.any()
