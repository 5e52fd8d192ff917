"""attnfuse.nn.Attention: layouts as strided views, owned parameters, operands, dropout."""

from __future__ import annotations

import pytest
import torch

import attnfuse
from attnfuse.nn import Attention
from attnfuse.reference import run
from attnfuse.reference.interpreter import alibi_slopes
from attnfuse.testing import assert_close

PROGRAM = (attnfuse.attention(4, 16, kv_heads=2, dtype="f32", name="module").qk_norm(weight_offset=1.0)
           .rope(positions=True).alibi(slopes=True).causal().document().sinks())


@pytest.fixture(scope="module")
def attn() -> Attention:
    return Attention(PROGRAM, layout="bshd")


def _inputs(seq: int = 11) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, seq, h, 16, generator=g) for h in (4, 2, 2))
    pos = torch.arange(seq, dtype=torch.int32).expand(2, seq)
    doc = (torch.arange(seq, dtype=torch.int32) >= 6).int().expand(2, seq)
    return q, k, v, pos, doc


def _arguments(attn: Attention, params: dict[str, torch.Tensor], *qkv: torch.Tensor,
               **operands: torch.Tensor) -> list[torch.Tensor]:
    """The program's arguments in signature order (for the reference)."""
    named = {**params, **operands}
    return [*qkv, *(named[p.name] for p in attn.function.parameters[3:])]


def test_parameters_are_owned_and_initialised(attn: Attention) -> None:
    params = dict(attn.named_parameters())
    assert list(params) == ["wq", "wk", "slopes", "sinks"]
    assert torch.equal(params["wq"], torch.zeros(16))  # (1 + w) weights start at w = 0
    assert torch.equal(params["sinks"], torch.zeros(4))
    assert torch.equal(params["slopes"], alibi_slopes(4).float())
    assert repr(attn) == "Attention(@module, layout='bshd', operands=(pos, doc))"


def test_layouts_agree_with_the_reference(attn: Attention) -> None:
    q, k, v, pos, doc = _inputs()
    with torch.no_grad():
        attn.sinks.fill_(0.5)
        attn.wq.fill_(0.25)
    bhsd = Attention(PROGRAM)
    bhsd.load_state_dict(attn.state_dict())
    out = attn(q, k, v, pos=pos, doc=doc)
    assert out.shape == q.shape and out.is_contiguous()  # the kernels' output, stored [B, S, H, D]
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))
    assert torch.equal(out, bhsd(q_, k_, v_, pos=pos, doc=doc).transpose(1, 2))
    ref = run(attn.function.attn_ir, *_arguments(attn, dict(attn.named_parameters()), q_, k_, v_, pos=pos, doc=doc))
    assert_close(out.transpose(1, 2), ref)


def test_gradients_reach_owned_parameters(attn: Attention) -> None:
    q, k, v, pos, doc = _inputs()
    attn.zero_grad()
    attn(q, k, v, pos=pos, doc=doc).square().sum().backward()
    reference = {n: p.detach().clone().requires_grad_() for n, p in attn.named_parameters()}
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))
    run(attn.function.attn_ir, *_arguments(attn, reference, q_, k_, v_, pos=pos, doc=doc)).square().sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0
        assert_close(p.grad, reference[name].grad.float(), torch.float32)


def test_operand_errors(attn: Attention) -> None:
    q, k, v, pos, doc = _inputs()
    with pytest.raises(TypeError, match=r"missing operand 'doc' \(\[\?, \?\] torch.int32\)"):
        attn(q, k, v, pos=pos)
    with pytest.raises(TypeError, match=r"unknown operand\(s\) sinks \(it takes: pos, doc\)"):
        attn(q, k, v, pos=pos, doc=doc, sinks=torch.zeros(4))
    with pytest.raises(ValueError, match="layout must be one of bhsd, bshd, got 'sbhd'"):
        Attention(PROGRAM, layout="sbhd")


def test_dropout_in_training_only() -> None:
    attn = Attention(attnfuse.attention(2, 16, dtype="f32", name="drop").causal().dropout(0.5))
    q = torch.randn(1, 2, 9, 16)
    ref = run(attnfuse.attention(2, 16, dtype="f32").causal().build().text(), q, q, q)
    assert_close(attn.eval()(q, q, q), ref)
    attn.train()
    torch.manual_seed(1)
    first = attn(q, q, q)
    torch.manual_seed(1)
    assert torch.equal(first, attn(q, q, q))
    assert not torch.allclose(first, ref.float())
    assert torch.equal(attn(q, q, q, seed=7), attn(q, q, q, seed=7))
