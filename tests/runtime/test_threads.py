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
from tiny import TINY


def test_four_threads_at_once() -> None:
    fn = attnfuse.compile(TINY)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []
    done: list[int] = []

    def work(i: int) -> None:
        g = torch.Generator().manual_seed(i)
        q, k, v = (torch.randn(1, 2, 70 + i % 2, 32, generator=g) for _ in range(3))
        expected = reference.run(TINY, q, k, v)
        barrier.wait()
        try:
            for _ in range(2):
                assert_close(fn(q, k, v), expected)
            done.append(i)
        except BaseException as e:  # reported below, with every thread's failure
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(done) == [0, 1, 2, 3]
