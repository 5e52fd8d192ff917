"""`lower-to-tile{out-layout=bshd}`: the output `[B, H, S, D]` stored as `[B, S, H, D]`,
so its transposed view is contiguous (what Hugging Face models reshape into the output
projection). Values, gradients, fake tensors and the custom op's checks against the
contiguous layout and the float64 reference, on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attnfuse
from attnfuse import reference
from attnfuse.passes import BSHD_PIPELINE, DEFAULT_PIPELINE
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
        attnfuse.compile(PROGRAM, pipeline=DEFAULT_PIPELINE.removesuffix("lower-to-tile") + "lower-to-tile{out-layout=sbhd}")


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
