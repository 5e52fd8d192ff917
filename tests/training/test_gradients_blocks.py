"""The derivative of every building block: compiled backward vs torch autograd through
the float64 reference.

Programs come from `tests/lowering/programs.py` (`Builder`; read-only, shared with the
forward tests) and are compiled with `lower-backward` (block-m = block-n = 16, so 37 rows
make three q blocks, the last one partial). Each test draws fresh random inputs (never
zeros) and a random upstream gradient `g` (and `g2` for the lse where the program returns
it), runs `loss.backward()` through `attnfuse`'s autograd.Function, runs the same loss
through `attnfuse.reference.run` in float64, and compares the gradient of q, k, v and of
every learnable operand with `attnfuse.testing.assert_grad_close`. Shapes stay small
(B=2, Hq=2/Hkv=1 unless heads are the point, D=32) because every kernel runs through the
Triton interpreter.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from xdsl.utils.exceptions import DiagnosticException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from programs import Builder, Program

import attnfuse
from attnfuse import reference
from attnfuse.testing import GRAD_TOLERANCE, assert_close, assert_grad_close

STRATEGIES = ("fused", "hybrid", "separate")
PIPELINE = (
    "attn-canonicalize,rope-fusion{{strategy={}}},online-softmax,mask-tiling{{block-m=16 block-n=16}},"
    "lower-backward{{block-m=16 block-n=16 transforms-in-kernel=true}},lower-to-tile"
)

_COMPILED: dict[tuple[str, str], attnfuse.api.AttentionFunction] = {}


@pytest.fixture(scope="module", autouse=True)
def _fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Compile into an empty disk cache, so every program here is lowered by the
    passes (a cache miss); the cache-hit path has its own test in
    test_backward_structure.py."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("attnfuse_cache")))
        yield


def compile_training(
    text: str, strategy: str = "fused"
) -> attnfuse.api.AttentionFunction:
    """attnfuse.compile with lower-backward, memoised per process."""
    key = (text, strategy)
    if key not in _COMPILED:
        _COMPILED[key] = attnfuse.compile(text, pipeline=PIPELINE.format(strategy))
    return _COMPILED[key]


def small(**kw: Any) -> Builder:
    """The default builder of this file: Hq=2, Hkv=1 (two query heads per KV head), D=32."""
    kw.setdefault("hq", 2)
    kw.setdefault("hkv", 1)
    kw.setdefault("d", 32)
    return Builder(**kw)


def _is_float(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


def _coarsest(*dtypes: torch.dtype) -> torch.dtype:
    return max(dtypes, key=lambda d: GRAD_TOLERANCE[d])


def run_grads(
    text: str,
    args: Sequence[Any],
    *,
    strategy: str = "fused",
    seed: int = 0,
    no_grad: Sequence[int] = (),
    return_lse: bool = False,
    lse_grad: bool = False,
) -> tuple[list[Any], Any, Any, torch.Tensor, torch.Tensor | None]:
    """The kernel side: (leaves with .grad, out, lse, g, g2) after backward of
    (out * g).sum() [+ (lse * g2).sum()], g and g2 random."""
    fn = compile_training(text, strategy)
    leaves = [
        a.detach().clone().requires_grad_(i not in no_grad) if _is_float(a) else a
        for i, a in enumerate(args)
    ]
    result = fn(*leaves, return_lse=return_lse)
    out, lse = result if isinstance(result, tuple) else (result, None)
    gen = torch.Generator().manual_seed(seed + 1234)
    g = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    g2 = None
    if lse_grad:
        assert lse is not None
        g2 = torch.randn(lse.shape, generator=gen).to(lse.device)
        torch.autograd.backward([out, lse], [g, g2])
    else:
        out.backward(g)
    return leaves, out, lse, g, g2


def grad_check(
    program: Program | str,
    *,
    strategy: str = "fused",
    batch: int = 2,
    q_len: int = 37,
    kv_len: int | None = None,
    seed: int = 0,
    args: Sequence[Any] | None = None,
    no_grad: Sequence[int] = (),
    lse_grad: bool = False,
    reference_text: str | None = None,
    names: Sequence[str] | None = None,
) -> tuple[list[Any], list[Any]]:
    """Compile with lower-backward, backprop a random upstream gradient through the
    kernels and through the float64 reference, compare every float operand's gradient.

    `lse_grad`: the loss also has `(lse * g2).sum()` (the kernel is called with
    `return_lse=True`; the reference must return the lse: a program built with
    `lse=True`, or `reference_text`). Returns (kernel leaves, reference leaves).
    """
    text = program.text if isinstance(program, Program) else program
    if names is None:
        names = (
            [a.name for a in program.args]
            if isinstance(program, Program)
            else [f"arg{i}" for i in range(len(args or []))]
        )
    kv_len = q_len if kv_len is None else kv_len
    if args is None:
        assert isinstance(program, Program)
        args = program.inputs(batch, q_len, kv_len, seed)
    dtype = args[0].dtype
    leaves, out, _, g, g2 = run_grads(
        text,
        args,
        strategy=strategy,
        seed=seed,
        no_grad=no_grad,
        return_lse=lse_grad,
        lse_grad=lse_grad,
    )
    assert out.dtype == dtype
    refs = [
        a.detach().double().requires_grad_(i not in no_grad) if _is_float(a) else a
        for i, a in enumerate(args)
    ]
    want = reference.run(reference_text or text, *refs)
    if lse_grad:
        assert isinstance(want, tuple) and g2 is not None, (
            "the reference must return the lse"
        )
        torch.autograd.backward([want[0], want[1]], [g.double(), g2.double()])
    else:
        want_out = want[0] if isinstance(want, tuple) else want
        want_out.backward(g.double())
    checked = 0
    for i, (leaf, ref) in enumerate(zip(leaves, refs)):
        if not _is_float(leaf) or i in no_grad:
            continue
        assert ref.grad is not None, f"reference has no gradient for {names[i]}"
        assert leaf.grad is not None, f"no gradient for {names[i]}"
        assert leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape, names[i]
        assert_grad_close(
            leaf.grad, ref.grad, _coarsest(dtype, leaf.dtype), f"d{names[i]}"
        )
        checked += 1
    assert checked >= 3
    return leaves, refs


# ============================================================================ RoPE

ROPE_VARIANTS: dict[str, dict[str, Any]] = {
    "half": {"theta": 10000.0},
    "interleaved": {"style": "interleaved"},
    "partial_half": {"rotary_dim": 16},
    "partial_interleaved": {"style": "interleaved", "rotary_dim": 8},
    "llama3": {
        "theta": 500000.0,
        "scaling": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position": 8192,
    },
    "yarn": {
        "theta": 150000.0,
        "scaling": "yarn",
        "factor": 32.0,
        "original_max_position": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": 0,
    },
}


@pytest.mark.parametrize("variant", list(ROPE_VARIANTS))
def test_rope(variant: str) -> None:
    grad_check(small().rope(**ROPE_VARIANTS[variant]).mask("causal").build())


@pytest.mark.parametrize(
    "variant,strategy",
    [("yarn", "hybrid"), ("partial_interleaved", "separate"), ("llama3", "separate")],
)
def test_rope_prekernel(variant: str, strategy: str) -> None:
    """Rotation recomputed in pre-kernels, gradients inverse-rotated by the transposes."""
    grad_check(
        small().rope(**ROPE_VARIANTS[variant]).mask("causal").build(), strategy=strategy
    )


@pytest.mark.parametrize("rank,strategy", [(1, "fused"), (2, "separate")])
def test_rope_positions_operand(rank: int, strategy: str) -> None:
    b = small()
    pos = b.positions(rank)
    grad_check(
        b.rope(positions=pos, theta=10000.0).mask("causal").build(), strategy=strategy
    )


def test_rope_separate_positions_sq_ne_skv() -> None:
    """Q and K with their own position ids ([B, Sq] i64 and [Skv] i32), 29 vs 45."""
    b = small()
    qpos = b.positions(2, name="qpos", seq="q", dtype="i64")
    kpos = b.positions(1, name="kpos", seq="kv")
    b.rope("q", positions=qpos, style="interleaved").rope(
        "k", positions=kpos, style="interleaved"
    )
    grad_check(b.mask("causal", align="bottom_right").build(), q_len=29, kv_len=45)


@pytest.mark.parametrize("side", ["q", "k"])
def test_rope_one_side(side: str) -> None:
    grad_check(small().rope(side, rotary_dim=24).mask("causal").build())


@pytest.mark.parametrize("strategy", ["hybrid", "separate"])
def test_rope_layouts_differ(strategy: str) -> None:
    """Q interleaved, K half: pre-kernels handle it (fused: tests/training/test_rope_mismatch.py)."""
    grad_check(
        small().rope("q", style="interleaved").rope("k").mask("causal").build(),
        strategy=strategy,
    )


def test_two_ropes_on_one_side() -> None:
    """Two rotations in a row (same layout): the transpose walks both back."""
    grad_check(small().rope(theta=100.0).rope(theta=500.0).mask("causal").build())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ropes_on_one_side_layouts_differ(strategy: str) -> None:
    """Two ropes of different rotary_dim on one side: refused clearly (no wrong gradient)."""
    p = small().rope(rotary_dim=16).rope(theta=500.0).mask("causal").build()
    with pytest.raises(
        DiagnosticException, match="two attn.rope on one side must share"
    ):
        compile_training(p.text, strategy)


def test_strategies_agree() -> None:
    """fused, hybrid and separate give the same gradients (to f32 rounding) on a
    Qwen3-like program with weights, and each matches the reference."""
    b = small()
    pos = b.positions(2)
    p = (
        b.qk_norm(weight="f32", eps=1e-6)
        .rope(positions=pos, theta=1e6, rotary_dim=24)
        .mask("causal")
        .build()
    )
    args = p.inputs(2, 37, 37, seed=5)
    grads = {}
    for strategy in STRATEGIES:
        leaves, _ = grad_check(p, strategy=strategy, args=args, seed=5)
        grads[strategy] = [leaf.grad for leaf in leaves if _is_float(leaf)]
    for strategy in ("hybrid", "separate"):
        for got, want in zip(grads[strategy], grads["fused"]):
            scale = float(want.abs().max())
            assert float((got - want).abs().max()) <= 2e-5 * scale, strategy


# ============================================================================ QK-norm

QK_NORM_VARIANTS: dict[str, dict[str, Any]] = {
    "no_weight": {},
    "weight_f32": {"weight": "f32", "eps": 1e-6},
    "weight_offset": {"weight": "f32", "eps": 1e-5, "weight_offset": 1.0},
    "weight_bf16": {"weight": "bf16"},
}


@pytest.mark.parametrize("variant", list(QK_NORM_VARIANTS))
def test_qk_norm(variant: str) -> None:
    grad_check(small().qk_norm(**QK_NORM_VARIANTS[variant]).mask("causal").build())


@pytest.mark.parametrize("strategy", ["hybrid", "separate"])
def test_qk_norm_weight_prekernel(strategy: str) -> None:
    """Weight gradients summed from the transpose pre-kernels' partials."""
    p = small().qk_norm(weight="f32", weight_offset=1.0).rope().mask("causal").build()
    grad_check(p, strategy=strategy)


def test_rope_then_qk_norm_q_only() -> None:
    p = (
        small()
        .rope(style="interleaved", rotary_dim=16)
        .qk_norm("q", weight="f32")
        .build()
    )
    grad_check(p)


def test_qk_norm_weight_gqa() -> None:
    """K's weight gradient sums over every KV block and both KV heads of a GQA group."""
    grad_check(
        Builder(hq=4, hkv=2, d=32).qk_norm(weight="f32").mask("causal").build(),
        q_len=29,
        kv_len=45,
    )


# ============================================================================ scores, heads, dims


def test_scale() -> None:
    grad_check(small().scores(scale=0.3).mask("causal").build())


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1)])
def test_heads(hq: int, hkv: int) -> None:
    """GQA and MQA: dK/dV sum over every query head of the group."""
    grad_check(Builder(hq=hq, hkv=hkv, d=32).rope().mask("causal").build())


@pytest.mark.parametrize("strategy", ["fused", "separate"])
def test_static_batch_and_seq_dims(strategy: str) -> None:
    """Batch and sequence lengths fixed by the types: buffers of static dims take no sizes."""
    program = small().rope().mask("causal").build()
    text = re.sub(r"tensor<\?x(\d+)x\?x", r"tensor<2x\1x37x", program.text)
    text = re.sub(r"(scores|probs)<\?x(\d+)x\?x\?x", r"\1<2x\2x37x37x", text)
    assert "?" not in text
    grad_check(text, strategy=strategy, args=program.inputs(2, 37, 37))


def test_v_heads_differ_rejected() -> None:
    """K and V with different head counts: the backward refuses with a clear error."""
    p = Builder(hq=4, hkv=2, hv=1, d=32).mask("causal").build()
    with pytest.raises(DiagnosticException, match="same number of heads"):
        compile_training(p.text)


@pytest.mark.parametrize("d", [64, 80, 128])
def test_head_dim(d: int) -> None:
    grad_check(small(d=d).rope().mask("causal").build(), q_len=29)


@pytest.mark.parametrize("d,dv,rope", [(32, 16, False), (32, 80, True), (64, 32, True)])
def test_v_head_dim(d: int, dv: int, rope: bool) -> None:
    b = small(d=d, dv=dv)
    if rope:
        b.rope()
    grad_check(b.mask("causal").build())


# ============================================================================ bias


def test_alibi_default_slopes() -> None:
    grad_check(Builder(hq=4, hkv=2, d=32).alibi().mask("causal").build())


def test_alibi_slopes_operand() -> None:
    """Slopes given as an operand get a gradient: sum of dS * (kv - q)."""
    p = (
        Builder(hq=4, hkv=2, d=32)
        .alibi(slopes=True)
        .mask("causal", align="bottom_right")
        .build()
    )
    leaves, _ = grad_check(p, q_len=29, kv_len=45)
    assert leaves[3].grad.shape == (4,)


def test_alibi_slopes_operand_no_mask() -> None:
    grad_check(small().alibi(slopes=True).build(), q_len=29, kv_len=45)


@pytest.mark.parametrize(
    "shape",
    [
        ("?", 2, "?", "?"),
        (1, 2, "?", "?"),
        ("?", 1, "?", "?"),
        (1, 1, "?", "?"),
        ("?", 1, 1, "?"),
        (1, 2, "?", 1),
    ],
    ids=lambda s: "x".join(str(d) for d in s),
)
def test_bias_tensor(shape: tuple[Any, ...]) -> None:
    """Full and broadcast bias tensors: the gradient is summed over broadcast dims."""
    p = small().bias(shape).mask("causal", align="bottom_right").build()
    if shape[3] == 1:
        # The same bias on every key of a row shifts the row: softmax is invariant, the
        # exact gradient is 0 (a relative comparison with the reference's 1e-16 noise
        # would be meaningless), so check it is 0 to f32 rounding.
        leaves, _ = grad_check(p, q_len=29, kv_len=45, no_grad=(3,))
        leaves, *_ = run_grads(p.text, p.inputs(2, 29, 45))
        assert float(leaves[3].grad.abs().max()) < 1e-5
    else:
        leaves, _ = grad_check(p, q_len=29, kv_len=45)
    assert leaves[3].grad.shape == leaves[3].shape


def test_bias_tensor_bf16() -> None:
    """A bf16 program with a [1, H, S, S] bf16 bias."""
    grad_check(
        small(dtype="bf16").bias((1, 2, "?", "?"), dtype="bf16").mask("causal").build()
    )


def test_bias_additive_minus_inf() -> None:
    """An additive mask: -inf bias entries (one row all -inf): no NaN, zero gradients there."""
    p = small().bias(("?", 1, "?", "?")).build()
    args = p.inputs(2, 37, 37)
    masked = torch.rand(2, 1, 37, 37, generator=torch.Generator().manual_seed(1)) < 0.5
    masked[:, :, 5] = True
    args[3] = args[3].masked_fill(masked, float("-inf"))
    leaves, _ = grad_check(p, args=args)
    assert (leaves[3].grad[masked] == 0).all()
    assert (leaves[0].grad[:, :, 5] == 0).all()


# ============================================================================ softcap


def test_softcap() -> None:
    grad_check(small().scores(scale=1.0).softcap(5.0).build())


def test_softcap_then_masks() -> None:
    """Gemma 2's order: cap, then causal + window."""
    grad_check(
        small()
        .rope()
        .softcap(20.0)
        .mask("causal")
        .mask("sliding_window", left=20)
        .build()
    )


# ============================================================================ masks


@pytest.mark.parametrize(
    "align,sq,skv",
    [
        ("top_left", 37, 37),
        ("top_left", 29, 45),
        ("bottom_right", 29, 45),
        ("bottom_right", 45, 29),
    ],
)
def test_causal(align: str, sq: int, skv: int) -> None:
    grad_check(small().mask("causal", align=align).build(), q_len=sq, kv_len=skv)


@pytest.mark.parametrize(
    "window,align,sq,skv",
    [
        ({"left": 5}, "top_left", 37, 37),
        ({"right": 7}, "top_left", 37, 37),
        ({"left": 5, "right": 3}, "bottom_right", 29, 45),
        ({"left": 6, "right": 2}, "top_left", 45, 29),
        ({"left": 0, "right": 0}, "bottom_right", 45, 29),
    ],
    ids=["left", "right", "both_br", "both_tl_ne", "diagonal_br"],
)
def test_sliding_window(window: dict[str, int], align: str, sq: int, skv: int) -> None:
    grad_check(
        small().mask("sliding_window", align=align, **window).build(),
        q_len=sq,
        kv_len=skv,
    )


def test_causal_then_window_merged() -> None:
    grad_check(
        small().mask("causal").mask("sliding_window", left=20).build(),
        q_len=45,
        kv_len=45,
    )


def test_document_one_operand() -> None:
    """Document ids: the runtime block map path of the backward (its own map kernel)."""
    b = small()
    ids = b.doc_ids(docs=3)
    p = b.mask("causal").mask("document", ids).build()
    assert "block_map" in compile_training(p.text).triton_source
    grad_check(p)


def test_document_two_operands() -> None:
    """Own q/kv ids (29 vs 45): query docs absent from the keys are fully masked rows."""
    b = small()
    qids = b.doc_ids("qdoc", seq="q", docs=4)
    kids = b.doc_ids("kdoc", seq="kv", docs=2, dtype="i64")
    leaves, _ = grad_check(b.mask("document", qids, kids).build(), q_len=29, kv_len=45)
    for leaf in leaves[:3]:
        assert torch.isfinite(leaf.grad).all()


@pytest.mark.parametrize("prefix", [20])
def test_prefix_lm_static(prefix: int) -> None:
    grad_check(small().mask("prefix_lm", prefix=prefix).build())


@pytest.mark.parametrize("sq,skv", [(37, 37), (29, 45)])
def test_prefix_lm_operand(sq: int, skv: int) -> None:
    b = small()
    plen = b.prefix_lengths()
    grad_check(b.mask("prefix_lm", plen).build(), q_len=sq, kv_len=skv)


CUSTOM_MASKS: dict[str, str] = {
    # kv <= q and q - kv <= 5: an affine band of both sides
    "affine_band": """
        %d$ = arith.subi %q$, %kv$ : index
        %c5$ = arith.constant 5 : index
        %a$ = arith.cmpi sle, %d$, %c5$ : index
        %b2$ = arith.cmpi sge, %q$, %kv$ : index
        %keep$ = arith.andi %a$, %b2$ : i1
        attn.yield %keep$ : i1
    """,
    # non-affine: every third key, plus the diagonal
    "modulo": """
        %c3$ = arith.constant 3 : index
        %c0$ = arith.constant 0 : index
        %r$ = arith.remsi %kv$, %c3$ : index
        %a$ = arith.cmpi eq, %r$, %c0$ : index
        %d$ = arith.cmpi eq, %kv$, %q$ : index
        %keep$ = arith.ori %a$, %d$ : i1
        attn.yield %keep$ : i1
    """,
    # non-affine: the window depends on the head
    "uses_head": """
        %w$ = arith.addi %q$, %h$ : index
        %keep$ = arith.cmpi sle, %kv$, %w$ : index
        attn.yield %keep$ : i1
    """,
}


@pytest.mark.parametrize("name", list(CUSTOM_MASKS))
def test_custom_mask(name: str) -> None:
    grad_check(small().custom_mask(CUSTOM_MASKS[name]).build(), q_len=29, kv_len=45)


def test_custom_mask_captured_table() -> None:
    """A per-head key limit from a captured i32 table (no gradient: integers)."""
    b = small()
    lim = b.table("lim", 2, "i32")
    body = """
        %n$ = tensor.extract %c0$[%h$] : tensor<2xi32>
        %ni$ = arith.index_cast %n$ : i32 to index
        %keep$ = arith.cmpi slt, %kv$, %ni$ : index
        attn.yield %keep$ : i1
    """
    grad_check(b.custom_mask(body, lim).mask("causal").build())


# ============================================================================ fully masked rows


def _assert_empty_rows_zero(leaves: list[Any], rows: torch.Tensor) -> None:
    """No NaN anywhere; dq is zero on empty rows [B, Hq, Sq]."""
    for leaf in leaves:
        if _is_float(leaf) and leaf.grad is not None:
            assert torch.isfinite(leaf.grad).all()
    assert rows.any(), "the test needs fully masked rows"
    assert (leaves[0].grad[rows] == 0).all()


def test_empty_rows_custom() -> None:
    """Queries before 20 see no key at all (whole q blocks masked)."""
    body = """
        %c20$ = arith.constant 20 : index
        %keep$ = arith.cmpi sge, %q$, %c20$ : index
        attn.yield %keep$ : i1
    """
    b = small()
    plen = b.prefix_lengths()
    p = b.mask("prefix_lm", plen).custom_mask(body).build()
    leaves, _ = grad_check(p)
    rows = torch.zeros(2, 2, 37, dtype=torch.bool)
    rows[:, :, :20] = True
    _assert_empty_rows_zero(leaves, rows)


@pytest.mark.parametrize("sinks", [False, True], ids=["no_sinks", "sinks"])
def test_empty_rows_causal_bottom_right(sinks: bool) -> None:
    """45 queries, 29 keys, bottom-right causal: the first 16 rows see no key."""
    p = small().rope().mask("causal", align="bottom_right").build(sinks=sinks)
    leaves, _ = grad_check(p, q_len=45, kv_len=29)
    rows = torch.zeros(2, 2, 45, dtype=torch.bool)
    rows[:, :, :16] = True
    _assert_empty_rows_zero(leaves, rows)


# ============================================================================ score_mod

SCORE_MODS: dict[str, str] = {
    # x * tanh(x) / t  (t: a captured f32 scalar)
    "tanh_mul_div": """
        %t$ = math.tanh %x$ : f32
        %m$ = arith.mulf %x$, %t$ : f32
        %y$ = arith.divf %m$, %c0$ : f32
        attn.yield %y$ : f32
    """,
    # max(x, tanh(x)) - exp(x) * t
    "max_exp": """
        %t$ = math.tanh %x$ : f32
        %m$ = arith.maximumf %x$, %t$ : f32
        %e$ = math.exp %x$ : f32
        %w$ = arith.mulf %e$, %c0$ : f32
        %y$ = arith.subf %m$, %w$ : f32
        attn.yield %y$ : f32
    """,
    # select(x > tanh(x) * t, x, exp(x)), then negate twice, through min
    "select_min": """
        %t$ = math.tanh %x$ : f32
        %u$ = arith.mulf %t$, %c0$ : f32
        %pos$ = arith.cmpf ogt, %x$, %u$ : f32
        %e$ = math.exp %x$ : f32
        %s$ = arith.select %pos$, %x$, %e$ : f32
        %n$ = arith.negf %s$ : f32
        %mn$ = arith.minimumf %n$, %u$ : f32
        %y$ = arith.negf %mn$ : f32
        attn.yield %y$ : f32
    """,
    # select by the position (kv <= q): x / t there, tanh(x) elsewhere
    "select_on_index": """
        %c$ = arith.cmpi sle, %kv$, %q$ : index
        %a$ = arith.divf %x$, %c0$ : f32
        %t$ = math.tanh %x$ : f32
        %y$ = arith.select %c$, %a$, %t$ : f32
        attn.yield %y$ : f32
    """,
}


@pytest.mark.parametrize("name", list(SCORE_MODS))
def test_score_mod(name: str) -> None:
    """Region derivatives: tanh, exp, mul, div, sub, max, min, neg, select (no constants)."""
    b = small()
    temp = b.arg("temp", "f32", lambda g, bb, sq, skv: 0.7)
    grad_check(b.score_mod(SCORE_MODS[name], temp).mask("causal").build())


CONSTANT_SCORE_MODS: dict[str, tuple[str, bool]] = {
    # a hand-written soft-cap: constants in the region
    "constant_softcap": (
        """
        %c$ = arith.constant 3.0 : f32
        %y$ = arith.divf %x$, %c$ : f32
        %t$ = math.tanh %y$ : f32
        %z$ = arith.mulf %t$, %c$ : f32
        attn.yield %z$ : f32
    """,
        False,
    ),
    # a distance term: sitofp of an index difference
    "sitofp_distance": (
        """
        %d$ = arith.subi %kv$, %q$ : index
        %di$ = arith.index_cast %d$ : index to i32
        %df$ = arith.sitofp %di$ : i32 to f32
        %e$ = arith.mulf %df$, %c0$ : f32
        %r$ = arith.addf %x$, %e$ : f32
        attn.yield %r$ : f32
    """,
        False,
    ),
    # a per-head scale read from a captured f32 table
    "table_scale": (
        """
        %w$ = tensor.extract %c1$[%h$] : tensor<2xf32>
        %y$ = arith.mulf %x$, %w$ : f32
        attn.yield %y$ : f32
    """,
        True,
    ),
}


@pytest.mark.parametrize("name", list(CONSTANT_SCORE_MODS))
def test_score_mod_constants_and_tables(name: str) -> None:
    """Constants, integer-derived floats and table entries carry no gradient, and must
    not stop the derivative of the score."""
    body, table = CONSTANT_SCORE_MODS[name]
    b = small()
    temp = b.arg("temp", "f32", lambda g, bb, sq, skv: 0.05)
    caps = [temp]
    if table:
        caps.append(b.table("tab", 2))
    p = b.score_mod(body, *caps).mask("causal").build()
    grad_check(p, no_grad=(4,) if table else ())


def test_score_mod_captured_table_has_no_gradient() -> None:
    """Asking for the gradient of a captured table is a clear RuntimeError; without it
    requires_grad, q, k, v still get theirs."""
    b = small()
    tab = b.table("tab", 2)
    body = """
        %w$ = tensor.extract %c0$[%h$] : tensor<2xf32>
        %y$ = arith.addf %x$, %w$ : f32
        attn.yield %y$ : f32
    """
    p = b.score_mod(body, tab).mask("causal").build()
    args = p.inputs(2, 37, 37)
    with pytest.raises(
        RuntimeError, match=r"argument 3 'tab' requires grad.*no gradient"
    ):
        run_grads(p.text, args)
    grad_check(p, args=args, no_grad=(3,))


@pytest.mark.parametrize(
    "table",
    [False, True],
    ids=["constant", "table"],
)
def test_score_mod_default_compile(table: bool) -> None:
    """score_mods with a constant, or reading a float table, compile with the default
    pipeline (which includes lower-backward): forward-only users must not be blocked."""
    b = small()
    caps = [b.table("tab", 2)] if table else []
    read = (
        "%c$ = tensor.extract %c0$[%h$] : tensor<2xf32>"
        if table
        else "%c$ = arith.constant 2.0 : f32"
    )
    p = b.score_mod(
        f"""
        {read}
        %y$ = arith.mulf %x$, %c$ : f32
        attn.yield %y$ : f32
    """,
        *caps,
    ).build()
    attnfuse.compile(p.text)


def test_score_mod_without_tile_lowering_is_a_clear_error() -> None:
    """math.atan (a valid math op with no tile lowering): a compile error naming the op."""
    b = small()
    p = b.score_mod("""
        %y$ = math.atan %x$ : f32
        attn.yield %y$ : f32
    """).build()
    with pytest.raises(DiagnosticException, match=r"math\.atan"):
        compile_training(p.text)


def test_score_mod_powf() -> None:
    """math.powf lowers in the forward and is differentiated in the backward: it must
    compile with lower-backward (an error naming the op is a failure) and the output and
    gradients must match the reference."""
    b = small()
    temp = b.arg("temp", "f32", lambda g, bb, sq, skv: 2.0)
    p = b.score_mod(
        """
        %a$ = math.absf %x$ : f32
        %y$ = math.powf %a$, %c0$ : f32
        attn.yield %y$ : f32
    """,
        temp,
    ).build()
    args = p.inputs(2, 37, 37)
    out = compile_training(p.text)(*args)
    assert_close(out, reference.run(p.text, *args))
    grad_check(p, args=args)


@pytest.mark.parametrize("exponent", [2.0, 3.0])
def test_score_mod_powf_negative_base(exponent: float) -> None:
    """`s ** n` of scores that are often negative: powf's real meaning (sign for odd
    integer exponents), not exp2(y log2 x), which is NaN for every negative base."""
    b = small()
    power = b.arg("power", "f32", lambda g, bb, sq, skv: exponent)
    p = b.score_mod(
        """
        %y$ = math.powf %x$, %c0$ : f32
        attn.yield %y$ : f32
    """,
        power,
    ).build()
    args = p.inputs(2, 29, 37)
    out = compile_training(p.text)(*args)
    want = reference.run(p.text, *args)
    assert torch.isfinite(out).all()
    assert_close(out, want)
    grad_check(p, args=args)


def test_score_mod_floor_ceil_erf_floordiv() -> None:
    """Every documented region op lowers: erf (differentiated), floor and ceil
    (piecewise constant), floordivsi on negative index differences (rounds down, not
    toward zero) against the reference, forward and gradients."""
    b = small()
    temp = b.arg("temp", "f32", lambda g, bb, sq, skv: 0.05)
    p = b.score_mod(
        """
        %e$ = math.erf %x$ : f32
        %f$ = math.floor %x$ : f32
        %c$ = math.ceil %x$ : f32
        %d$ = arith.subi %kv$, %q$ : index
        %three$ = arith.constant 3 : index
        %fd$ = arith.floordivsi %d$, %three$ : index
        %fi$ = arith.index_cast %fd$ : index to i32
        %ff$ = arith.sitofp %fi$ : i32 to f32
        %t$ = arith.mulf %ff$, %c0$ : f32
        %s1$ = arith.addf %e$, %f$ : f32
        %s2$ = arith.addf %s1$, %c$ : f32
        %r$ = arith.addf %s2$, %t$ : f32
        attn.yield %r$ : f32
    """,
        temp,
    ).build()
    args = p.inputs(2, 29, 37)
    out = compile_training(p.text)(*args)
    assert_close(out, reference.run(p.text, *args))
    grad_check(p, args=args)


# ============================================================================ softmax: sinks, lse, dropout


@pytest.mark.parametrize("strategy", ["fused", "hybrid"])
def test_sinks(strategy: str) -> None:
    """Sink logits get a gradient: -sum over rows of exp(sink - lse) * delta."""
    p = (
        Builder(hq=4, hkv=2, d=32)
        .rope()
        .mask("causal")
        .mask("sliding_window", left=8)
        .build(sinks=True)
    )
    leaves, _ = grad_check(p, strategy=strategy)
    assert leaves[3].grad.shape == (4,)


def test_program_returns_lse() -> None:
    """A program returning (out, lse); the loss is (out * g).sum() + (lse * g2).sum()."""
    p = small().rope().alibi(slopes=True).mask("causal").build(lse=True, sinks=True)
    grad_check(p, lse_grad=True)


def test_return_lse_flag_with_lse_gradient() -> None:
    """`fn(..., return_lse=True)` on a program without lse: the lse is differentiable too."""

    def build(lse: bool) -> Program:
        return (
            small()
            .qk_norm(weight="f32")
            .mask("causal", align="bottom_right")
            .build(lse=lse, sinks=True)
        )

    p, with_lse = build(False), build(True)
    grad_check(p, lse_grad=True, reference_text=with_lse.text, q_len=45, kv_len=29)


def test_lse_gradient_only() -> None:
    """Only the lse is used by the loss (d_out = 0)."""
    p = small().mask("causal").build(lse=True)
    args = p.inputs(2, 37, 37)
    fn = compile_training(p.text)
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    _, lse = fn(*leaves)
    g2 = torch.randn(lse.shape, generator=torch.Generator().manual_seed(9))
    (lse * g2).sum().backward()
    refs = [a.detach().double().requires_grad_(True) for a in args]
    _, want = reference.run(p.text, *refs)
    (want * g2.double()).sum().backward()
    for leaf, ref, name in zip(leaves[:2], refs, "qk"):
        assert_grad_close(leaf.grad, ref.grad, torch.float32, f"d{name}")
    assert refs[2].grad is None  # the lse does not depend on v
    assert leaves[2].grad is not None and (leaves[2].grad == 0).all()


@pytest.mark.parametrize("hq,hkv", [(4, 2)])
def test_dropout(hq: int, hkv: int) -> None:
    """The keep mask is regenerated from the seed: same Philox stream as the reference."""
    p = Builder(hq=hq, hkv=hkv, d=32).mask("causal").build(dropout=0.2)
    grad_check(p)


def test_dropout_document_rope() -> None:
    b = small()
    pos = b.positions(2)
    ids = b.doc_ids()
    grad_check(
        b.rope(positions=pos).mask("causal").mask("document", ids).build(dropout=0.1)
    )


# ============================================================================ low precision


def test_bf16_llama_like() -> None:
    grad_check(
        Builder(hq=4, hkv=2, d=64, dtype="bf16")
        .rope(theta=500000.0)
        .mask("causal")
        .build()
    )


def test_f16_alibi_softcap_window() -> None:
    p = (
        small(dtype="f16")
        .alibi()
        .softcap(30.0)
        .mask("sliding_window", left=10, right=0)
        .build()
    )
    grad_check(p, q_len=29, kv_len=45)


def test_bf16_qk_norm_sinks_hybrid() -> None:
    p = (
        small(dtype="bf16")
        .qk_norm(weight="bf16")
        .rope()
        .mask("causal")
        .build(sinks=True)
    )
    grad_check(p, strategy="hybrid")


# ============================================================================ API


def test_gradients_method_matches_autograd() -> None:
    """fn.gradients(...) (the compiled backward, called directly) equals what
    loss.backward() accumulates; q, k, v not requiring grad get none."""
    p = small().alibi(slopes=True).mask("causal").build(sinks=True)
    args = p.inputs(2, 37, 37)
    fn = compile_training(p.text)
    leaves, out, _, g, _ = run_grads(p.text, args)
    plain_out, lse = fn(*args, return_lse=True)
    assert torch.equal(plain_out, out)
    grads = fn.gradients(args, plain_out, lse, g)
    for leaf, grad in zip(leaves, grads):
        assert grad is not None and torch.equal(grad, leaf.grad)


def test_only_some_inputs_require_grad() -> None:
    p = small().rope().mask("causal").build()
    args = p.inputs(2, 37, 37)
    v = args[2].clone().requires_grad_(True)
    out = compile_training(p.text)(args[0], args[1], v)
    out.sum().backward()
    refs = [a.double() for a in args]
    refs[2] = refs[2].requires_grad_(True)
    reference.run(p.text, *refs).sum().backward()
    assert_grad_close(v.grad, refs[2].grad, torch.float32, "dv")
