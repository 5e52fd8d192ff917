"""attnfuse.attention(...): the builder writes the shipped examples, traced regions mean
what the Python functions mean, and errors name what is wrong."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnfuse
from attnfuse import examples
from attnfuse.builder import ProgramBuilder
from attnfuse.program import find_functions
from attnfuse.reference import parse_program, run
from attnfuse.testing import assert_close, make_inputs
from attnfuse.tracing import TraceError

A = attnfuse.attention
EXAMPLES: dict[str, ProgramBuilder] = {
    "llama3": A(32, 128, kv_heads=8, name="llama3").rope(theta=500000.0).causal(),
    "llama3_1": A(32, 128, kv_heads=8, name="llama3_1").rope(
        theta=500000.0, scaling="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position=8192).causal(),
    "qwen3": A(32, 128, kv_heads=8, name="qwen3").qk_norm(eps=1e-6).rope(theta=1e6).causal(),
    "gemma2": A(16, 256, kv_heads=8, name="gemma2").rope(theta=10000.0).scale(0.0625).softcap(50.0).causal()
    .sliding_window(left=4095),
    "gpt_oss": A(64, 64, kv_heads=8, name="gpt_oss").rope(
        theta=150000.0, scaling="yarn", factor=32.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0,
        truncate=0).causal().sliding_window(left=127).sinks(),
    "alibi": A(16, 64, dtype=torch.float16, name="alibi").alibi().causal(),
    "document": A(32, 128, kv_heads=8, name="document").rope(theta=500000.0, positions=True).causal().document(),
    "dropout": A(12, 64, name="dropout").causal().dropout(0.1),
    "t5_bias": A(12, 64, dtype="f32", name="t5_bias").scale(1.0).bias(),
    "varlen": A(32, 128, kv_heads=8, name="varlen").rope(theta=500000.0).causal().packed(),
}


def canonical(text: str) -> str:
    """The program printed with the SSA names of op results dropped (arguments keep theirs)."""
    module = parse_program(text)
    for op in module.walk():
        for result in op.results:
            result.name_hint = None
    return str(module)


def test_every_example_is_built() -> None:
    assert sorted(EXAMPLES) == sorted(examples.names())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_builder_writes_the_example(name: str) -> None:
    program = EXAMPLES[name].build()
    assert program.name == name and str(program) == program.text()
    assert canonical(program.text()) == canonical(examples.path(name).read_text())


# ------------------------------------------------------------------ traced regions

INDEX_MASKS: list[Callable[..., Any]] = [
    lambda b, h, q, kv: kv <= q,
    lambda b, h, q, kv: (q - kv) // 3 == (kv - q) % 4,
    lambda b, h, q, kv: ((q // 4 == kv // 4) | (abs(q - kv) < 2)) & ~(kv == 5),
    lambda b, h, q, kv: (kv % -3 != -1) ^ (h * 2 + b > q - kv),
    lambda b, h, q, kv: -kv + 2 * q >= 7 - h,
]


@pytest.mark.parametrize("mask", INDEX_MASKS)
def test_mask_mod_keeps_what_python_keeps(mask: Callable[..., Any]) -> None:
    """The traced predicate (run by the float64 reference) against the function itself on
    Python ints, Python's floor division and modulo included."""
    text = A(2, 8, dtype="f32").mask_mod(mask).build().text()
    q = torch.zeros(2, 2, 9, 8)
    masked = run(text, q, q, q, return_all=True)["s1"]
    kept = [[[[bool(mask(b, h, i, j)) for j in range(9)] for i in range(9)] for h in range(2)] for b in range(2)]
    assert torch.equal(masked.isfinite(), torch.tensor(kept))


def _score_mod(score: Any, b: Any, h: Any, q: Any, kv: Any, tab: Any) -> Any:
    near = torch.where(q >= kv, score * 0.5 + torch.tanh(score), score - abs(q - kv) / 4)
    return torch.maximum(near, -tab[h] * (kv - q) ** 2) + torch.exp2(score) / (1 + b)


def test_score_mod_computes_what_torch_computes() -> None:
    text = A(2, 8, dtype="f32").score_mod(_score_mod, tab=attnfuse.Capture((2,), "f32")).build().text()
    args = make_inputs(find_functions(parse_program(text))[0], 2, 7, 7)
    values = run(text, *args, return_all=True)
    idx = [torch.arange(n).view(*(-1 if d == i else 1 for d in range(4))) for i, n in enumerate((2, 2, 7, 7))]
    expected = _score_mod(values["s"], *idx, args[3].double())
    torch.testing.assert_close(values["s1"], expected, rtol=1e-12, atol=1e-12)


def test_traced_program_runs_in_the_kernels() -> None:
    def keep(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (kv <= q) & ((q - kv) % 5 != 3)

    program = (A(4, 16, kv_heads=2, dtype="f32", name="traced").alibi(slopes=True)
               .score_mod(_score_mod, tab=torch.zeros(4)).mask_mod(keep).softcap(30.0).sinks().lse().build())
    args = make_inputs(find_functions(parse_program(program.text()))[0], 2, 19, 19)
    out, lse = attnfuse.compile(program)(*args)
    ref, ref_lse = run(program.text(), *args)
    assert_close(out, ref)
    assert_close(lse, ref_lse)


def _raises(fn: Callable[..., Any], match: str, score: bool = False) -> None:
    builder = A(2, 8, dtype="f32")
    with pytest.raises(TraceError, match=match):
        builder.score_mod(fn) if score else builder.mask_mod(fn)


def test_trace_errors_name_the_construct() -> None:
    _raises(lambda b, h, q, kv: q > kv if q > 3 else True, r"mask_mod '<lambda>': Python `if`, `and`, `or`, `not`")
    _raises(lambda b, h, q, kv: q > kv and kv > 2, "Python `if`, `and`, `or`, `not`")
    _raises(lambda s, b, h, q, kv: math.exp(s), r"float\(\) / math\.\* functions", score=True)
    _raises(lambda s, b, h, q, kv: torch.floor(s), r"torch\.floor is not supported .*supported: where, exp", score=True)
    _raises(lambda s, b, h, q, kv: s // 2, "// is supported on integers", score=True)
    _raises(lambda s, b, h, q, kv: q > kv, "must return a number", score=True)
    _raises(lambda b, h, q, kv: q - kv, "must return a boolean .* got a index value")
    _raises(lambda b, h, q, kv: q[0] > 1, r"indexing \(\[\]\) a index value")
    _raises(lambda b, h, q, kv: (q > 1) + 1, "needs numbers, got a bool value")
    _raises(lambda b, h, q, kv: q > "x", "a comparison with a str operand")


def test_capture_errors() -> None:
    builder = A(2, 8, dtype="f32")
    with pytest.raises(TraceError, match="a rank-2 captured tensor needs 2 indices, got 1"):
        builder.mask_mod(lambda b, h, q, kv, t: t[h] > 0, t=attnfuse.Capture((2, "?")))
    with pytest.raises(TypeError, match=r"capture 't': expected attnfuse.builder.Capture\(shape, dtype\) or a tensor"):
        builder.mask_mod(lambda b, h, q, kv, t: q > kv, t=3)


def test_builder_errors() -> None:
    with pytest.raises(ValueError, match="query heads \\(4\\) must be a multiple of key heads \\(3\\)"):
        A(4, 8, kv_heads=3).build()
    with pytest.raises(ValueError, match="rotary_dim must be even and in \\[2, 8\\], got 5"):
        A(4, 8).rope(rotary_dim=5).build()
    with pytest.raises(TypeError, match="attn.rope option 'theta' must be float, got 'big'"):
        A(4, 8).rope(theta="big")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="option 'style' must be one of half, interleaved, got 'neox'"):
        A(4, 8).rope(style="neox")
    with pytest.raises(ValueError, match="dtype must be one of f16, bf16, f32 .* got torch.float64"):
        A(4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="heads must be a positive int, got 0"):
        A(0, 8)
    with pytest.raises(ValueError, match="on must be 'q', 'k' or 'qk', got 'v'"):
        A(4, 8).rope(on="v")
    with pytest.raises(ValueError, match="broadcast names dims among batch, heads, q, kv"):
        A(4, 8).bias(broadcast=("rows",))


def test_builders_are_immutable_and_share_bases() -> None:
    base = A(4, 8, kv_heads=2, dtype="f32").rope()
    local, full = base.causal().sliding_window(left=3), base.causal()
    assert "sliding_window" in local.build().text() and "sliding_window" not in full.build().text()
    assert base.build().text().count("attn.mask") == 0
    assert "%q_doc: tensor<?x?xi32>, %kv_doc" in A(4, 8).document(separate_kv=True).prefix_lm().build().text()


def test_cache_lengths_writes_a_kv_lens_operand() -> None:
    """`cache_lengths()` gives `attn.scores ... kv_lens %kv_lens` with the int32 [B]
    argument right after v, and the kernels read each sequence's length."""
    program = (A(4, 16, kv_heads=2, dtype=torch.float16, name="with_lengths").rope(theta=10000.0, positions=True, on="q")
               .causal(align="bottom_right").cache_lengths().build())
    text = program.text()
    assert "%v: tensor<?x2x?x16xf16>, %kv_lens: tensor<?xi32>, %pos: tensor<?x?xi32>" in text
    assert "attn.scores %qr, %k kv_lens %kv_lens" in text
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 1, 16, generator=g).half()
    k, v = (torch.randn(2, 2, 40, 16, generator=g).half() for _ in range(2))
    lens = torch.tensor([9, 33], dtype=torch.int32)
    pos = (lens - 1).view(2, 1)
    out = attnfuse.compile(program)(q, k, v, lens, pos)
    want = run(text, q, k, v, lens, pos)
    assert_close(out, want)
    alone = run(text, q[1:], k[1:, :, :33], v[1:, :, :33], lens[1:], pos[1:])  # sequence 1 without the padding
    assert_close(out[1:], alone)
