"""The example programs: syntax round trips, and numerics against model-style torch code.

Every `examples/*.attn` program must parse, verify, print, re-parse and print identically,
also through the generic form. Then `attnfuse.reference.run` (the float64 interpreter of
the attn dialect) must agree to 1e-10 with an *independent* float64 implementation of the
model's attention written here the way model code writes it: HF-style `rotate_half` RoPE
with the HF inverse-frequency formulas (default, llama3, YaRN), `repeat_kv` for GQA,
explicit boolean masks, `tanh` soft-capping, sinks as an extra logits column, BLOOM's
ALiBi slopes, a T5 bucketed relative-position bias, and dropout with the keep mask of
`attnfuse.rng` (the RNG stream is the spec of `attn.dropout`).

Real head counts and head dims; tiny batch (2) and sequence lengths (37, and longer where a
sliding window must bite).
"""

from __future__ import annotations

import filecmp
import math
from collections.abc import Sequence
from io import StringIO
from pathlib import Path

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from attnfuse import examples, reference
from attnfuse.pass_manager import make_context

REPO = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = REPO / "examples"
PACKAGE_EXAMPLES_DIR = REPO / "attnfuse" / "examples"
EXAMPLE_NAMES = sorted(p.stem for p in EXAMPLES_DIR.glob("*.attn"))

B = 2
S = 37
TOL = 1e-10
F64 = torch.float64

# ============================================================================ syntax


def parse(text: str, name: str = "<test>") -> ModuleOp:
    module = Parser(make_context(), text, name).parse_module()
    module.verify()
    return module


def custom_text(module: ModuleOp) -> str:
    return str(module)


def generic_text(module: ModuleOp) -> str:
    stream = StringIO()
    Printer(stream=stream, print_generic_format=True).print_op(module)
    return stream.getvalue()


def test_example_set() -> None:
    """The documented examples are all there (and nothing is picked up by accident)."""
    expected = {
        "alibi",
        "document",
        "dropout",
        "gemma2",
        "gpt_oss",
        "llama3",
        "llama3_1",
        "qwen3",
        "t5_bias",
        "varlen",
    }
    assert set(EXAMPLE_NAMES) == expected
    assert examples.names() == EXAMPLE_NAMES


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_round_trip(name: str) -> None:
    path = EXAMPLES_DIR / f"{name}.attn"
    module = parse(path.read_text(), str(path))
    printed = custom_text(module)
    assert "attn." in printed
    # custom -> custom
    assert custom_text(parse(printed)) == printed
    # custom -> generic -> custom, and the generic form is a fixed point too
    generic = generic_text(module)
    assert '"attn.' in generic
    reparsed = parse(generic)
    assert custom_text(reparsed) == printed
    assert generic_text(reparsed) == generic


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_header_cites_config(name: str) -> None:
    """Each example opens with a comment naming the model and its configuration."""
    lines = (EXAMPLES_DIR / f"{name}.attn").read_text().splitlines()
    header = []
    for line in lines:
        if not line.startswith("//"):
            break
        header.append(line)
    assert len(header) >= 3, (
        f"{name}.attn needs a header comment citing the model config"
    )
    text = " ".join(header)
    assert "head" in text and ("config" in text.lower() or "Press et al." in text)


def test_package_copies_identical() -> None:
    """`attnfuse/examples/*.attn` (package data) mirrors the repository's `examples/`."""
    package_names = sorted(p.stem for p in PACKAGE_EXAMPLES_DIR.glob("*.attn"))
    assert package_names == EXAMPLE_NAMES
    for name in EXAMPLE_NAMES:
        a, b = EXAMPLES_DIR / f"{name}.attn", PACKAGE_EXAMPLES_DIR / f"{name}.attn"
        assert filecmp.cmp(a, b, shallow=False), (
            f"{b} differs from {a}: run `cp examples/*.attn attnfuse/examples/`"
        )


def test_every_example_has_a_filecheck_test() -> None:
    lit_dir = REPO / "tests" / "filecheck" / "examples"
    for name in EXAMPLE_NAMES:
        test = lit_dir / f"{name}.mlir"
        assert test.is_file(), f"{test} is missing"
        assert f"examples/{name}.attn" in test.read_text()


def test_examples_path_api() -> None:
    assert examples.path("gemma2") == EXAMPLES_DIR / "gemma2.attn"
    assert examples.path("gemma2.attn") == EXAMPLES_DIR / "gemma2.attn"
    assert examples.directory() == EXAMPLES_DIR
    with pytest.raises(FileNotFoundError, match="known: alibi"):
        examples.path("gemma3")
    with pytest.raises(FileNotFoundError):
        examples.path("../pyproject")


def test_examples_package_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a checkout (an installed wheel) the package data copy is used."""
    monkeypatch.setattr(examples, "_checkout_dir", lambda: None)
    assert examples.directory() == PACKAGE_EXAMPLES_DIR
    assert examples.names() == EXAMPLE_NAMES
    assert examples.path("qwen3") == PACKAGE_EXAMPLES_DIR / "qwen3.attn"


# ============================================================== model-style torch code


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF `rotate_half`: (x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """HF `_compute_default_rope_parameters`: 1 / theta^(2i / dim)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=F64) / dim))


def llama3_inv_freq(
    theta: float,
    dim: int,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    old_context_len: int,
) -> torch.Tensor:
    """HF `_compute_llama3_parameters` (Llama 3.1 / 3.2 / 3.3)."""
    inv_freq = default_inv_freq(theta, dim)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(
        wavelen > low_freq_wavelen, inv_freq / factor, inv_freq
    )
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed_inv_freq = (
        1 - smooth_factor
    ) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def yarn_inv_freq(
    theta: float,
    dim: int,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> tuple[torch.Tensor, float]:
    """HF `_compute_yarn_parameters`: (inv_freq, attention_factor)."""

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = get_mscale(factor)

    def find_correction_dim(num_rotations: float) -> float:
        return (
            dim
            * math.log(original_max_position_embeddings / (num_rotations * 2 * math.pi))
        ) / (2 * math.log(theta))

    low = find_correction_dim(beta_fast)
    high = find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(lo: float, hi: float, n: int) -> torch.Tensor:
        if lo == hi:
            hi += 0.001
        return torch.clamp((torch.arange(n, dtype=F64) - lo) / (hi - lo), 0, 1)

    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=F64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)
    inv_freq = (
        inv_freq_interpolation * (1 - extrapolation_factor)
        + inv_freq_extrapolation * extrapolation_factor
    )
    return inv_freq, attention_factor


def gpt_oss_inv_freq(
    theta: float,
    head_dim: int,
    factor: float,
    initial_context_length: int,
    ntk_alpha: float,
    ntk_beta: float,
) -> tuple[torch.Tensor, float]:
    """openai/gpt-oss `RotaryEmbedding._compute_concentration_and_inv_freq` (torch/model.py)."""
    freq = theta ** (torch.arange(0, head_dim, 2, dtype=F64) / head_dim)
    concentration = 0.1 * math.log(factor) + 1.0
    d_half = head_dim / 2
    low = (
        d_half
        * math.log(initial_context_length / (ntk_beta * 2 * math.pi))
        / math.log(theta)
    )
    high = (
        d_half
        * math.log(initial_context_length / (ntk_alpha * 2 * math.pi))
        / math.log(theta)
    )
    assert 0 < low < high < d_half - 1
    interpolation = 1.0 / (factor * freq)
    extrapolation = 1.0 / freq
    ramp = (torch.arange(d_half, dtype=F64) - low) / (high - low)
    mask = 1 - ramp.clamp(0, 1)
    return interpolation * (1 - mask) + extrapolation * mask, concentration


def rope_cos_sin(
    inv_freq: torch.Tensor, position_ids: torch.Tensor, attention_scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF `RotaryEmbedding.forward`: cos/sin of shape [B, 1, S, dim] for [B, S] positions."""
    freqs = position_ids.to(F64)[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling)[:, None], (emb.sin() * attention_scaling)[
        :, None
    ]


def apply_rotary_pos_emb(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def arange_positions(batch: int, seq: int) -> torch.Tensor:
    return torch.arange(seq, dtype=torch.int64)[None].expand(batch, seq)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm over head_dim: x * rsqrt(mean(x^2) + eps) * weight."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """HF `repeat_kv`: [B, Hkv, S, D] -> [B, Hkv * n_rep, S, D] (query head h uses h // n_rep)."""
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def causal_keep(sq: int, skv: int) -> torch.Tensor:
    """[Sq, Skv] boolean: key j visible to query i iff j <= i (top-left aligned)."""
    return torch.ones(sq, skv, dtype=torch.bool).tril()


def window_keep(sq: int, skv: int, sliding_window: int) -> torch.Tensor:
    """HF sliding window: key j visible to query i iff i - j < sliding_window (with causal)."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(skv)[None, :]
    return (i - j < sliding_window) & (j <= i)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scaling: float,
    keep: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    dropout_keep: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """HF `eager_attention_forward` with the knobs of Gemma2 / gpt-oss / T5 / BLOOM."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    logits = torch.matmul(q, k.transpose(2, 3)) * scaling
    if bias is not None:
        logits = logits + bias
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sink_col = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1)
        combined = torch.cat([logits, sink_col], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    if dropout_keep is not None:
        probs = probs * dropout_keep / (1.0 - dropout_p)
    return torch.matmul(probs, v)


def bloom_alibi_slopes(num_heads: int) -> torch.Tensor:
    """BLOOM `build_alibi_tensor` slopes (geometric, 2^(-8/n) base for n a power of two)."""
    closest_power_of_2 = 2 ** math.floor(math.log2(num_heads))
    base = 2 ** (-(2 ** -(math.log2(closest_power_of_2) - 3)))
    powers = torch.arange(1, 1 + closest_power_of_2, dtype=F64)
    slopes = torch.pow(torch.tensor(base, dtype=F64), powers)
    if closest_power_of_2 != num_heads:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest_power_of_2) - 3)))
        num_remaining = min(closest_power_of_2, num_heads - closest_power_of_2)
        extra_powers = torch.arange(1, 1 + 2 * num_remaining, 2, dtype=F64)
        slopes = torch.cat(
            [slopes, torch.pow(torch.tensor(extra_base, dtype=F64), extra_powers)]
        )
    return slopes


def t5_relative_position_bucket(
    relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """HF `T5Attention._relative_position_bucket`, bidirectional (encoder)."""
    num_buckets //= 2
    buckets = (relative_position > 0).to(torch.long) * num_buckets
    relative_position = torch.abs(relative_position)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, large)


def t5_position_bias(table: torch.Tensor, sq: int, skv: int) -> torch.Tensor:
    """T5 `compute_bias`: the [1, H, Sq, Skv] bias from a [num_buckets, H] embedding table."""
    context = torch.arange(sq)[:, None]
    memory = torch.arange(skv)[None, :]
    bucket = t5_relative_position_bucket(memory - context)
    return table[bucket].permute(2, 0, 1).unsqueeze(0)


# ======================================================================= numerics


def run_example(name: str, *args: object, text: str | None = None) -> torch.Tensor:
    """Run an example (or a textual variant of it) through the reference interpreter."""
    source = text if text is not None else (EXAMPLES_DIR / f"{name}.attn").read_text()
    out = reference.run(source, *args)
    if isinstance(out, (tuple, list)):
        assert len(out) == 1, f"{name}: expected one result, got {len(out)}"
        out = out[0]
    assert isinstance(out, torch.Tensor)
    return out


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got.to(F64), want, rtol=TOL, atol=TOL)


def qkv(
    hq: int,
    hkv: int,
    d: int,
    sq: int = S,
    skv: int = S,
    dv: int | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, hq, sq, d, dtype=F64, generator=g)
    k = torch.randn(B, hkv, skv, d, dtype=F64, generator=g)
    v = torch.randn(B, hkv, skv, d if dv is None else dv, dtype=F64, generator=g)
    return q, k, v


def rope_default(x: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    cos, sin = rope_cos_sin(
        default_inv_freq(theta, d), arange_positions(x.shape[0], x.shape[2])
    )
    return apply_rotary_pos_emb(x, cos, sin)


def test_llama3() -> None:
    q, k, v = qkv(32, 8, 128)
    want = eager_attention(
        rope_default(q, 500000.0),
        rope_default(k, 500000.0),
        v,
        scaling=128**-0.5,
        keep=causal_keep(S, S),
    )
    assert_close(run_example("llama3", q, k, v), want)


def test_llama3_1() -> None:
    q, k, v = qkv(32, 8, 128, seed=1)
    inv_freq = llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    # The scaling must actually change some frequencies (and keep the high ones).
    plain = default_inv_freq(500000.0, 128)
    assert not torch.allclose(inv_freq, plain) and bool(inv_freq[0] == plain[0])
    cos, sin = rope_cos_sin(inv_freq, arange_positions(B, S))
    want = eager_attention(
        apply_rotary_pos_emb(q, cos, sin),
        apply_rotary_pos_emb(k, cos, sin),
        v,
        scaling=128**-0.5,
        keep=causal_keep(S, S),
    )
    unscaled = run_example("llama3", q, k, v)
    assert (unscaled.to(F64) - want).abs().max() > 1e-6
    assert_close(run_example("llama3_1", q, k, v), want)


def test_gemma2() -> None:
    q, k, v = qkv(16, 8, 256, seed=2)
    q = q * 3.0  # push logits into the soft-cap's non-linear range
    want = eager_attention(
        rope_default(q, 10000.0),
        rope_default(k, 10000.0),
        v,
        scaling=256**-0.5,
        softcap=50.0,
        keep=window_keep(S, S, 4096),
    )
    assert_close(run_example("gemma2", q, k, v), want)


def test_gemma2_window_scaled_down() -> None:
    """The window of 4096 never bites at S = 37; a copy with sliding_window = 16 does."""
    text = (EXAMPLES_DIR / "gemma2.attn").read_text()
    window_op = "attn.mask sliding_window %m {left = 4095}"
    assert text.count(window_op) == 1
    small = text.replace(window_op, "attn.mask sliding_window %m {left = 15}")
    q, k, v = qkv(16, 8, 256, seed=3)
    want = eager_attention(
        rope_default(q, 10000.0),
        rope_default(k, 10000.0),
        v,
        scaling=256**-0.5,
        softcap=50.0,
        keep=window_keep(S, S, 16),
    )
    assert_close(run_example("gemma2", q, k, v, text=small), want)


def test_qwen3() -> None:
    q, k, v = qkv(32, 8, 128, seed=4)
    g = torch.Generator().manual_seed(40)
    wq = 1.0 + 0.1 * torch.randn(128, dtype=F64, generator=g)
    wk = 1.0 + 0.1 * torch.randn(128, dtype=F64, generator=g)
    qn, kn = rms_norm(q, wq, 1e-6), rms_norm(k, wk, 1e-6)
    want = eager_attention(
        rope_default(qn, 1000000.0),
        rope_default(kn, 1000000.0),
        v,
        scaling=128**-0.5,
        keep=causal_keep(S, S),
    )
    assert_close(run_example("qwen3", q, k, v, wq, wk), want)


def bloom_176b_alibi_text() -> str:
    """alibi.attn with BLOOM-176B's heads (bigscience/bloom: n_head = 112, head_dim 128).

    112 is not a power of two: the slopes then interleave (BLOOM / ALiBi paper rule).
    """
    text = (EXAMPLES_DIR / "alibi.attn").read_text()
    body = text[text.index("func.func") :]
    assert body.count("x16x") == 15 and body.count("x64xf16") == 9
    return body.replace("x16x", "x112x").replace("x64xf16", "x128xf16")


@pytest.mark.parametrize(("heads", "head_dim"), [(16, 64), (112, 128)])
def test_alibi(heads: int, head_dim: int) -> None:
    q, k, v = qkv(heads, heads, head_dim, seed=5)
    slopes = bloom_alibi_slopes(heads)
    if heads == 16:
        assert math.isclose(slopes[0], 2**-0.5) and math.isclose(slopes[-1], 2**-8)
    else:  # 64 geometric slopes of base 2^-1/8, then 48 odd powers of 2^-1/16
        assert math.isclose(slopes[63], 2**-8) and math.isclose(
            slopes[64], 2 ** -(1 / 16)
        )
    i = torch.arange(S, dtype=F64)[:, None]
    j = torch.arange(S, dtype=F64)[None, :]
    bias = slopes[None, :, None, None] * (j - i)  # [1, H, Sq, Skv]
    want = eager_attention(
        q, k, v, scaling=head_dim**-0.5, bias=bias, keep=causal_keep(S, S)
    )
    text = None if heads == 16 else bloom_176b_alibi_text()
    assert_close(run_example("alibi", q, k, v, text=text), want)


def packed_documents(
    batch: int, seq: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random document boundaries: ([B, S] position ids restarting per document, doc ids)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.empty(batch, seq, dtype=torch.int32)
    doc = torch.empty(batch, seq, dtype=torch.int32)
    for b in range(batch):
        cuts = sorted(torch.randperm(seq - 1, generator=g)[:4].add(1).tolist())
        starts = [0, *cuts]
        ends = [*cuts, seq]
        for d, (lo, hi) in enumerate(zip(starts, ends)):
            doc[b, lo:hi] = d
            pos[b, lo:hi] = torch.arange(hi - lo, dtype=torch.int32)
    return pos, doc


def test_document() -> None:
    q, k, v = qkv(32, 8, 128, seed=6)
    pos, doc = packed_documents(B, S, seed=60)
    assert doc.max() >= 3
    inv_freq = default_inv_freq(500000.0, 128)
    cos, sin = rope_cos_sin(inv_freq, pos)
    keep = causal_keep(S, S)[None, None] & (
        doc[:, None, :, None] == doc[:, None, None, :]
    )
    want = eager_attention(
        apply_rotary_pos_emb(q, cos, sin),
        apply_rotary_pos_emb(k, cos, sin),
        v,
        scaling=128**-0.5,
        keep=keep,
    )
    assert_close(run_example("document", q, k, v, pos, doc), want)


def test_varlen() -> None:
    """The packed batch is its sequences run one by one (lengths 37, 1, 20): per-sequence
    RoPE positions from 0 and causal masks, outputs concatenated along the tokens; the same
    sequences padded into one batch and run through llama3.attn give the same rows."""
    lengths = [S, 1, 20]
    starts = [0, S, S + 1]
    total = sum(lengths)
    g = torch.Generator().manual_seed(8)
    q = torch.randn(1, 32, total, 128, dtype=F64, generator=g)
    k = torch.randn(1, 8, total, 128, dtype=F64, generator=g)
    v = torch.randn(1, 8, total, 128, dtype=F64, generator=g)
    cu = torch.tensor([0, S, S + 1, total], dtype=torch.int32)
    inv_freq = default_inv_freq(500000.0, 128)
    pieces = []
    for start, n in zip(starts, lengths):
        rows = slice(start, start + n)
        cos, sin = rope_cos_sin(inv_freq, arange_positions(1, n))
        pieces.append(eager_attention(
            apply_rotary_pos_emb(q[:, :, rows], cos, sin),
            apply_rotary_pos_emb(k[:, :, rows], cos, sin),
            v[:, :, rows],
            scaling=128**-0.5,
            keep=causal_keep(n, n),
        ))
    got = run_example("varlen", q, k, v, cu, cu)
    assert_close(got, torch.cat(pieces, dim=2))
    padded = torch.zeros(3, 32, S, 128, dtype=F64), torch.zeros(3, 8, S, 128, dtype=F64), torch.zeros(3, 8, S, 128, dtype=F64)
    for b, (start, n) in enumerate(zip(starts, lengths)):
        for dst, src in zip(padded, (q, k, v)):
            dst[b, :, :n] = src[0, :, start:start + n]
    llama = run_example("llama3", *padded)
    for b, (start, n) in enumerate(zip(starts, lengths)):
        assert_close(got[:, :, start:start + n], llama[b:b + 1, :, :n])


@pytest.mark.parametrize("seq", [S, 141])
def test_gpt_oss(seq: int) -> None:
    """S = 141 makes the 128-token window bite."""
    q, k, v = qkv(64, 8, 64, sq=seq, skv=seq, seed=7)
    g = torch.Generator().manual_seed(70)
    sinks = torch.randn(64, dtype=F64, generator=g) + 1.0
    inv_freq, attention_factor = yarn_inv_freq(
        150000.0, 64, 32.0, 4096, 32.0, 1.0, truncate=False
    )
    # The reference implementation's own formula gives the same frequencies.
    oss_freq, concentration = gpt_oss_inv_freq(150000.0, 64, 32.0, 4096, 1.0, 32.0)
    torch.testing.assert_close(inv_freq, oss_freq, rtol=1e-15, atol=0)
    assert attention_factor == concentration
    cos, sin = rope_cos_sin(inv_freq, arange_positions(B, seq), attention_factor)
    want = eager_attention(
        apply_rotary_pos_emb(q, cos, sin),
        apply_rotary_pos_emb(k, cos, sin),
        v,
        scaling=64**-0.5,
        keep=window_keep(seq, seq, 128),
        sinks=sinks,
    )
    assert_close(run_example("gpt_oss", q, k, v, sinks), want)


@pytest.mark.parametrize(("sq", "skv"), [(S, S), (S, 29)])
def test_t5_bias(sq: int, skv: int) -> None:
    q, k, v = qkv(12, 12, 64, sq=sq, skv=skv, seed=8)
    g = torch.Generator().manual_seed(80)
    table = torch.randn(
        32, 12, dtype=F64, generator=g
    )  # relative_attention_bias.weight
    bias = t5_position_bias(table, sq, skv)
    assert bias.shape == (1, 12, sq, skv)
    want = eager_attention(q, k, v, scaling=1.0, bias=bias)
    assert_close(run_example("t5_bias", q, k, v, bias), want)


def test_dropout() -> None:
    from attnfuse.rng import dropout_keep

    q, k, v = qkv(12, 12, 64, seed=9)
    seed = 0x5EED_0000_1234
    p = 0.1
    keep = dropout_keep(seed, B, 12, S, S, p)
    dropped = 1.0 - keep.double().mean().item()
    assert 0.05 < dropped < 0.15, f"drop rate {dropped:.3f} far from p = {p}"
    want = eager_attention(
        q,
        k,
        v,
        scaling=64**-0.5,
        keep=causal_keep(S, S),
        dropout_keep=keep,
        dropout_p=p,
    )
    assert_close(run_example("dropout", q, k, v, seed), want)
    # Another seed gives another mask.
    other = run_example("dropout", q, k, v, seed + 1)
    assert (other.to(F64) - want).abs().max() > 1e-3


_NUMERIC_TESTS: Sequence[str] = (
    "test_llama3",
    "test_llama3_1",
    "test_gemma2",
    "test_qwen3",
    "test_alibi",
    "test_document",
    "test_gpt_oss",
    "test_t5_bias",
    "test_dropout",
    "test_varlen",
)


def test_every_example_has_a_numeric_test() -> None:
    covered = {t.removeprefix("test_") for t in _NUMERIC_TESTS}
    assert covered == set(EXAMPLE_NAMES)
    assert all(callable(globals()[t]) for t in _NUMERIC_TESTS)
