"""Compiled functions called from several threads at once (CPU, the interpreter).

Triton's interpreter patches `triton.language` for the duration of each launch and
keeps the grid position in globals, so two launches at once broke each other (3 of 4
threads failed with "Did you forget to add @triton.jit ?"); the runtime serializes
interpreted launches. Two threads share each shape class, so plans are also built and
used concurrently.
"""

from __future__ import annotations

import threading

import torch

import attnfuse
from attnfuse import reference
from attnfuse.testing import assert_close
from tiny import TINY, run_in_threads


def test_four_threads_at_once() -> None:
    fn = attnfuse.compile(TINY)
    barrier = threading.Barrier(4)
    done: list[int] = []

    def work(i: int) -> None:
        g = torch.Generator().manual_seed(i)
        q, k, v = (torch.randn(1, 2, 70 + i % 2, 32, generator=g) for _ in range(3))
        expected = reference.run(TINY, q, k, v)
        barrier.wait()
        for _ in range(2):
            assert_close(fn(q, k, v), expected)
        done.append(i)

    errors = run_in_threads(work, 4)
    assert not errors, errors
    assert sorted(done) == [0, 1, 2, 3]
