"""The small causal program the run-time tests compile (f32, 2 heads, head dim 32), and
a harness that runs work in threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

TINY = """
func.func @tiny(%q: tensor<?x2x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x2x?x32xf32>) -> tensor<?x2x?x32xf32> {
  %s = attn.scores %q, %k : tensor<?x2x?x32xf32>, tensor<?x2x?x32xf32> -> !attn.scores<?x2x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x2x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x2x?x?xf32>, tensor<?x2x?x32xf32> -> tensor<?x2x?x32xf32>
  func.return %o : tensor<?x2x?x32xf32>
}
"""


def run_in_threads(work: Callable[[int], None], count: int) -> list[BaseException]:
    """Run `work(0)` .. `work(count - 1)` in threads started together; every exception
    they raised (each thread's failure is reported, not only the first)."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
