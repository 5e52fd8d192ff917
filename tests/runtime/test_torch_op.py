"""The `torch.library` custom op of a compiled program (attnfuse.runtime.op), on the CPU.

`torch.compile` graphs use the `aot_eager` backend: it traces forward and backward with
fake tensors through AOTAutograd like inductor does, without inductor's C++ compile
time (inductor works too, see docs/pytorch.md). Numerical checks compare with the
float64 reference, bounded by PyTorch's own float32 error on the same inputs.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
from torch._subclasses.fake_tensor import FakeTensorMode

import attnfuse
from attnfuse import reference
from attnfuse.testing import assert_close, max_error

# the program of docs/pytorch.md (one compile serves both tests)
PROGRAM = """
func.func @gqa(%q: tensor<?x4x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x2x?x32xf32>) -> tensor<?x4x?x32xf32> {
  %s = attn.scores %q, %k : tensor<?x4x?x32xf32>, tensor<?x2x?x32xf32> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x32xf32> -> tensor<?x4x?x32xf32>
  func.return %o : tensor<?x4x?x32xf32>
}
"""

DROPOUT = """
func.func @drop(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>, %seed: i64) -> tensor<?x2x?x16xf16> {
  %s = attn.scores %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<?x2x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %d = attn.dropout %p, %seed {p = 0.25} : !attn.probs<?x2x?x?xf32>, i64
  %o = attn.weighted_sum %d, %v : !attn.probs<?x2x?x?xf32>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
"""


@pytest.fixture(scope="module")
def fn() -> attnfuse.AttentionFunction:
    return attnfuse.compile(PROGRAM)


def inputs(batch: int = 2, length: int = 19, grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(length)
    shapes = [(batch, 4, length, 32), (batch, 2, length, 32), (batch, 2, length, 32)]
    return [torch.randn(s, generator=g).requires_grad_(grad) for s in shapes]


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's own causal GQA attention, in the inputs' dtype."""
    return torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), is_causal=True
    )


def test_one_op_per_program(fn: attnfuse.AttentionFunction) -> None:
    op = fn.ops.forward
    assert op.namespace == "attnfuse" and op.name().startswith("attnfuse::gqa_")
    assert str(op._schema).endswith("(Tensor q, Tensor k, Tensor v) -> (Tensor, Tensor)")  # noqa: SLF001
    again = attnfuse.compile(PROGRAM)
    assert again.ops is fn.ops and again._host is fn._host  # noqa: SLF001 - plans shared
    other = attnfuse.compile(PROGRAM.replace("@gqa", "@gqa2"))
    assert other.ops.forward != op


def test_no_graph_break(fn: attnfuse.AttentionFunction) -> None:
    def layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return fn(q * 2, k, v).relu() + 1

    explained = torch._dynamo.explain(layer)(*inputs())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    args = inputs()
    torch.testing.assert_close(compiled(*args), layer(*args), rtol=0, atol=0)


def test_compiled_gradients_match_the_reference(fn: attnfuse.AttentionFunction) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: fn(q, k, v, return_lse=True), backend="aot_eager", fullgraph=True)
    args = inputs(grad=True)
    out, lse = compiled(*args)
    d_out = torch.randn_like(out)
    (out * d_out).sum().backward()
    ours = [a.grad for a in args]

    ref_args = [a.detach().double().requires_grad_() for a in args]
    ref = reference.run(PROGRAM, *ref_args)
    (ref * d_out.double()).sum().backward()
    torch_args = [a.detach().clone().requires_grad_() for a in args]
    (torch_attention(*torch_args) * d_out).sum().backward()
    assert_close(out.detach(), ref.detach())
    for name, mine, theirs, exact in zip("qkv", ours, [a.grad for a in torch_args], [a.grad for a in ref_args]):
        bound = 10 * max_error(theirs, exact) + 1e-5  # PyTorch's own float32 error, with a margin
        assert max_error(mine, exact) <= bound, name
    assert lse.shape == (2, 4, 19) and lse.dtype == torch.float32


def test_opcheck_backward(fn: attnfuse.AttentionFunction) -> None:
    """The backward op's schema and fake implementation. (The forward op passes all of
    opcheck's sub-checks: tests/runtime/test_pytorch_doc.py runs that snippet of
    docs/pytorch.md.)"""
    args = inputs(length=9, grad=True)
    out, lse = fn.ops.forward(*[a.detach() for a in args])
    assert fn.ops.backward is not None
    backward_args = (*[a.detach() for a in args], out, lse, torch.randn_like(out), torch.randn_like(lse))
    result = torch.library.opcheck(fn.ops.backward, backward_args, test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


def test_fake_and_meta_tensors(fn: attnfuse.AttentionFunction) -> None:
    with FakeTensorMode():
        q, k, v = (torch.empty(s) for s in [(3, 4, 70, 32), (3, 2, 50, 32), (3, 2, 50, 32)])
        out, lse = fn(q, k, v, return_lse=True)
        assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((3, 4, 70, 32), torch.float32, (3, 4, 70), torch.float32)
        with pytest.raises(attnfuse.AttnfuseArgumentError, match=r"argument 2 'v': expected shape \[B=3, 2, Skv=50, 32\]"):
            fn(q, k, v[:, :, :7])
    meta = [t.to("meta").requires_grad_() for t in inputs()]
    out = fn(*meta)
    assert out.device.type == "meta" and out.shape == (2, 4, 19, 32)
    out.sum().backward()
    assert meta[0].grad is not None and meta[0].grad.shape == meta[0].shape


def test_dynamic_shapes_one_graph(fn: attnfuse.AttentionFunction) -> None:
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    for length in (11, 23):
        args = inputs(length=length)
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=0, atol=0)
    assert counter.frame_count == 1


def test_seed_is_a_symint() -> None:
    drop = attnfuse.compile(DROPOUT)
    assert "SymInt seed" in str(drop.ops.forward._schema)  # noqa: SLF001
    q = torch.randn(1, 2, 12, 16, dtype=torch.float16)
    torch._dynamo.reset()
    compiled = torch.compile(drop, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, q, q, 7), drop(q, q, q, 7))
    assert not torch.equal(compiled(q, q, q, 8), drop(q, q, q, 7))


def test_no_backward_is_a_clear_error() -> None:
    forward_only = attnfuse.compile(PROGRAM.replace("@gqa", "@gqa_fwd"),
                                    pipeline="attn-canonicalize,rope-fusion,online-softmax,mask-tiling,lower-to-tile")
    q, k, v = inputs(grad=True)
    with pytest.raises(RuntimeError, match="@gqa_fwd has no gradient: it was compiled without lower-backward"):
        forward_only(q, k, v)
    out = forward_only.ops.forward(q, k, v)[0]  # the op itself: the error comes with the backward
    with pytest.raises(RuntimeError, match="@gqa_fwd has no gradient"):
        out.sum().backward()
    with torch.no_grad():
        assert forward_only(q, k, v).shape == (2, 4, 19, 32)


def test_ops_hold_their_program_weakly() -> None:
    """A program's kernels and plans go with its last compiled function; compiling it
    again revives its op."""
    import gc
    import weakref

    text = PROGRAM.replace("@gqa", "@gqa_weak")
    fn_ = attnfuse.compile(text)
    op, runner = fn_.ops.forward, weakref.ref(fn_._runner)  # noqa: SLF001
    args = inputs(length=5)
    expected = fn_(*args)
    del fn_
    gc.collect()
    assert runner() is None
    with pytest.raises(RuntimeError, match="@gqa_weak: every compiled function of this program was garbage collected"):
        op(*args)
    again = attnfuse.compile(text)
    assert again.ops.forward == op
    torch.testing.assert_close(op(*args)[0], expected, rtol=0, atol=0)



def test_autograd_graph_holds_its_program() -> None:
    """`attnfuse.compile(text)(q, k, v).backward(g)`: the compiled function is gone before
    backward runs, but the graph keeps its runner (gradients equal a kept function's), and
    lets it go with the graph."""
    import gc
    import weakref

    text = PROGRAM.replace("@gqa", "@gqa_graph")
    q, k, v = inputs(grad=True)
    kept = attnfuse.compile(text)
    out = kept(q, k, v)
    grad = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), grad)
    op, runner = kept.ops.forward, weakref.ref(kept._runner)  # noqa: SLF001
    del kept, out
    gc.collect()
    assert runner() is None
    out = attnfuse.compile(text)(q, k, v)
    gc.collect()
    got = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    del out, got
    gc.collect()
    with pytest.raises(RuntimeError, match="@gqa_graph: every compiled function of this program was garbage collected"):
        op(q.detach(), k.detach(), v.detach())

def test_eager_inference_skips_the_dispatcher(fn: attnfuse.AttentionFunction, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that needs no autograd, on plain tensors, outside torch.compile, runs the
    launch plan directly (the dispatcher costs about 28 us per call); with grad it goes
    through the custom op."""
    args = inputs(grad=True)
    want = fn(*[a.detach() for a in args])
    calls: list[int] = []
    op = fn._op  # noqa: SLF001

    def counting(*a: object) -> object:
        calls.append(1)
        return op(*a)

    monkeypatch.setattr(fn, "_op", counting)
    with torch.no_grad():
        assert torch.equal(fn(*args), want)
    assert torch.equal(fn(*[a.detach() for a in args]), want)
    assert calls == []
    out = fn(*args)
    assert calls == [1] and out.requires_grad and torch.equal(out.detach(), want)
