"""The forward keeps what its pre-kernels computed for the backward (`attnfuse.saved`).

Where a side's pre-kernel is RoPE alone and the backward would recompute exactly it, the
forward op returns the rotated side after out and lse, the autograd formula saves it in
place of the input, and `@f_backward_saved` runs no pre-kernel for it. The gradients are
the bits of the recomputing backward (`AttentionFunction.gradients`), the input itself is
not kept alive by the graph, and torch.compile / fake tensors see the extra outputs.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import attnfuse
from attnfuse.runtime import host
from attnfuse.runtime.launch import KernelLaunch

Q, K = "tensor<?x4x?x32xf32>", "tensor<?x2x?x32xf32>"
ROPE = f"""
func.func @saved(%q: {Q}, %k: {K}, %v: {K}) -> {Q} {{
  %qr = attn.rope %q {{theta = 10000.0}} : {Q}
  %kr = attn.rope %k {{theta = 10000.0}} : {K}
  %s = attn.scores %qr, %kr : {Q}, {K} -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, {K} -> {Q}
  func.return %o : {Q}
}}
"""
NORM = ROPE.replace("@saved", "@normed").replace(
    f"%kr = attn.rope %k {{theta = 10000.0}} : {K}",
    f"%kn = attn.qk_norm %k {{eps = 1.0e-06}} : {K}\n  %kr = attn.rope %kn {{theta = 10000.0}} : {K}")


def pipeline(strategy: str) -> str:
    return ("attn-canonicalize,rope-fusion{strategy=" + strategy + "},online-softmax,mask-tiling,"
            "lower-backward,lower-to-tile")


def inputs(length: int = 19, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in [(2, 4, length, 32), (2, 2, length, 32), (2, 2, length, 32)]]


def rope(x: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Half-style RoPE (theta 1e4), positions 0..S-1, computed in `dtype`."""
    d = x.shape[-1]
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=dtype) / d)
    angles = torch.arange(x.shape[2], dtype=dtype)[:, None] * inv
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x = x.to(dtype)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def assert_rotated(got: torch.Tensor, x: torch.Tensor) -> None:
    """`got` is x rotated, within twice PyTorch's own float32 error against float64."""
    want = rope(x)
    bound = 2 * float((rope(x, torch.float32).double() - want).abs().max())
    assert float((got.double() - want).abs().max()) <= bound


def backward_kernels(fn: attnfuse.AttentionFunction, saved: bool) -> set[str]:
    host = fn._runner.backward_saved if saved else fn._runner.backward  # noqa: SLF001
    assert host is not None
    return {step.meta.name for plan in host._plans.values() for step in plan.steps  # noqa: SLF001
            if isinstance(step, KernelLaunch)}


@pytest.fixture(scope="module")
def hybrid() -> attnfuse.AttentionFunction:
    return attnfuse.compile(ROPE, pipeline=pipeline("hybrid"))


def test_forward_returns_the_rotated_sides(hybrid: attnfuse.AttentionFunction) -> None:
    """hybrid: the output of K's pre-kernel, and Q as the forward kernel rotated it (the
    kernel stores its rotated tile)."""
    assert hybrid.op_signature.saved == (0, 1)
    assert str(hybrid.ops.forward._schema).endswith("-> (Tensor, Tensor, Tensor, Tensor)")  # noqa: SLF001
    q, k, v = inputs()
    out, lse, q_rotated, k_rotated = hybrid.ops.forward(q, k, v)
    for rotated, side in ((q_rotated, q), (k_rotated, k)):
        assert rotated.shape == side.shape and rotated.dtype == side.dtype
        assert_rotated(rotated, side)
    torch.testing.assert_close(out, hybrid(q, k, v), rtol=0, atol=0)


def test_gradients_equal_the_recomputing_backward(hybrid: attnfuse.AttentionFunction) -> None:
    q, k, v = (t.requires_grad_() for t in inputs(seed=1))
    out = hybrid(q, k, v)
    d_out = torch.randn_like(out)
    out.backward(d_out)
    lse = hybrid(q.detach(), k.detach(), v.detach(), return_lse=True)[1]
    want = hybrid.gradients([q.detach(), k.detach(), v.detach()], out.detach(), lse, d_out)
    for got, ref in zip((q.grad, k.grad, v.grad), want):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert {"saved_bwd_q_prologue", "saved_bwd_k_prologue"} <= backward_kernels(hybrid, saved=False)
    assert not {"saved_bwd_q_prologue", "saved_bwd_k_prologue"} & backward_kernels(hybrid, saved=True)


def test_the_graph_does_not_keep_the_inputs(hybrid: attnfuse.AttentionFunction) -> None:
    """The graph holds the rotated Q and K, not Q and K: a Q / K computed by the model (a
    projection's output) is freed once the model drops it; the gradients still reach
    their sources."""
    q_source, k_source, v = (t.requires_grad_() for t in inputs(seed=2))
    q, k = q_source * 1.0, k_source * 1.0
    probes = [weakref.ref(q), weakref.ref(k)]
    out = hybrid(q, k, v)
    del q, k
    gc.collect()
    assert [p() for p in probes] == [None, None]
    d_out = torch.randn_like(out)
    out.backward(d_out)
    kept = [t.detach().requires_grad_() for t in (q_source, k_source)]
    hybrid(*kept, v.detach()).backward(d_out)
    for source, again in zip((q_source, k_source), kept):
        torch.testing.assert_close(source.grad, again.grad, rtol=0, atol=0)


def test_torch_compile_and_fake_tensors(hybrid: attnfuse.AttentionFunction) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: hybrid(q, k, v).sin(), backend="aot_eager", fullgraph=True)
    eager = [t.requires_grad_() for t in inputs(seed=3)]
    traced = [t.detach().clone().requires_grad_() for t in eager]
    hybrid(*eager).sin().sum().backward()
    compiled(*traced).sum().backward()
    for a, b in zip(eager, traced):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)
    args = inputs(length=9, seed=4)
    result = torch.library.opcheck(hybrid.ops.forward, args, test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result
    out, lse, q_rotated, k_rotated = hybrid.ops.forward(*args)
    assert hybrid.ops.backward_saved is not None
    backward_args = (q_rotated, k_rotated, args[2], out, lse, torch.randn_like(out), torch.randn_like(lse))
    result = torch.library.opcheck(hybrid.ops.backward_saved, backward_args,
                                   test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


def test_which_sides_are_kept() -> None:
    """separate: both pre-kernels' outputs; fused: Q as the forward kernel rotates it, not
    K (rotated once per visiting Q tile); a QK-norm before K's RoPE: its transpose reads
    K, so K is recomputed (and kept as the input)."""
    assert attnfuse.compile(ROPE, pipeline=pipeline("separate")).op_signature.saved == (0, 1)
    for text, strategy in ((ROPE, "fused"), (NORM, "hybrid")):
        fn = attnfuse.compile(text, pipeline=pipeline(strategy))
        assert fn.op_signature.saved == (0,), strategy
        assert str(fn.ops.forward._schema).endswith("-> (Tensor, Tensor, Tensor)")  # noqa: SLF001
        q, k, v = (t.requires_grad_() for t in inputs(seed=6))
        out = fn(q, k, v)
        d_out = torch.randn_like(out)
        out.backward(d_out)
        lse = fn(q.detach(), k.detach(), v.detach(), return_lse=True)[1]
        want = fn.gradients([q.detach(), k.detach(), v.detach()], out.detach(), lse, d_out)
        for got, ref in zip((q.grad, k.grad, v.grad), want):
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
        ran = backward_kernels(fn, saved=True)
        assert f"{fn.name}_bwd_q_prologue" not in ran and f"{fn.name}_bwd_k_prologue" in ran, sorted(ran)
    separate = attnfuse.compile(ROPE, pipeline=pipeline("separate"))
    q, k, v = (t.requires_grad_() for t in inputs(seed=5))
    out = separate(q, k, v)
    d_out = torch.randn_like(out)
    out.backward(d_out)
    lse = separate(q.detach(), k.detach(), v.detach(), return_lse=True)[1]
    want = separate.gradients([q.detach(), k.detach(), v.detach()], out.detach(), lse, d_out)
    for got, ref in zip((q.grad, k.grad, v.grad), want):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert not {"saved_bwd_q_prologue", "saved_bwd_k_prologue"} & backward_kernels(separate, saved=True)


def test_decoding_calls_store_q() -> None:
    """The split-KV kernel of decoding calls (few queries, the rows of a GQA group packed
    into one tile, several programs per row) stores the rotated Q too, once (split 0)."""
    fn = attnfuse.compile(ROPE, pipeline=pipeline("hybrid").replace("mask-tiling,", "mask-tiling,split-kv,"))
    assert fn.op_signature.saved == (0, 1)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 2, 32, generator=g)
    k, v = (torch.randn(2, 2, 300, 32, generator=g) for _ in range(2))
    with pytest.warns(UserWarning, match="top-left"):
        out, lse, q_rotated, k_rotated = fn.ops.forward(q, k, v)
    assert any(s.meta.name in ("saved_split_kv", "saved_split_kv_small") for plan in fn._runner.host._plans.values()  # noqa: SLF001
               for s in plan.steps if isinstance(s, KernelLaunch))
    assert_rotated(q_rotated, q)
    assert_rotated(k_rotated, k)


def test_backward_fills_no_zero_gradients(hybrid: attnfuse.AttentionFunction) -> None:
    """The saved transforms are not differentiable and unused results are not given
    zero gradients: the backward of `out` alone fills no Q- or K-sized tensor (nor the
    lse's) with zeros."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (t.requires_grad_() for t in inputs(seed=8))
    out, lse, q_rotated, k_rotated = hybrid.ops.forward(q, k, v)
    assert out.requires_grad and not q_rotated.requires_grad and not k_rotated.requires_grad
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out.backward(torch.randn_like(out))
    filled = [(e.name, e.input_shapes) for e in prof.events()
              if e.name in ("aten::fill_", "aten::zero_", "aten::zeros_like", "aten::zeros")]
    big = [f for f in filled if any(list(s) in (list(q.shape), list(k.shape)) for s in f[1])]
    assert not big, big
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_calls_that_drop_the_saved_q_do_not_store_it(hybrid: attnfuse.AttentionFunction) -> None:
    """`host.keeps_results`: an eager call that returns only `out` leaves the plan's
    q_transformed buffer as it was (the forward kernel skips the store); a call that
    keeps every result gets Q rotated."""
    q, k, v = inputs(seed=9)
    for _ in range(2):  # the shape class's plan, then its buffers for calls that drop results
        hybrid(q, k, v)
    plan = hybrid._runner.host.plan(host.call_signature([q, k, v]))  # noqa: SLF001
    assert plan is not None and plan.keeps is not None and plan.scratch is not None
    dropped = plan.scratch.blanks[0, False]
    names = {i: v.name_hint for v, i in hybrid._runner.host.slots.items()}  # noqa: SLF001
    (buffer,) = [t for i, t in enumerate(dropped, hybrid._runner.host.n_args)  # noqa: SLF001
                 if names.get(i) == "q_transformed"]
    buffer.fill_(7.0)
    out = hybrid(q, k, v)
    assert bool((buffer == 7.0).all())
    q_rotated = hybrid.ops.forward(q, k, v)[2]
    assert_rotated(q_rotated, q)
    torch.testing.assert_close(hybrid.ops.forward(q, k, v)[0], out, rtol=0, atol=0)
