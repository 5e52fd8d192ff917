"""The benchmarks' flex_attention / SDPA baselines compute the same attention as each
shipped example (float64 reference, f32 programs, CPU, eager flex): a baseline that
drifted from the program would make every ratio in docs/benchmarks.md meaningless."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from attnfuse import examples, reference
from attnfuse.program import analyze, find_functions
from attnfuse.testing import make_inputs, with_dtype

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from baselines import Unsupported, flex_baseline, qk_preamble, sdpa_baseline  # noqa: E402
from decode import PROGRAM as PROGRAM_NO_ROPE  # noqa: E402

SUPPORTED = ["alibi", "document", "gemma2", "gpt_oss", "llama3", "llama3_1", "qwen3", "t5_bias", "varlen"]


def _program(name: str) -> tuple[str, object, list[object]]:
    text = with_dtype(examples.path(name).read_text(), "f32")
    function = find_functions(reference.parse_program(text))[0]
    return text, analyze(function), make_inputs(function, 2, 40, 40, seed=1)


@pytest.mark.parametrize("name", SUPPORTED)
def test_flex_baseline_matches_reference(name: str) -> None:
    text, program, args = _program(name)
    run = flex_baseline(program, args, compile=False)  # type: ignore[arg-type]
    qkv = [args[i] for i in (program.q.arg_index, program.k.arg_index, program.v_arg)]  # type: ignore[attr-defined]
    want = reference.run(text, *args)
    want = want[0] if isinstance(want, tuple) else want
    assert float((run(*qkv).double() - want).abs().max()) < 1e-4


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_sdpa_baseline_matches_reference(name: str) -> None:
    text, program, args = _program(name)
    run = sdpa_baseline(program, args, backend="math", compile=False)  # type: ignore[arg-type]
    qkv = [args[i] for i in (program.q.arg_index, program.k.arg_index, program.v_arg)]  # type: ignore[attr-defined]
    assert float((run(*qkv).double() - reference.run(text, *args)).abs().max()) < 1e-4


def test_unsupported_programs_say_why() -> None:
    _, program, args = _program("dropout")
    with pytest.raises(Unsupported, match="no dropout"):
        flex_baseline(program, args, compile=False)  # type: ignore[arg-type]
    _, program, args = _program("gemma2")
    with pytest.raises(Unsupported, match="only score op is a top-left causal mask"):
        sdpa_baseline(program, args, compile=False)  # type: ignore[arg-type]
    _, program, args = _program("varlen")
    with pytest.raises(Unsupported, match="no packed batch"):
        sdpa_baseline(program, args, compile=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("q_len", [1, 4])
def test_decode_bench_program_and_baselines(q_len: int) -> None:
    """bench/decode.py: its program (through the split-KV kernels it times), both SDPA
    formulations with the lower-right causal mask and the flex translation all give the
    reference's decode attention (new queries last)."""
    import attnfuse
    from decode import PROGRAM, launched, sdpa_gqa_mask, sdpa_lower_right

    text = with_dtype(PROGRAM, "f32")
    function = find_functions(reference.parse_program(text))[0]
    g = torch.Generator().manual_seed(q_len)
    q = torch.randn(2, 32, q_len, 128, generator=g)
    k, v = (torch.randn(2, 8, 37, 128, generator=g) for _ in range(2))
    want = reference.run(text, q, k, v)
    fn = attnfuse.compile(text)
    for got in (fn(q, k, v), sdpa_lower_right(q, k, v), sdpa_gqa_mask(q_len, 37, "cpu")(q, k, v),
                flex_baseline(analyze(function), [q, k, v], compile=False)(q, k, v)):
        assert float((got.double() - want).abs().max()) < 1e-4
    assert {"decode_split_kv", "decode_split_kv_small"} & set(launched(fn, [q, k, v]))


@pytest.mark.parametrize("page", [16, 5])
def test_decode_bench_paged_rows(page: int) -> None:
    """bench/decode.py's paged rows: `page_cache` scatters K/V over shuffled pages, and the
    paged program (split-KV kernels) on them gives the contiguous program's attention."""
    import attnfuse
    from decode import PAGED_PROGRAM, PROGRAM, launched, page_cache

    text = with_dtype(PAGED_PROGRAM.replace("${page}", str(page)), "f32")
    g = torch.Generator().manual_seed(page)
    q = torch.randn(2, 32, 1, 128, generator=g)
    k, v = (torch.randn(2, 8, 37, 128, generator=g) for _ in range(2))
    cache = page_cache(k, v, page, g)
    assert sorted(cache[2].flatten().tolist()) == list(range(cache[0].shape[0]))  # every page used once
    assert not torch.equal(cache[2].flatten().sort().values, cache[2].flatten())  # shuffled
    want = reference.run(with_dtype(PROGRAM, "f32"), q, k, v)
    assert float((reference.run(text, q, *cache) - want).abs().max()) < 1e-12
    fn = attnfuse.compile(text)
    assert float((fn(q, *cache).double() - want).abs().max()) < 1e-4
    assert "paged_split_kv_short" in launched(fn, [q, *cache])  # Sq = 1: 4 packed rows, one-block splits


def test_decode_bench_lens_rows() -> None:
    """bench/decode.py's rows with lengths: the contiguous program with `kv_lens` = Skv
    gives the contiguous program's attention."""
    import attnfuse
    from decode import LENS_PROGRAM, PROGRAM

    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 32, 1, 128, generator=g)
    k, v = (torch.randn(2, 8, 37, 128, generator=g) for _ in range(2))
    lens = torch.full((2,), 37, dtype=torch.int32)
    want = reference.run(with_dtype(PROGRAM, "f32"), q, k, v)
    fn = attnfuse.compile(with_dtype(LENS_PROGRAM, "f32"))
    assert float((fn(q, k, v, lens).double() - want).abs().max()) < 1e-4


@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_bench_rope_rows(q_len: int) -> None:
    """bench/decode.py --rope: the program with RoPE on the new queries (fused into the
    split kernel it times, with no table kernel), its form aligned bottom-right, SDPA after the PyTorch RoPE preamble and the flex translation
    give the reference's attention, each within 4x PyTorch's own f32 error (SDPA's)."""
    import attnfuse
    from decode import ROPE_END_PROGRAM, ROPE_PROGRAM, launched, rope_positions, sdpa_lower_right

    text = with_dtype(ROPE_PROGRAM, "f32")
    program = analyze(find_functions(reference.parse_program(text))[0])
    g = torch.Generator().manual_seed(10 + q_len)
    q = torch.randn(2, 32, q_len, 128, generator=g)
    k, v = (torch.randn(2, 8, 300, 128, generator=g) for _ in range(2))
    pos = rope_positions(2, q_len, 300, "cpu")
    assert pos.tolist() == [list(range(300 - q_len, 300))] * 2
    args = [q, k, v, pos]
    want = reference.run(text, *args)
    rotate = qk_preamble(program, args, compile=False)  # type: ignore[arg-type]
    torch_err = float((sdpa_lower_right(rotate(q, k)[0], k, v).double() - want).abs().max())
    fn = attnfuse.compile(text)
    for got in (fn(*args), flex_baseline(program, args, compile=False)(q, k, v)):  # type: ignore[arg-type]
        assert float((got.double() - want).abs().max()) <= 4 * torch_err + 1e-6
    lens, steps = torch.full((2,), 300, dtype=torch.int32), torch.arange(q_len, dtype=torch.int32)
    assert torch.equal(fn(q, k, v, lens[:, None] - q_len + steps), fn(*args))  # the bench's per-call positions
    end_text = with_dtype(ROPE_END_PROGRAM, "f32")  # the same rope aligned bottom-right: no positions
    end_program = analyze(find_functions(reference.parse_program(end_text))[0])
    assert torch.equal(reference.run(end_text, q, k, v), want)
    for got in (attnfuse.compile(end_text)(q, k, v),
                flex_baseline(end_program, [q, k, v], compile=False)(q, k, v)):  # type: ignore[arg-type]
        assert float((got.double() - want).abs().max()) <= 4 * torch_err + 1e-6
    kernels = set(launched(fn, args))  # one split kernel rotates the queries: no cos/sin table kernel
    assert "rope_decode_split_kv_small" in kernels and not any("rope_table" in name for name in kernels)
    unrotated = reference.run(with_dtype(PROGRAM_NO_ROPE, "f32"), q, k, v)
    assert float((unrotated - want).abs().max()) > 100 * torch_err  # the rotation is not a no-op here


def test_decode_bench_flash_kvcache_call() -> None:
    """bench/decode.py's FlashAttention baseline hands `flash_attn_with_kvcache` [B, S, H,
    D] tensors, full cache lengths and `causal=True`, and reads its output back as
    [B, H, Sq, D]: checked with a stand-in of that function (FlashAttention's contract:
    causal aligned bottom-right, GQA by head groups) against the decode reference."""
    from decode import PROGRAM, flash_kvcache, flash_kvcache_call

    def stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, cache_seqlens: torch.Tensor,
                 causal: bool) -> torch.Tensor:
        assert causal and cache_seqlens.tolist() == [k.shape[1]] * k.shape[0] and q.shape[2] == 32
        group = q.shape[2] // k.shape[2]
        q_, k_, v_ = (x.transpose(1, 2) for x in (q, k, v))
        i, j = torch.arange(q.shape[1])[:, None], torch.arange(k.shape[1])[None, :]
        out = torch.nn.functional.scaled_dot_product_attention(
            q_, k_.repeat_interleave(group, 1), v_.repeat_interleave(group, 1), attn_mask=j <= i + k.shape[1] - q.shape[1])
        return out.transpose(1, 2)

    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 32, 3, 128, generator=g)
    k, v = (torch.randn(2, 8, 37, 128, generator=g) for _ in range(2))
    want = reference.run(with_dtype(PROGRAM, "f32"), q, k, v)
    assert float((flash_kvcache_call(stand_in, q, k, v)().double() - want).abs().max()) < 1e-4
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        assert flash_kvcache() is None


def test_flex_baseline_packed_cross() -> None:
    """A packed batch with more keys than queries per sequence: flex's document masking
    with positions within each sequence, bottom-right bands and ALiBi distances."""
    import attnfuse
    from attnfuse.testing import cu_seqlens

    text = (attnfuse.attention(4, 16, kv_heads=2, dtype="f32").rope().alibi().causal(align="bottom_right")
            .sliding_window(left=3, align="bottom_right").packed().build().source)
    program = analyze(find_functions(reference.parse_program(text))[0])
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 9, 16, generator=g)
    k, v = (torch.randn(1, 2, 17, 16, generator=g) for _ in range(2))
    args = [q, k, v, cu_seqlens([4, 1, 4]), cu_seqlens([6, 3, 8])]
    got = flex_baseline(program, args, compile=False)(q, k, v)  # type: ignore[arg-type]
    assert float((got.double() - reference.run(text, *args)).abs().max()) < 1e-4


def test_varlen_bench_runs_one_attention_four_ways() -> None:
    """bench/varlen.py: the packed program, the document program on one row and on a
    padded batch, and the flex translation compute the same attention (float64 reference)."""
    from varlen import document_inputs, draw_lengths, packed_inputs, padded_inputs, unpad

    lengths = draw_lengths(40, 3, 17, seed=1)
    assert sum(lengths) == 40 and min(lengths) >= 1 and len(lengths) >= 3
    q, k, v, cu = packed_inputs(lengths, "cpu", torch.float32, seed=1)
    varlen, document = (with_dtype(examples.path(n).read_text(), "f32") for n in ("varlen", "document"))
    want = reference.run(varlen, q, k, v, cu, cu)
    assert float((reference.run(document, *document_inputs(q, k, v, cu)) - want).abs().max()) < 1e-10
    padded = reference.run(document, *padded_inputs(q, k, v, cu))
    assert padded.shape[0] == len(lengths) and float((unpad(padded, cu) - want).abs().max()) < 1e-10
    program = analyze(find_functions(reference.parse_program(varlen))[0])
    flex = flex_baseline(program, [q, k, v, cu, cu], compile=False)
    assert float((flex(q, k, v).double() - want).abs().max()) < 1e-4


def test_decode_tables_show_the_baseline_pipeline() -> None:
    """bench/decode.py's tables: the second pipeline (`--baseline-pipeline P`, an A/B of
    one option in the same run) has a column and a ratio in the CUDA-graph table too,
    for the contiguous cache, the paged one and the one with lengths."""
    from decode import _ratios, summary

    row: dict[str, object] = {"batch": 1, "kv_len": 8192, "q_len": 1, "splits": 16, "attnfuse_ms": 0.020,
                              "attnfuse_graph_ms": 0.010, "attnfuse_no_split_ms": 0.022,
                              "attnfuse_no_split_graph_ms": 0.012, "sdpa_ms": 0.021, "sdpa_graph_ms": 0.011,
                              "attnfuse_paged_graph_ms": 0.016, "attnfuse_paged_no_split_graph_ms": 0.0208,
                              "attnfuse_lens_graph_ms": 0.0125, "attnfuse_lens_no_split_graph_ms": 0.0175}
    _ratios(row, "ms", "")  # type: ignore[arg-type]
    _ratios(row, "graph_ms", "graph_")  # type: ignore[arg-type]
    assert row["graph_vs_no_split"] == pytest.approx(1.2) and row["vs_no_split"] == pytest.approx(1.1)
    assert row["graph_paged_vs_no_split"] == pytest.approx(1.3) and "paged_vs_no_split" not in row
    graph_table = summary([row]).split("Eager calls")[0]  # type: ignore[list-item]
    assert "| baseline pipeline |" in graph_table and "| 0.0120 |" in graph_table and "| 1.20 |" in graph_table
    assert "| paged, baseline pipeline |" in graph_table and "| 0.0208 |" in graph_table and "| 1.30 |" in graph_table
    assert row["graph_lens_vs_no_split"] == pytest.approx(1.4) and "lens_vs_no_split" not in row
    assert "| with lengths, baseline pipeline |" in graph_table and "| 0.0175 |" in graph_table
    assert "| 1.40 |" in graph_table
