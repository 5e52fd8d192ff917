"""Zero buffers that kernels leave zero (`host.alloc ... zero restored`), without a memset per call.

A split-KV decode step counts, per (batch, KV head), the programs that have stored
their partial results; the last one merges them and sets the counter back to 0. The
counters must be zero when a call starts, and are zero again when it ends.

* Eager calls: a launch plan keeps one set per stream, zeroed once (`plan.Scratch`,
  like the other buffers that never leave a call).
* A call captured into a CUDA graph keeps the addresses it was captured with for every
  replay. A zeroed allocation there would put a memset into the graph (1.1 us per
  replay on an H200, more than the merge saved in a hand-written kernel; run 38, call
  D). Instead the call takes a slice of `ZeroedPool`, memory zeroed before the capture
  that no other call ever gets, so graphs replayed concurrently never share counters.
  A plan built outside a capture tops the pool up for the calls that may be captured
  later (`reserve`); when the pool runs dry during a capture, the allocation is a
  memset in the graph, which is slower but correct.
"""

from __future__ import annotations

import threading

import torch

CHUNK_BYTES = 4 << 20
"""Bytes of zeroed memory the pool adds at a time, and keeps free where it can: a
benchmark captures thousands of calls into one graph (`triton.testing.do_bench_cudagraph`
with `rep=100`, as `bench/decode.py` calls it, captures about 100 ms of calls: 12,500
decode steps of 8 us, 400 KB of 32-byte counter slices at B = 1)."""

POOL_BYTES = 64 << 20
"""The most zeroed bytes the pool holds per device."""

ALIGN = 16
"""Bytes a slice is rounded up to."""


class ZeroedPool:
    """Zeroed device memory handed out once per slice (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: dict[torch.device, list[torch.Tensor]] = {}
        self.held: dict[torch.device, int] = {}

    def reserve(self, nbytes: int, device: torch.device) -> None:
        """Make at least `nbytes` (rounded up to `ALIGN`) ready for captured calls on
        `device`, unless the pool already holds `POOL_BYTES` there. Call it outside a
        capture: it allocates, zeroes, and waits for the zeroing."""
        need = -(-nbytes // ALIGN) * ALIGN
        with self.lock:
            chunks = self.free.setdefault(device, [])
            if sum(c.numel() for c in chunks) >= need or self.held.get(device, 0) >= POOL_BYTES:
                return
            size = max(CHUNK_BYTES, need)
            chunk = torch.zeros(size, dtype=torch.uint8, device=device)
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
            chunks.append(chunk)
            self.held[device] = self.held.get(device, 0) + size

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """A zeroed `shape` tensor no one else gets, or None when the pool has too little."""
        nbytes = -(-torch.Size(shape).numel() * dtype.itemsize // ALIGN) * ALIGN
        with self.lock:
            for i, chunk in enumerate(self.free.get(device, [])):
                if chunk.numel() >= nbytes:
                    taken, rest = chunk[:nbytes], chunk[nbytes:]
                    self.free[device][i] = rest
                    return taken[:torch.Size(shape).numel() * dtype.itemsize].view(dtype).view(shape)
        return None


POOL = ZeroedPool()


def restored_zeros(shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero buffer for counters that kernels leave zero: from `POOL` while the
    current stream is captured (when the pool has enough), else `torch.zeros`, after
    which the pool is topped up for a later capture of the same call."""
    if device.type != "cuda":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if torch.cuda.is_current_stream_capturing():
        found = POOL.take(shape, dtype, device) if nbytes else None
        return found if found is not None else torch.zeros(shape, dtype=dtype, device=device)
    if nbytes:
        POOL.reserve(max(64 * nbytes, CHUNK_BYTES // 2), device)
    return torch.zeros(shape, dtype=dtype, device=device)


__all__ = ["ALIGN", "CHUNK_BYTES", "POOL", "POOL_BYTES", "ZeroedPool", "restored_zeros"]
