"""Buffers of launch plans (runtime/plan.py, host.py): empty buffers kept with the plan,
scratch buffers reused per stream, and which launches run once per plan."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import torch

import attnfuse
from attnfuse import examples, reference
from attnfuse.passes import default_pipeline
from attnfuse.runtime import host
from attnfuse.runtime.plan import LaunchPlan, Scratch
from attnfuse.testing import assert_close
from tiny import TINY, run_in_threads

ROPE = """
func.func @rope_scratch(%q: tensor<?x2x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x2x?x32xf32>) -> tensor<?x2x?x32xf32> {
  %qr = attn.rope %q {theta = 10000.0} : tensor<?x2x?x32xf32>
  %kr = attn.rope %k {theta = 10000.0} : tensor<?x2x?x32xf32>
  %s = attn.scores %qr, %kr : tensor<?x2x?x32xf32>, tensor<?x2x?x32xf32> -> !attn.scores<?x2x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x2x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x2x?x?xf32>, tensor<?x2x?x32xf32> -> tensor<?x2x?x32xf32>
  func.return %o : tensor<?x2x?x32xf32>
}
"""
"""RoPE with K rotated by a pre-kernel into a buffer that never leaves the call."""


def _inputs(q_len: int, kv_len: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, n, 32, generator=g) for n in (q_len, kv_len, kv_len)]


def _plan(fn: attnfuse.AttentionFunction) -> LaunchPlan:
    (plan,) = fn._host._plans.values()  # noqa: SLF001
    return plan


def _allocated(fn: attnfuse.AttentionFunction, steps: Any) -> set[str]:
    names = {index: value.name_hint for value, index in fn._host.slots.items()}  # noqa: SLF001
    return {names[s.out] for s in steps if hasattr(s, "out")}


def test_empty_buffers_are_kept_with_the_plan() -> None:
    """Without a split-KV decode the split workspaces have no elements: one buffer each
    serves every call, so a call allocates only out and lse."""
    fn = attnfuse.compile(TINY.replace("@tiny", "@tiny_empty"))
    fn(*_inputs(21, 21))
    assert _allocated(fn, _plan(fn).steps) == {"out", "lse"}


def test_a_call_that_drops_lse_reuses_one_buffer() -> None:
    """Calls that return only out write lse into one buffer of the plan; calls that
    return lse get a new tensor every time, with the right values."""
    text = TINY.replace("@tiny", "@tiny_drop")
    fn = attnfuse.compile(text)
    fn(*_inputs(21, 21))
    plan = _plan(fn)
    assert plan.scratch is not None and not plan.scratch.allocs
    assert _allocated(fn, plan.lean) == {"out"} and plan.reusing == plan.steps
    for seed in (1, 2):
        args = _inputs(21, 21, seed)
        assert_close(fn(*args), reference.run(text, *args))
    buffer = plan.scratch.blanks[0, False]
    args = _inputs(21, 21, 3)
    out, lse = fn(*args, return_lse=True)
    out2, lse2 = fn(*args, return_lse=True)
    assert not {lse.data_ptr(), lse2.data_ptr()} & {t.data_ptr() for t in buffer if isinstance(t, torch.Tensor)}
    assert lse.data_ptr() != lse2.data_ptr()
    assert_close(lse, lse2)
    assert_close(out, reference.run(text, *args))
    fn(*args)
    assert plan.scratch.blanks[0, False] is buffer


def test_buffers_that_never_leave_a_call_are_reused() -> None:
    """Compiled for inference, the rotated K of a pre-kernel and, at a split decode, the
    split workspaces and the merge's counters (and lse, which two launches write) are
    allocated once per plan and stream."""
    fn = attnfuse.compile(ROPE, pipeline=default_pipeline(without=["lower-backward"]))
    for q_len, kv_len, names in ((40, 40, {"k_transformed"}), (1, 256, {"k_transformed", "o_part", "lse_part", "split_counts"})):
        for seed in range(3):
            args = _inputs(q_len, kv_len, seed)
            out, lse = fn(*args, return_lse=True)
            assert_close(out, reference.run(ROPE, *args))
            assert_close(fn(*args), out)
        plan = fn._host.plan(host.call_signature(args))  # noqa: SLF001
        assert plan is not None and plan.scratch is not None
        assert _allocated(fn, plan.scratch.allocs) == names
        assert _allocated(fn, plan.reusing) == {"out", "lse"} and _allocated(fn, plan.lean) == {"out"}
        assert set(plan.scratch.blanks) == {(0, True), (0, False)}


def test_saved_transforms_are_scratch_for_calls_that_drop_them() -> None:
    """With a backward the forward returns the rotated Q and K (for the autograd formula,
    `attnfuse.saved`): calls that keep every result get them fresh, calls that return
    only out reuse one buffer for each of them and for lse."""
    text = ROPE.replace("@rope_scratch", "@rope_saved")
    fn = attnfuse.compile(text)
    assert fn.op_signature.saved == (0, 1)
    args = _inputs(40, 40)
    expected = reference.run(text, *args)
    first = fn.ops.forward(*args)[2:]
    assert_close(fn(*args), expected)
    plan = fn._host.plan(host.call_signature(args))  # noqa: SLF001
    assert plan is not None and plan.scratch is not None and not plan.scratch.allocs
    saved = {"lse", "q_transformed", "k_transformed"}
    assert _allocated(fn, plan.scratch.dropped) == saved
    assert _allocated(fn, plan.reusing) == {"out", *saved} and _allocated(fn, plan.lean) == {"out"}
    second = fn.ops.forward(*args)[2:]
    for a, b in zip(first, second):
        assert a.data_ptr() != b.data_ptr()
        assert_close(b, a)
    assert_close(fn(*args), expected)


def test_threads_share_a_plan_with_scratch_buffers() -> None:
    """Calls that use the plan's buffers run one at a time: four threads, one shape class."""
    text = ROPE.replace("@rope_scratch", "@rope_threads")
    fn = attnfuse.compile(text)
    fn(*_inputs(24, 24))
    barrier = threading.Barrier(4)

    def work(seed: int) -> None:
        args = _inputs(24, 24, seed)
        expected = reference.run(text, *args)
        barrier.wait()
        for _ in range(3):
            assert_close(fn(*args), expected)

    errors = run_in_threads(work, 4)
    assert not errors, errors


@pytest.mark.parametrize(("limit", "scratch", "dropped"), [
    (2 * 40 * 32 * 4, {"k_transformed"}, False),  # k_transformed fills it: lse is allocated per call
    (2 * 40 * 4, set(), True),  # lse only
    (100, None, False),
])
def test_scratch_within_the_size_limit(monkeypatch: pytest.MonkeyPatch, limit: int, scratch: set[str] | None,
                                       dropped: bool) -> None:
    monkeypatch.setattr(host, "SCRATCH_BYTES", limit)
    fn = attnfuse.compile(ROPE.replace("@rope_scratch", "@rope_limit"),
                          pipeline=default_pipeline(without=["lower-backward"]))  # K not returned
    fn._host._plans.clear()  # noqa: SLF001 - a plan of this limit
    args = _inputs(40, 40)
    fn(*args)
    assert_close(fn(*args), reference.run(ROPE, *args))
    plan = _plan(fn)
    if scratch is None:
        assert plan.scratch is None and plan.lean is plan.steps
        return
    assert plan.scratch is not None and _allocated(fn, plan.scratch.allocs) == scratch
    assert bool(plan.scratch.dropped) == dropped


def test_scratch_per_stream_and_none_while_capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA (faked here) one set of buffers per current stream; none during a capture."""
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    made: list[torch.Tensor] = []

    def alloc(slots: list[Any]) -> None:
        slots[1] = torch.empty(4)
        made.append(slots[1])

    def alloc_lse(slots: list[Any]) -> None:
        slots[2] = torch.empty(2)
        made.append(slots[2])

    scratch = Scratch([alloc], [alloc_lse], 1, torch.device("cuda", 0))
    stream = [11]
    scratch.stream = lambda index: stream[0]
    blank = [None, "kept"]
    assert scratch.key() == 11
    first = scratch.blank(11, blank, True)
    assert first == [made[0], "kept"] and scratch.blank(11, blank, True) is first
    dropped = scratch.blank(11, blank, False)
    assert dropped == [made[0], made[1]] and len(made) == 2  # the lse buffer joins the same set
    stream[0] = 12
    assert scratch.blank(scratch.key(), blank, True)[0] is made[2]
    capturing[0] = True
    assert scratch.key() is None


def test_a_gluon_kernel_that_declares_its_writes_leaves_tables_static() -> None:
    """The Hopper kernel of llama3 takes the bf16 cos/sin table; while its metadata does
    not say what it writes, the table's kernel runs on every call. Declared (descriptor
    arguments have no stride names), the table is built once per plan."""
    fn = attnfuse.compile(examples.path("llama3"))
    program = fn._host  # noqa: SLF001
    static = {op.kernel.root_reference.data for op in program.cached_launches}
    assert "llama3_rope_table0" in static
    meta = program.metadata["llama3_fwd_ws"]
    program.metadata["llama3_fwd_ws"] = dataclasses.replace(meta, writes=("o_desc", "LSE"))
    try:
        declared = {op.kernel.root_reference.data for op in program._launches_of_shapes_only()}  # noqa: SLF001
    finally:
        program.metadata["llama3_fwd_ws"] = meta
    assert declared == static | {"llama3_rope_table1"}


DECODE = """
func.func @decode_counts(%q: tensor<?x8x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>) -> tensor<?x8x?x32xf16> {
  %s = attn.scores %q, %k : tensor<?x8x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<?x8x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x8x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x32xf16> -> tensor<?x8x?x32xf16>
  func.return %o : tensor<?x8x?x32xf16>
}
"""
"""Decode whose split programs merge their splits, counting on `zero restored` counters."""


def test_split_counters_are_scratch() -> None:
    """The split-KV counters of `split-kv{merge=true}` (`host.alloc ... zero restored`)
    are kept per stream like the workspaces: zeroed once, left zero by the kernels, so
    later calls allocate neither, and each call's output matches the reference."""
    pipeline = default_pipeline(without=["lower-backward"]).replace("split-kv", "split-kv{merge=true}")
    fn = attnfuse.compile(DECODE, pipeline=pipeline)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        args = [torch.randn(1, h, n, 32, generator=g).half() for h, n in ((8, 1), (2, 100), (2, 100))]
        out = fn(*args)
        assert_close(out, reference.run(DECODE, *args), torch.float16)
    plan = _plan(fn)
    assert plan.scratch is not None
    assert "split_counts" in _allocated(fn, plan.scratch.allocs)
    assert "split_counts" not in _allocated(fn, plan.reusing)
    assert "decode_counts_split_kv_combine" not in {s.meta.name for s in plan.steps if hasattr(s, "meta")}
