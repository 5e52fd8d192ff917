"""Launch plans: the steps of one host program for one shape class (see `host`).

`LaunchPlan.run` runs a plan's steps on a call's arguments under the plan's device and
returns the host program's results. Buffers that never leave a call (a table built per
call, split-KV workspaces) are *scratch*: a plan keeps one set per stream (`Scratch`)
and runs its steps without their allocations; a call that drops every result but the
first (eager inference that returns only `out`) treats the others (the lse, the rotated
K a forward returns for its backward) the same way, and tells the kernels so
(`host.keeps_results` is 0: the forward skips its store of the rotated Q).
This is the caching allocator's own rule: memory that a call's kernels use on a stream
may serve the next call on that stream, whose kernels run after them. Calls that use
scratch run their steps one at a time per plan (a lock), so no other call's launches
come between those of one call. While a stream is being captured into a CUDA graph,
every buffer is allocated as usual (a graph keeps its addresses).

`HostProgram` decides which buffers are scratch: those the host code allocates
uninitialized (or zeroed for kernels that leave them zero, `host.alloc ... zero
restored`: a stream's set is zeroed once) that only launches and shape-only ops (`host.dim`, `host.tma_ready`) use,
not returned (or returned after result 0 only, for the calls that drop them), in program
order while they total at most `SCRATCH_BYTES`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

Slots = list[Any]
Step = Callable[[Slots], None]

SCRATCH_BYTES = 4 << 20
"""The most bytes of scratch a plan keeps per stream; buffers beyond it are allocated per call.
4 MiB holds the dropped results of a Llama-3-8B-sized call at B = 1, S = 128 (the rotated
K, 256 KiB, and the saved rotated Q, 1 MiB), whose allocation per call run 27's host
profile found (1 MiB had kept only the rotated K)."""


class Scratch:
    """The scratch buffers of a plan, one set per stream (see the module docstring)."""

    __slots__ = ("allocs", "blanks", "cuda_index", "dropped", "lock", "n_args", "stream")

    def __init__(self, allocs: Sequence[Step], dropped: Sequence[Step], n_args: int, device: torch.device) -> None:
        self.allocs = tuple(allocs)
        """The allocation steps of the buffers that never leave a call (each writes its
        slot `out`, counting the `n_args` arguments)."""
        self.dropped = tuple(dropped)
        """The allocation steps of the results after the first, for calls that drop them."""
        self.n_args = n_args
        self.cuda_index = device.index if device.type == "cuda" else None
        self.lock = threading.Lock()
        self.blanks: dict[tuple[int, bool], Slots] = {}
        self.stream: Callable[[int], int] | None = None

    def key(self) -> int | None:
        """The current stream of the plan's device (0 on the CPU, where the interpreter
        runs launches to the end); None while it is being captured."""
        if self.cuda_index is None:
            return 0
        if torch.cuda.is_current_stream_capturing():
            return None
        if self.stream is None:
            from triton.runtime import driver

            self.stream = driver.active.get_current_stream
        return self.stream(self.cuda_index)

    def blank(self, key: int, blank: Slots, lse: bool) -> Slots:
        """A plan's `blank` slots with the buffers of stream `key` in place, those of the
        results after the first too unless `lse` (call it under `lock`)."""
        dropped = self.dropped
        lse = lse or not dropped
        found = self.blanks.get((key, lse))
        if found is None:
            slots = [*([None] * self.n_args), *(blank if lse else self.blank(key, blank, True))]
            for alloc in self.allocs if lse else dropped:
                alloc(slots)
            found = self.blanks[key, lse] = slots[self.n_args:]
        return found


class LaunchPlan:
    """The steps of one host program for one shape class (see the module docstring).

    `steps` allocate every buffer; with `scratch`, `reusing` are the steps without the
    allocations of its buffers, and `lean` also without those of the results after the
    first (for calls that drop them; `reusing` when they are not scratch). `keeps`: the
    slot of `host.keeps_results`, set to 1 or 0 per call (whether it keeps every result)."""

    def __init__(self, device: torch.device, blank: Slots, steps: list[Step], returns: tuple[int, ...],
                 scratch: Scratch | None = None, reusing: list[Step] | None = None,
                 lean: list[Step] | None = None, *, keeps: int | None = None) -> None:
        self.device = device
        self.cuda_index = device.index if device.type == "cuda" else None
        self.blank = blank
        self.steps = steps
        self.returns = returns
        self.scratch = scratch
        self.reusing = steps if reusing is None else reusing
        self.lean = self.reusing if lean is None else lean
        self.keeps = keeps

    def run(self, args: Sequence[Any], lse: bool = True) -> list[Any]:
        """The host program's results on `args`; `lse=False`: the caller drops every
        result after the first."""
        if self.cuda_index is not None and torch.cuda.current_device() != self.cuda_index:
            with torch.cuda.device(self.device):
                return self._run(args, lse)
        return self._run(args, lse)

    def _run(self, args: Sequence[Any], lse: bool) -> list[Any]:
        scratch = self.scratch
        key = None if scratch is None else scratch.key()
        if scratch is None or key is None:
            slots = [*args, *self.blank]
            if self.keeps is not None:
                slots[self.keeps] = int(lse)
            for step in self.steps:
                step(slots)
        else:
            with scratch.lock:
                slots = [*args, *scratch.blank(key, self.blank, lse)]
                if self.keeps is not None:
                    slots[self.keeps] = int(lse)
                for step in self.reusing if lse else self.lean:
                    step(slots)
        return [slots[i] for i in self.returns]
