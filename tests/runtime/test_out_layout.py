"""`lower-to-tile{out-layout=bshd}` and `lower-backward{grad-layout=bshd}`: the output
`[B, H, S, D]` and the gradients of q, k and v stored as `[B, S, H, D]`, so their
transposed views are contiguous (what Hugging Face models reshape into the output
projection, and what the backward of their q/k/v projections reshapes). Values,
gradients, fake tensors and the custom op's checks against the contiguous layout and
the float64 reference, on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attnfuse
from attnfuse import reference
from attnfuse.passes import BSHD_PIPELINE, default_pipeline
from attnfuse.testing import assert_close, assert_grad_close
from tests.runtime.test_torch_op import PROGRAM, inputs


@pytest.fixture(scope="module")
def bshd() -> attnfuse.AttentionFunction:
    return attnfuse.compile(PROGRAM, pipeline=BSHD_PIPELINE)


def test_output_is_stored_bshd(bshd: attnfuse.AttentionFunction) -> None:
    q, k, v = inputs(batch=2, length=21)
    out, lse = bshd(q, k, v, return_lse=True)
    assert out.shape == (2, 4, 21, 32)
    assert out.transpose(1, 2).is_contiguous() and not out.is_contiguous()
    assert lse.is_contiguous()
    assert_close(out, reference.run(PROGRAM, q, k, v))
    assert "{order = array<i64: 0, 2, 1, 3>}" in bshd.lowered_ir


def test_gradients_and_compile_match_the_reference(bshd: attnfuse.AttentionFunction) -> None:
    q, k, v = inputs(batch=2, length=19, grad=True)
    out = torch.compile(bshd, backend="aot_eager", fullgraph=True)(q, k, v)
    assert out.transpose(1, 2).is_contiguous()
    d_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference.run(PROGRAM, q64, k64, v64)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), d_out.double())
    for name, grad, ref_grad in zip("qkv", grads, ref_grads):
        assert_grad_close(grad, ref_grad, torch.float32, f"d{name}")


ROPE = """
func.func @rope(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>) -> tensor<?x4x?x32xf16> {
  %qr = attn.rope %q {theta = 10000.0} : tensor<?x4x?x32xf16>
  %kr = attn.rope %k {theta = 10000.0} : tensor<?x2x?x32xf16>
  %s = attn.scores %qr, %kr : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}
"""


@pytest.mark.parametrize("strategy", ["hybrid", "fused", "separate"])
@pytest.mark.parametrize("text", [PROGRAM, ROPE], ids=["gqa_f32", "rope_f16"])
def test_gradients_are_stored_bshd(text: str, strategy: str) -> None:
    """q, k, v as [B, H, S, D] views of [B, S, H * D] projections (as in a Hugging Face
    layer): the op returns their gradients stored [B, S, H, D], equal to the contiguous
    pipeline's bit for bit (the same kernels, other strides) and, through the views, the
    projections get contiguous gradients."""
    pipe = BSHD_PIPELINE.replace("strategy=auto", f"strategy={strategy}")
    ordered = attnfuse.compile(text, pipeline=pipe)
    plain = attnfuse.compile(text, pipeline=default_pipeline({"rope-fusion": f"strategy={strategy}"}))
    assert ordered.op_signature.grad_orders == ((0, 2, 1, 3),) * 3
    dtype = torch.float16 if "f16" in text else torch.float32
    g = torch.Generator().manual_seed(3)
    batch, length = 2, 21
    x = [torch.randn(batch, length, h * 32, generator=g).to(dtype).requires_grad_() for h in (4, 2, 2)]
    views = [t.view(batch, length, -1, 32).transpose(1, 2) for t in x]
    out = ordered(*views)
    d_out = torch.randn(out.shape, generator=g).to(dtype)
    grads = torch.autograd.grad(out, views, d_out, retain_graph=True)
    assert all(gr.transpose(1, 2).is_contiguous() and gr.stride() == v.stride() for gr, v in zip(grads, views))
    want = torch.autograd.grad(plain(*views), views, d_out)
    assert all(w.is_contiguous() and torch.equal(gr, w) for gr, w in zip(grads, want))
    out.backward(d_out)
    assert all(t.grad is not None and t.grad.is_contiguous() for t in x)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in views)
    ref = reference.run(text, q64, k64, v64)
    for name, grad, ref_grad in zip("qkv", grads, torch.autograd.grad(ref, (q64, k64, v64), d_out.double())):
        assert_grad_close(grad, ref_grad, dtype, f"d{name}")


def test_fake_gradients_get_the_real_strides(bshd: attnfuse.AttentionFunction) -> None:
    q, k, v = inputs(batch=2, length=12)
    out, lse = bshd(q, k, v, return_lse=True)
    args = (q, k, v, out, lse, torch.randn_like(out), torch.zeros_like(lse))
    assert bshd.ops.backward is not None
    real = bshd.ops.backward(*args)
    with FakeTensorMode() as mode:
        fake = bshd.ops.backward(*(mode.from_tensor(t) for t in args))
    assert [(f.shape, f.stride()) for f in fake] == [(r.shape, r.stride()) for r in real]
    assert all(r.transpose(1, 2).is_contiguous() for r in real)


def test_fake_tensors_get_the_real_strides(bshd: attnfuse.AttentionFunction) -> None:
    q, k, v = inputs(batch=3, length=10)
    real = bshd(q, k, v)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        fake = bshd(fq, fk, fv)
    assert (fake.shape, fake.stride()) == (real.shape, real.stride())
    result = torch.library.opcheck(bshd.ops.forward, (q, k, v), test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


def test_unknown_layout_is_an_error() -> None:
    with pytest.raises(Exception, match="out-layout must be one of bhsd, bshd, got 'sbhd'"):
        attnfuse.compile(PROGRAM, pipeline=default_pipeline({"lower-to-tile": "out-layout=sbhd"}))


def test_unknown_grad_layout_is_an_error() -> None:
    with pytest.raises(Exception, match="grad-layout must be one of bhsd, bshd, got 'sbhd'"):
        attnfuse.compile(PROGRAM, pipeline=default_pipeline({"lower-backward": "grad-layout=sbhd"}))


def test_alloc_order_must_be_a_permutation() -> None:
    from xdsl.dialects.builtin import DenseArrayBase, TensorType, f32, i64
    from xdsl.utils.exceptions import VerifyException

    from attnfuse.dialects.host import AllocOp

    def alloc(order: list[int]) -> AllocOp:
        return AllocOp.build(operands=[[], []], result_types=[TensorType(f32, [2, 3, 4])],
                             properties={"order": DenseArrayBase.from_list(i64, order)})

    assert alloc([1, 0, 2]).dim_order() == (1, 0, 2)
    assert alloc([0, 1, 2]).dim_order() is None
    with pytest.raises(VerifyException, match=r"order \[0, 0, 2\] is not a permutation of the 3 dims"):
        alloc([0, 0, 2]).verify()


def test_convert_order_must_be_a_permutation() -> None:
    from xdsl.dialects.builtin import DenseArrayBase, TensorType, bf16, f32, i64
    from xdsl.utils.exceptions import VerifyException

    from attnfuse.dialects.host import ConvertOp

    def convert(order: list[int]) -> ConvertOp:
        from attnfuse.dialects.host import AllocOp

        src = AllocOp.build(operands=[[], []], result_types=[TensorType(f32, [2, 3, 4])])
        return ConvertOp.build(operands=[src.result, []], result_types=[TensorType(bf16, [2, 3, 4])],
                               properties={"order": DenseArrayBase.from_list(i64, order)})

    assert convert([1, 0, 2]).dim_order() == (1, 0, 2)
    with pytest.raises(VerifyException, match=r"order \[0, 0, 2\] is not a permutation of the 3 dims"):
        convert([0, 0, 2]).verify()
