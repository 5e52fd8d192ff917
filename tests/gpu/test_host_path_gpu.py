"""The per-call host path on the GPU (runtime/launch.py, runtime/plan.py): direct Gluon
launches with TMA descriptors kept per address, and buffers reused per plan and stream.

llama3 at S = 256, compiled `hybrid`, takes the Hopper forward on an H100 / H200 (K
pre-kernel, cos/sin table, Gluon forward with three descriptors); the placement is
pinned, since at B = 1, S = 256 the cost model would run `fused` for calls without
autograd (`attnfuse.placement_versions`). Every call below must give the output of
the first (JIT) call on the same inputs, bit for bit:

* many live outputs (more addresses than `TMA_CACHE_SIZE`), then freed ones reused;
* new inputs of the same shape class (new K and V addresses);
* another stream (its own buffers), and a CUDA graph (captured with fresh buffers).

Run on the GPU machine: `python -m pytest tests/gpu/test_host_path_gpu.py -q`.
"""

from __future__ import annotations

import pytest
import torch

import attnfuse
from attnfuse import examples
from attnfuse.passes import default_pipeline
from attnfuse.runtime.host import call_signature
from attnfuse.runtime.launch import TMA_CACHE_SIZE, KernelLaunch

pytestmark = pytest.mark.gpu


def _inputs(seed: int) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(1, h, 256, 128, device="cuda", dtype=torch.bfloat16, generator=g) for h in (32, 8, 8)]


@pytest.fixture(scope="module")
def fn() -> attnfuse.AttentionFunction:
    return attnfuse.compile(examples.path("llama3"), pipeline=default_pipeline({"rope-fusion": "strategy=hybrid"}))


def test_descriptors_follow_the_tensors(fn: attnfuse.AttentionFunction) -> None:
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward runs on compute capability 9.x")
    args = _inputs(0)
    expected, expected_lse = (t.clone() for t in fn(*args, return_lse=True))
    fn(*args)
    plan = fn._host.plan(call_signature(args))  # noqa: SLF001
    assert plan is not None
    gluon = [s for s in plan.steps if isinstance(s, KernelLaunch) and s.descriptors]
    assert gluon and all(s.raw is not None and s.tma for s in gluon), "the direct descriptor path is not taken"
    live = [fn(*args) for _ in range(2 * TMA_CACHE_SIZE)]  # live outputs: a new address each
    assert all(torch.equal(o, expected) for o in live)
    del live
    for _ in range(3):  # freed outputs: addresses come back
        out, lse = fn(*args, return_lse=True)
        assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    other = _inputs(1)
    want = fn(*[a.clone() for a in other])
    assert not torch.equal(want, expected)
    assert torch.equal(fn(*other), want)


def test_buffers_per_stream_and_in_a_graph(fn: attnfuse.AttentionFunction) -> None:
    args = _inputs(2)
    expected = fn(*args).clone()
    plan = fn._host.plan(call_signature(args))  # noqa: SLF001
    assert plan is not None and plan.scratch is not None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = [fn(*args) for _ in range(3)]
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(o, expected) for o in outs)
    assert len({key for key, _ in plan.scratch.blanks}) >= 2  # the default stream's and the side stream's
    kept = dict(plan.scratch.blanks)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*args)
    assert plan.scratch.blanks.keys() == kept.keys()  # a capture allocates its own buffers
    assert all(plan.scratch.blanks[key] is kept[key] for key in kept)
    graph.replay()
    fn(*_inputs(3))  # an eager call between replays reuses the plan's buffers, not the graph's
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)


def test_short_calls_without_autograd_run_one_launch() -> None:
    """With the default `rope-fusion{strategy=auto}` a call at B = 1, S = 128 without
    autograd runs the `fused` version on an H100 / H200 (the cost model's choice there):
    one kernel, no K pre-kernel; its output matches the float64 reference."""
    from attnfuse import reference
    from attnfuse.runtime.launch import KernelLaunch as Launch
    from attnfuse.testing import assert_close

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the cost model's choice checked here is an H100 / H200 one")
    fn = attnfuse.compile(examples.path("llama3"))
    g = torch.Generator(device="cuda").manual_seed(4)
    args = [torch.randn(1, h, 128, 128, device="cuda", dtype=torch.bfloat16, generator=g) for h in (32, 8, 8)]
    out = fn(*args)
    plan = fn._runner.inference[call_signature(args)]  # noqa: SLF001
    assert sum(isinstance(s, Launch) for s in plan.lean) == 1
    want = reference.run(examples.path("llama3").read_text(), *(a.cpu() for a in args))
    assert_close(out, want)
