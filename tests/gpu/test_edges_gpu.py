"""GPU edges that the S = 2048 tests do not reach (issue 8, items 7 and 9).

* partial tiles and Sq != Skv at GPU scale, forward and gradients of every example;
* gradients of shared operands (norm weights, sinks, ALiBi slopes, broadcast bias),
  summed over the batch, against a full-batch float64 reference;
* calls from several threads and on several CUDA streams give the single-thread result.

Run on the GPU machine: `python -m pytest tests/gpu/test_edges_gpu.py -q` (skipped without
CUDA).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import attnfuse
from attnfuse import reference
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.pass_manager import make_context
from attnfuse.program import find_functions
from attnfuse.testing import assert_close, assert_grad_close, make_inputs

pytestmark = pytest.mark.gpu

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.attn"))


def _function(text: str, name: str) -> Any:
    return find_functions(parse_module_with_locations(make_context(), text, name)[0])[0]


def _shares_length(text: str) -> bool:
    """Programs whose ids/positions operand serves both q and k need Sq == Skv."""
    return "attn.mask document" in text or "positions" in text


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_partial_tiles_and_unequal_lengths(path: Path) -> None:
    """Sq = 1000, Skv = 1531 (neither a multiple of any block size), B = 2: forward and
    every gradient (shared operands summed over the whole batch) against the float64
    reference of the whole batch."""
    text = path.read_text()
    function = _function(text, str(path))
    q_len, kv_len = (1531, 1531) if _shares_length(text) else (1000, 1531)
    args = make_inputs(function, 2, q_len, kv_len, device="cuda", seed=7)
    fn = attnfuse.compile(text)
    leaves = [a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in args]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_args = [a.detach().double().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a for a in args]
    want = reference.run(text, *ref_args)
    want_out = want[0] if isinstance(want, tuple) else want
    assert_close(out.detach(), want_out.detach(), out.dtype)
    want_out.backward(grad.double())
    for i, (leaf, ref) in enumerate(zip(leaves, ref_args)):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            assert_grad_close(leaf.grad, ref.grad, out.dtype, f"{path.stem} d{function.args[i].name_hint}")


def test_threads_and_streams() -> None:
    """Four threads, each on its own CUDA stream, call one compiled function at once; each
    result equals the single-threaded one bit for bit."""
    text = (Path(__file__).parents[2] / "examples" / "llama3.attn").read_text()
    fn = attnfuse.compile(text)
    inputs = [make_inputs(_function(text, "llama3"), 2, 1024, 1024, device="cuda", seed=s) for s in range(4)]
    expected = [fn(*args) for args in inputs]
    torch.cuda.synchronize()
    results: list[torch.Tensor | None] = [None] * len(inputs)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(5):
                    results[i] = fn(*inputs[i])
            stream.synchronize()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, expected):
        assert got is not None and torch.equal(got, want)
