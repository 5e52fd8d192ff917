"""Packed batches through the Python API: cu_seqlens are call arguments, checked on every
call with errors that name the argument; the torch.library op, autograd and
torch.compile work as for any program; programs a packed batch cannot hold are clear
compile-time errors."""

from __future__ import annotations

import pytest
import torch

import attnfuse
from attnfuse import reference
from attnfuse.program import ProgramError
from attnfuse.testing import assert_close, cu_seqlens

PROGRAM = attnfuse.attention(4, 16, kv_heads=2, dtype="f32", name="varlen_api").rope().causal().packed().build()
PIPELINE = ("attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling{block-m=16 block-n=16},"
            "lower-backward{block-m=16 block-n=16},lower-to-tile")


@pytest.fixture(scope="module")
def fn() -> attnfuse.AttentionFunction:
    return attnfuse.compile(PROGRAM, pipeline=PIPELINE)


def packed(lengths_q: list[int], lengths_k: list[int] | None = None, *, grad: bool = False) -> list[torch.Tensor]:
    lengths_k = lengths_q if lengths_k is None else lengths_k
    g = torch.Generator().manual_seed(sum(lengths_q))
    q = torch.randn(1, 4, sum(lengths_q), 16, generator=g).requires_grad_(grad)
    k, v = (torch.randn(1, 2, sum(lengths_k), 16, generator=g).requires_grad_(grad) for _ in range(2))
    return [q, k, v, cu_seqlens(lengths_q), cu_seqlens(lengths_k)]


BAD = {
    "int64": (lambda cu: cu.long(), r"argument 4 'cu_seqlens_k': expected dtype torch.int32, got torch.int64"),
    "not monotone": (lambda cu: torch.tensor([0, 9, 5, 12], dtype=torch.int32),
                     r"argument 4 'cu_seqlens_k': cu_seqlens must not decrease, got 9 then 5 \(entries 1 and 2\)"),
    "short": (lambda cu: torch.tensor([0, 4, 7, 11], dtype=torch.int32),
              r"argument 4 'cu_seqlens_k': cu_seqlens must end at the 12 key tokens \(dim 2 of k\), got 11"),
    "long": (lambda cu: torch.tensor([0, 4, 7, 13], dtype=torch.int32), r"must end at the 12 key tokens.*got 13"),
    "offset": (lambda cu: cu + 1, r"argument 4 'cu_seqlens_k': cu_seqlens must start at 0, got 1"),
    "negative": (lambda cu: torch.tensor([0, -3, 7, 12], dtype=torch.int32), r"must not decrease, got 0 then -3"),
    "sequences": (lambda cu: torch.tensor([0, 12], dtype=torch.int32),
                  r"argument 4 'cu_seqlens_k': 2 entries \(1 sequence\), but argument 3 'cu_seqlens_q' has 4 \(3 sequences\)"),
    "empty": (lambda cu: cu[:0], r"argument 4 'cu_seqlens_k': cu_seqlens needs N \+ 1 entries for N sequences"),
    "rank 2": (lambda cu: cu[None], r"argument 4 'cu_seqlens_k': expected shape \[\?\] torch.int32, got \(1, 4\)"),
    "device": (lambda cu: cu.to("meta"), r"argument 4 'cu_seqlens_k': on meta, but earlier arguments are on cpu"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_cu_seqlens_name_the_argument(fn: attnfuse.AttentionFunction, case: str) -> None:
    """Every call checks the values (a cached launch plan included), also with autograd."""
    args = packed([4, 3, 5])
    fn(*args)  # the shape class has a plan: values are still checked
    change, message = BAD[case]
    bad = [*args[:4], change(args[4])]
    with pytest.raises(attnfuse.AttnfuseArgumentError, match=message):
        fn(*bad)
    with pytest.raises(attnfuse.AttnfuseArgumentError, match=message):
        fn(*[a.clone().requires_grad_() if a.is_floating_point() else a for a in bad])


UNCHECKED_SAME_AS_VALID = {
    "end past the tokens": [0, 4, 7, 13],
    "end far past": [0, 4, 7, 10**9],
    "negative start": [-5, 4, 7, 12],
}


@pytest.mark.parametrize("case", sorted(UNCHECKED_SAME_AS_VALID))
def test_unchecked_values_are_clamped(case: str) -> None:
    """`check_segment_values = False` (as under CUDA-graph capture): the kernels clamp
    every sequence to its side's tokens, so entries past the ends give exactly the
    output (and gradients) of the clamped, valid cu_seqlens."""
    fn = attnfuse.compile(PROGRAM, pipeline=PIPELINE)
    fn.check_segment_values = False
    try:
        q, k, v, cu_q, cu_k = packed([4, 3, 5], grad=True)
        want = fn(q, k, v, cu_q, cu_k)
        want.sum().backward()
        want_grads = [t.grad.clone() for t in (q, k, v)]  # type: ignore[union-attr]
        q.grad = k.grad = v.grad = None
        bad = torch.tensor(UNCHECKED_SAME_AS_VALID[case], dtype=torch.int32)
        got = fn(q, k, v, cu_q, bad)
        got.sum().backward()
        assert torch.equal(got, want)
        for a, b in zip([q.grad, k.grad, v.grad], want_grads):
            assert torch.equal(a, b)
    finally:
        fn.check_segment_values = True


def test_unchecked_overlapping_sequences_stay_in_bounds() -> None:
    """Unchecked entries that go back and forth make overlapping sequences with more
    blocks than the schedule has slots: the schedule kernel writes only its slots, and
    forward and backward complete with finite values."""
    fn = attnfuse.compile(PROGRAM, pipeline=PIPELINE)
    fn.check_segment_values = False
    try:
        # 13 sequences, 7 of them all 64 keys: 28 key blocks of 16 for the dK/dV
        # schedule, which has (64 + 13 * 15) // 16 = 16 slots.
        n = 13
        q = torch.randn(1, 4, n, 16, requires_grad=True)
        k, v = (torch.randn(1, 2, 64, 16, requires_grad=True) for _ in range(2))
        cu_q = torch.arange(n + 1, dtype=torch.int32)
        cu_k = torch.tensor([0] + [64, 0] * (n // 2) + [64], dtype=torch.int32)
        out = fn(q, k, v, cu_q, cu_k)
        out.sum().backward()
        assert out.shape == q.shape and torch.isfinite(out).all()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))  # type: ignore[arg-type]
    finally:
        fn.check_segment_values = True


def test_segment_check_switch_needs_a_packed_program() -> None:
    plain = attnfuse.compile(attnfuse.attention(2, 16, dtype="f32", name="plain").causal().build())
    with pytest.raises(ValueError, match="not a packed program"):
        plain.check_segment_values = False


def test_query_side_named_too(fn: attnfuse.AttentionFunction) -> None:
    q, k, v, cu_q, cu_k = packed([4, 3, 5])
    with pytest.raises(attnfuse.AttnfuseArgumentError, match=r"argument 3 'cu_seqlens_q': .*12 query tokens"):
        fn(q, k, v, torch.tensor([0, 4, 7, 10], dtype=torch.int32), cu_k)


def test_gradients_direct_call_checks_too(fn: attnfuse.AttentionFunction) -> None:
    q, k, v, cu_q, cu_k = packed([4, 3, 5])
    out, lse = fn(q, k, v, cu_q, cu_k, return_lse=True)
    with pytest.raises(attnfuse.AttnfuseArgumentError, match="must start at 0"):
        fn.gradients([q, k, v, cu_q, cu_k + 1], out, lse, torch.ones_like(out))


def test_op_autograd_and_compile(fn: attnfuse.AttentionFunction) -> None:
    """The custom op takes cu_seqlens as tensors; autograd gives q, k, v gradients; a
    torch.compile graph holds the op and its backward as single nodes."""
    assert "Tensor cu_seqlens_q, Tensor cu_seqlens_k)" in str(fn.ops.forward._schema)  # noqa: SLF001
    args = packed([7, 1, 9], [2, 5, 9], grad=True)
    out, lse = fn.ops.forward(*args)[:2]  # then the rotated K the autograd formula saves
    assert (out.shape, lse.shape) == ((1, 4, 17, 16), (1, 4, 17))
    assert_close(out, reference.run(PROGRAM.source, *[a.detach().double() if a.is_floating_point() else a for a in args]))
    out.sum().backward()
    eager = [a.grad.clone() for a in args[:3]]

    def layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor) -> torch.Tensor:
        return fn(q * 1.0, k, v, cu_q, cu_k).sum()

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    again = [a.detach().clone().requires_grad_() if a.is_floating_point() else a for a in args]
    compiled(*again).backward()
    for grad, leaf in zip(eager, again):
        torch.testing.assert_close(leaf.grad, grad, rtol=0, atol=0)


UNSUPPORTED = {
    "positions": (attnfuse.attention(2, 16, dtype="f32").rope(positions=True).packed(),
                  "attn.rope positions: in a packed batch positions restart at 0"),
    "document": (attnfuse.attention(2, 16, dtype="f32").document().packed(),
                 "attn.mask document with an operand indexes a padded"),
    "dropout": (attnfuse.attention(2, 16, dtype="f32").dropout(0.1).packed(), "attn.dropout is not supported"),
    "bias": (attnfuse.attention(2, 16, dtype="f32").bias().packed(), "attn.bias tensor indexes a padded"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_in_packed_batch(case: str) -> None:
    builder, message = UNSUPPORTED[case]
    with pytest.raises(ProgramError, match=message):
        attnfuse.compile(builder.build())


def test_one_argument_cannot_have_two_packings() -> None:
    """q read as keys too, with other cu_seqlens than the queries: rejected (k and v may
    share an argument)."""
    text = """func.func @f(%q: tensor<1x2x?x16xf32>, %v: tensor<1x2x?x16xf32>, %cq: tensor<?xi32>, %ck: tensor<?xi32>) -> tensor<1x2x?x16xf32> {
  %s = attn.scores %q, %q cu_seqlens_q %cq cu_seqlens_k %ck : tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x2x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x2x?x?xf32>, tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  func.return %o : tensor<1x2x?x16xf32>
}"""
    with pytest.raises(ProgramError, match="q and k / v read one argument but different cu_seqlens"):
        attnfuse.compile(text)
    shared = text.replace("cu_seqlens_k %ck", "cu_seqlens_k %cq")
    fn = attnfuse.compile(shared, pipeline=PIPELINE.replace("lower-backward{block-m=16 block-n=16},", ""))
    q, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    cu = cu_seqlens([4, 5])
    assert_close(fn(q, v, cu, cu), reference.run(shared, q, v, cu, cu))
