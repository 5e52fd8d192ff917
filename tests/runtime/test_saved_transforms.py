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


def rope64(x: torch.Tensor) -> torch.Tensor:
    """Half-style RoPE (theta 1e4) in float64, positions 0..S-1."""
    d = x.shape[-1]
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(x.shape[2], dtype=torch.float64)[:, None] * inv
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x = x.double()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def backward_kernels(fn: attnfuse.AttentionFunction, saved: bool) -> set[str]:
    host = fn._runner.backward_saved if saved else fn._runner.backward  # noqa: SLF001
    assert host is not None
    return {step.meta.name for plan in host._plans.values() for step in plan.steps  # noqa: SLF001
            if isinstance(step, KernelLaunch)}


@pytest.fixture(scope="module")
def hybrid() -> attnfuse.AttentionFunction:
    return attnfuse.compile(ROPE, pipeline=pipeline("hybrid"))


def test_forward_returns_the_rotated_keys(hybrid: attnfuse.AttentionFunction) -> None:
    """hybrid: K's pre-kernel is kept (Q rotates in the forward kernel, so the backward
    recomputes it)."""
    assert hybrid.op_signature.saved == (1,)
    assert str(hybrid.ops.forward._schema).endswith("-> (Tensor, Tensor, Tensor)")  # noqa: SLF001
    q, k, v = inputs()
    out, lse, k_rotated = hybrid.ops.forward(q, k, v)
    assert k_rotated.shape == k.shape and k_rotated.dtype == k.dtype
    torch.testing.assert_close(k_rotated.double(), rope64(k), rtol=1e-5, atol=1e-5)
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
    assert "saved_bwd_k_prologue" in backward_kernels(hybrid, saved=False)
    saved = backward_kernels(hybrid, saved=True)
    assert "saved_bwd_k_prologue" not in saved and "saved_bwd_q_prologue" in saved


def test_the_graph_does_not_keep_the_input(hybrid: attnfuse.AttentionFunction) -> None:
    """The graph holds the rotated K, not K: a K computed by the model (a projection's
    output) is freed once the model drops it; the gradient still reaches its source."""
    q, k_source, v = (t.requires_grad_() for t in inputs(seed=2))
    k = k_source * 1.0
    probe = weakref.ref(k)
    out = hybrid(q, k, v)
    del k
    gc.collect()
    assert probe() is None
    d_out = torch.randn_like(out)
    out.backward(d_out)
    kept = k_source.detach().requires_grad_()
    hybrid(q.detach(), kept, v.detach()).backward(d_out)
    torch.testing.assert_close(k_source.grad, kept.grad, rtol=0, atol=0)


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
    out, lse, k_rotated = hybrid.ops.forward(*args)
    assert hybrid.ops.backward_saved is not None
    backward_args = (args[0], k_rotated, args[2], out, lse, torch.randn_like(out), torch.randn_like(lse))
    result = torch.library.opcheck(hybrid.ops.backward_saved, backward_args,
                                   test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


def test_which_sides_are_kept() -> None:
    """separate: both pre-kernels are kept; fused: none runs; a QK-norm before K's RoPE:
    its transpose reads K, so K is recomputed (and kept as the input)."""
    assert attnfuse.compile(ROPE, pipeline=pipeline("separate")).op_signature.saved == (0, 1)
    for text, strategy in ((ROPE, "fused"), (NORM, "hybrid")):
        fn = attnfuse.compile(text, pipeline=pipeline(strategy))
        assert fn.op_signature.saved == () and fn.ops.backward_saved is None
        assert str(fn.ops.forward._schema).endswith("-> (Tensor, Tensor)")  # noqa: SLF001
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
