"""Numerics at the edges: `+inf` sinks, and low-precision gradients of learnable vectors.

* A `+inf` sink logit outweighs every score: the output is 0, the lse `+inf`, and the
  gradients are the limits (the reference's definition, docs/dialect.md), never NaN.
* The gradients of ALiBi slopes, sinks and QK-norm weights of an f16 program are summed
  over the whole batch and sequence: lower-backward accumulates their per-program
  partials in f32 buffers, reduces them in f32 and converts once. They are compared with
  the float64 reference, with a bound relative to the error PyTorch itself makes when it
  computes the same gradient eagerly in f16 (the Triton interpreter truncates fp32 ->
  bf16, so bf16 runs only on a GPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from xdsl.dialects.builtin import Float32Type, TensorType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from programs import Builder, check
from test_gradients_blocks import PIPELINE, grad_check, run_grads

import attnfuse
from attnfuse import reference
from attnfuse.dialects.host import ConvertOp, ReduceSumOp
from attnfuse.pass_manager import PassManager, make_context

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# ============================================================================ +inf sinks


@pytest.mark.parametrize("strategy", ["fused", "separate"])
def test_infinite_sink(strategy: str) -> None:
    """Head 0's sink is +inf (out 0, lse +inf, no NaN), head 1's finite; 45 queries on 29
    keys bottom-right aligned, so the first 16 rows have no visible key either."""
    p = Builder(hq=2, hkv=1, d=32).rope().mask("causal", align="bottom_right").build(sinks=True, lse=True)
    args = p.inputs(2, 45, 29, seed=3)
    args[3] = torch.tensor([float("inf"), 0.3])
    out, lse = check(p, strategy=strategy, args=args)
    assert (out[:, 0] == 0).all() and torch.isposinf(lse[:, 0]).all()
    assert torch.isfinite(lse[:, 1, 16:]).all()
    leaves, refs = grad_check(p, strategy=strategy, args=args, lse_grad=True)
    assert (leaves[0].grad[:, 0] == 0).all()
    # d lse / d sink -> 1 as the sink grows: head 0's sink gradient is the sum of g2.
    assert float(refs[3].grad[0]) != 0.0


def test_infinite_sink_reference() -> None:
    """The reference's definition: P = 0 and lse = +inf for the head, finite elsewhere."""
    p = Builder(hq=2, hkv=1, d=32).build(sinks=True, lse=True)
    args = p.inputs(1, 5, 5)
    args[3] = torch.tensor([float("inf"), 0.0])
    out, lse = reference.run(p.text, *args)
    assert (out[:, 0] == 0).all() and torch.isposinf(lse[:, 0]).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, 1]).all()


# ============================================================================ learnable vectors in f16

VECTOR_OPERANDS = ("slopes", "sinks", "norm_weight")


def _vector_program(kind: str, dtype: str) -> tuple[str, int]:
    """(program text, argument index of the learnable vector) with the vector in `dtype`."""
    b = Builder(hq=4, hkv=2, d=32, dtype=dtype)
    if kind == "slopes":
        b.alibi(slopes=True)
    if kind == "norm_weight":
        b.qk_norm("q", weight=dtype, eps=1e-5)
    p = b.mask("causal").build(sinks=kind == "sinks")
    return p.text.replace("tensor<4xf32>", f"tensor<4x{dtype}>"), 3


def _eager(kind: str, args: list[torch.Tensor]) -> torch.Tensor:
    """The same attention written with PyTorch ops in the arguments' dtype."""
    q, k, v, vec = args
    if kind == "norm_weight":
        q = q * torch.rsqrt((q * q).mean(-1, keepdim=True) + 1e-5) * vec
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(s.shape[-2], device=s.device)[:, None]
    j = torch.arange(s.shape[-1], device=s.device)[None, :]
    if kind == "slopes":
        s = s + vec.view(1, -1, 1, 1) * (j - i).to(s.dtype)
    s = s.masked_fill(j > i, float("-inf"))
    if kind == "sinks":
        sink = vec.view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        return torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1] @ v
    return torch.softmax(s, -1) @ v


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want).abs().max() / want.abs().max())


def _check_against_torch(kind: str, dtype: str, seeds: range, strategy: str = "fused") -> None:
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    text, index = _vector_program(kind, dtype)
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(2, 4, 61, 32, generator=g)
        k, v = (torch.randn(2, 2, 61, 32, generator=g) for _ in range(2))
        vec = torch.randn(4 if kind != "norm_weight" else 32, generator=g)
        vec = 1.0 + 0.1 * vec if kind == "norm_weight" else 0.3 * vec
        args = [t.to(torch_dtype).to(DEVICE) for t in (q, k, v, vec)]
        leaves, out, _, d_out, _ = run_grads(text, args, strategy=strategy, seed=seed)
        refs = [a.detach().double().requires_grad_() for a in args]
        reference.run(text, *refs).backward(d_out.double())
        eager = [a.detach().clone().requires_grad_() for a in args]
        _eager(kind, eager).backward(d_out)
        want = refs[index].grad.cpu()
        ours, theirs = _relative(leaves[index].grad, want), _relative(eager[index].grad, want)
        unit = torch.finfo(torch_dtype).eps
        assert leaves[index].grad.dtype == torch_dtype
        assert ours <= 2 * max(theirs, unit), (
            f"d{kind} seed {seed}: relative error {ours:.2e}, PyTorch {dtype}: {theirs:.2e}"
        )


@pytest.mark.parametrize("kind", VECTOR_OPERANDS)
def test_vector_gradient_f16_vs_torch(kind: str) -> None:
    _check_against_torch(kind, "f16", range(2))


def test_norm_weight_gradient_f16_prekernel_vs_torch() -> None:
    """The weight gradient summed from the Q pre-kernel's transpose partials."""
    _check_against_torch("norm_weight", "f16", range(1), strategy="separate")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", VECTOR_OPERANDS)
def test_vector_gradient_bf16_vs_torch(kind: str) -> None:
    _check_against_torch(kind, "bf16", range(4))


@pytest.mark.parametrize("strategy", ["fused", "separate"])
@pytest.mark.parametrize("kind", VECTOR_OPERANDS)
def test_vector_gradient_partials_are_f32(kind: str, strategy: str) -> None:
    """The partial sums of a vector gradient are f32 buffers reduced in f32; the only
    conversion to the operand's dtype is the last host op."""
    text, _ = _vector_program(kind, "f16")
    module = reference.parse_program(text)
    PassManager(PIPELINE.format(strategy)).run(module, make_context())
    reduces = [op for op in module.walk() if isinstance(op, ReduceSumOp)]
    converts = [op for op in module.walk() if isinstance(op, ConvertOp)]
    assert reduces and converts
    for op in reduces:
        assert isinstance(op.operands[0].type, TensorType)
        assert isinstance(op.operands[0].type.element_type, Float32Type), op
        assert isinstance(op.results[0].type.element_type, Float32Type), op
    vector = [c for c in converts if c.operands[0].owner in reduces]
    assert vector and all(str(c.results[0].type.element_type) == "f16" for c in vector)


# ============================================================================ rotate-in-epilogue

EPILOGUE_PIPELINE = (
    "attn-canonicalize,rope-fusion{{strategy={}}},online-softmax,mask-tiling{{block-m=16 block-n=16}},"
    "lower-backward{{block-m=16 block-n=16 rotate-in-epilogue=true}},lower-to-tile"
)


@pytest.mark.parametrize(("strategy", "rope", "in_epilogue"), [
    ("hybrid", {}, True),
    ("separate", {"style": "interleaved"}, True),
    ("separate", {"style": "interleaved", "rotary_dim": 16}, False),
], ids=["hybrid-half", "separate-interleaved", "separate-interleaved16"])
def test_rotate_in_epilogue_gradients(strategy: str, rope: dict[str, object], in_epilogue: bool) -> None:
    """`lower-backward{rotate-in-epilogue=true}`: dq and dk rotated back in the dQ and
    dK/dV epilogues (no transpose kernels; the full-width gradient split into the rope's
    halves there) against the float64 reference, f32 and f16, with unequal lengths
    (partial tiles) and GQA. A partial rotary dim keeps the transpose pre-kernels."""
    from attnfuse.testing import assert_grad_close

    for dtype in ("f32", "f16"):
        p = Builder(hq=4, hkv=2, d=32, dtype=dtype).rope(**rope).mask("causal", align="bottom_right").build()
        fn = attnfuse.compile(p.text, pipeline=EPILOGUE_PIPELINE.format(strategy))
        assert ("prologue_transpose" not in fn.triton_source) == in_epilogue
        assert ("split_a" in fn.triton_source) == in_epilogue
        args = p.inputs(2, 37, 45, seed=5)
        leaves = [a.detach().clone().requires_grad_(True) for a in args]
        out = fn(*leaves)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(out.dtype)
        out.backward(g)
        refs = [a.detach().double().requires_grad_(True) for a in args]
        reference.run(p.text, *refs).backward(g.double())
        torch_dtype = {"f32": torch.float32, "f16": torch.float16}[dtype]
        for leaf, ref, name in zip(leaves, refs, "qkv"):
            assert_grad_close(leaf.grad, ref.grad, torch_dtype, f"{dtype} d{name}")


def test_rotate_in_epilogue_head_dim_16_keeps_transposes() -> None:
    """Head dim 16: each rope half (8 columns) is narrower than a tile (16), so the
    epilogue split does not apply and the transposes rotate dq / dk back."""
    from attnfuse.testing import assert_grad_close

    p = Builder(hq=2, hkv=1, d=16, dtype="f32").rope().mask("causal").build()
    fn = attnfuse.compile(p.text, pipeline=EPILOGUE_PIPELINE.format("hybrid"))
    assert "prologue_transpose" in fn.triton_source and "split_a" not in fn.triton_source
    args = p.inputs(2, 37, 37, seed=8)
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    out = fn(*leaves)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    out.backward(g)
    refs = [a.detach().double().requires_grad_(True) for a in args]
    reference.run(p.text, *refs).backward(g.double())
    for leaf, ref, name in zip(leaves, refs, "qkv"):
        assert_grad_close(leaf.grad, ref.grad, torch.float32, f"d{name}")
