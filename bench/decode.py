"""Decode against a KV cache: AttnFuse vs SDPA and flex_attention (issue 11's table; CUDA).

The program is Llama-3-8B attention over an already-rotated cache (32 query heads, 8
KV heads, D = 128, bf16) with a bottom-right causal mask, so the `Sq` new queries are
the last `Sq` positions. Per (B, Skv, Sq): GPU time per call (`do_bench` median) of
AttnFuse with the default pipeline (split-KV decoding, docs/inference.md; the split
count and the kernels its launch plan runs are recorded), AttnFuse without `split-kv`
(one program per query block and head, what ran before), SDPA and compiled
flex_attention (`bench/baselines.py`), FlashAttention's `flash_attn_with_kvcache` where
`flash_attn` is installed (`flash_kvcache_*`, `vs_flash`; the JSON's `flash_attn` gives
its version or null), the max difference to SDPA, and ratios. SDPA is
timed as `causal_lower_right` with K/V repeated to the query heads (its causal-bias path
takes no `enable_gqa`) and, for Sq > 1, also with an explicit lower-right boolean mask
and `enable_gqa=True`; `vs_sdpa` compares with the faster of the two (no mask for
Sq = 1). With `--page-size P` (default 16; 0 skips them) each row also times the same
attention on a paged KV cache (`PAGED_PROGRAM`: the same K/V scattered over shuffled
pages of a pool, read through a block table; docs/inference.md) and reports
`paged_vs_contiguous` (contiguous ms / paged ms; the target is >= 0.95), and the same
attention on the contiguous K/V with per-sequence lengths (`LENS_PROGRAM`, `kv_lens` =
Skv: what a preallocated serving cache costs over plain contiguous K/V,
`lens_vs_contiguous`). With `--rope` each row also times the step with RoPE on the new
queries (`ROPE_PROGRAM`: Llama-3's rotation at positions `Skv - Sq + i`, the cache's keys
already rotated): AttnFuse rotates them inside the split kernel, SDPA and flex run a
compiled PyTorch RoPE first (`baselines.qk_preamble`), as a model does (`<impl>_rope_*`,
ratios `rope_vs_*`), the same rope aligned bottom-right, with no positions operand
(`ROPE_END_PROGRAM`, `attnfuse_rope_end_*`), and the positions form with the positions
built from `kv_lens` in the timed call (`attnfuse_rope_pos_ops_*`: what a serving loop
without position ids pays for the operand). JSON and a markdown table under --out:

    python bench/decode.py --out DIR [--batches 1,16,64] [--kv 1024,8192,32768,131072] [--sq 1,4,16]
                           [--pipeline P] [--baseline-pipeline P | --no-baseline-pipeline] [--page-size 16]
                           [--graphs] [--no-flex] [--rope]

With `--graphs` every call is also timed replayed from a CUDA graph (`<impl>_graph_ms`,
ratios `graph_vs_*`): a server replays decode steps from graphs, and at these sizes an
eager call's time is mostly the host's launch path, not the GPU's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import attnfuse
from attnfuse import reference
from attnfuse.passes import DEFAULT_PIPELINE, default_pipeline
from attnfuse.program import analyze, find_functions
from backward_profile import kernel_times
from baselines import flex_baseline, qk_preamble

PROGRAM = """
func.func @decode(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>,
                  %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %s = attn.scores %q, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
"""


PAGED_PROGRAM = """
func.func @paged(%q: tensor<?x32x?x128xbf16>, %k_cache: tensor<?x8x${page}x128xbf16>,
                 %v_cache: tensor<?x8x${page}x128xbf16>, %block_table: tensor<?x?xi32>,
                 %kv_lens: tensor<?xi32>) -> tensor<?x32x?x128xbf16> {
  %s = attn.scores %q, %k_cache block_table %block_table kv_lens %kv_lens : tensor<?x32x?x128xbf16>, tensor<?x8x${page}x128xbf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v_cache : !attn.probs<?x32x?x?xf32>, tensor<?x8x${page}x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
"""
"""`PROGRAM` on a paged KV cache; `${page}` is the page size (`attnfuse.compile(..., params=...)`)."""

LENS_PROGRAM = """
func.func @lens(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>,
                %kv_lens: tensor<?xi32>) -> tensor<?x32x?x128xbf16> {
  %s = attn.scores %q, %k kv_lens %kv_lens : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
"""
"""`PROGRAM` on a contiguous cache with per-sequence lengths (`kv_lens`, no block table)."""

ROPE_PROGRAM = """
func.func @rope_decode(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>,
                       %v: tensor<?x8x?x128xbf16>, %pos: tensor<?x?xi32>) -> tensor<?x32x?x128xbf16> {
  %qr = attn.rope %q positions %pos {theta = 500000.0, scaling = "llama3", factor = 8.0} : tensor<?x32x?x128xbf16>, tensor<?x?xi32>
  %s = attn.scores %qr, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
"""
"""`PROGRAM` with Llama-3's RoPE on the new queries at their positions `pos` ([B, Sq])."""

ROPE_END_PROGRAM = """
func.func @rope_end(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>,
                    %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %qr = attn.rope %q {theta = 500000.0, scaling = "llama3", factor = 8.0, align = "bottom_right"} : tensor<?x32x?x128xbf16>
  %s = attn.scores %qr, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
"""
"""`ROPE_PROGRAM` with the rope aligned bottom-right: no positions operand, each query
rotated at `Skv - Sq + i` in the kernel."""


def rope_positions(batch: int, q_len: int, kv_len: int, device: str) -> torch.Tensor:
    """[B, Sq] int32 positions of the new queries, the last `Sq` of `kv_len`."""
    return (torch.arange(kv_len - q_len, kv_len, device=device, dtype=torch.int32)).expand(batch, q_len).contiguous()


def page_cache(k: torch.Tensor, v: torch.Tensor, page: int,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k_cache, v_cache, block_table, kv_lens): `k` and `v` ([B, H, S, D]) scattered over
    the pages of a pool in a random order (sequence b's pages neither contiguous nor
    sorted), as a serving engine's allocator leaves them after a while."""
    batch, heads, length, dim = k.shape
    per_seq = -(-length // page)
    order = torch.randperm(batch * per_seq, generator=generator, device=generator.device).to(k.device)
    table = order.view(batch, per_seq).to(torch.int32)
    pools = []
    for x in (k, v):
        padded = torch.zeros(batch, heads, per_seq * page, x.shape[3], dtype=x.dtype, device=x.device)
        padded[:, :, :length] = x
        pages = padded.view(batch, heads, per_seq, page, x.shape[3]).permute(0, 2, 1, 3, 4).reshape(
            batch * per_seq, heads, page, x.shape[3])
        pool = torch.empty_like(pages)
        pool[order] = pages
        pools.append(pool)
    lens = torch.full((batch,), length, dtype=torch.int32, device=k.device)
    return pools[0], pools[1], table, lens


def sdpa_lower_right(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA with the bottom-right causal mask (the new queries are the last positions)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    if q.shape[2] == 1:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    mask = causal_lower_right(q.shape[2], k.shape[2])
    if q.shape[1] != k.shape[1]:  # the causal-bias path takes no enable_gqa
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def flash_kvcache() -> Callable[..., torch.Tensor] | None:
    """FlashAttention's `flash_attn_with_kvcache` where the `flash_attn` package is
    installed, else None (the baseline is then left out and the JSON says so)."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None
    return flash_attn_with_kvcache  # type: ignore[no-any-return]


def flash_kvcache_call(fa: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor) -> Callable[[], torch.Tensor]:
    """`fn() -> out [B, H, Sq, D]`: `fa` on [B, S, H, D] copies of q, k and v (made here,
    outside the timed call, as a serving engine keeps its cache in that layout), every
    sequence's cache full (`cache_seqlens = Skv`), causal (FlashAttention aligns it
    bottom-right when Sq < Skv), GQA native."""
    q_bshd, k_bshd, v_bshd = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    lens = torch.full((q.shape[0],), k.shape[2], dtype=torch.int32, device=q.device)
    return lambda: fa(q_bshd, k_bshd, v_bshd, cache_seqlens=lens, causal=True).transpose(1, 2)


def sdpa_gqa_mask(q_len: int, kv_len: int, device: str) -> Callable[..., torch.Tensor]:
    """SDPA with `enable_gqa` and the lower-right causal mask as a boolean tensor (no
    repeated K/V; SDPA picks a backend that takes masks)."""
    import torch.nn.functional as F

    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(kv_len, device=device)[None, :]
    mask = j <= i + (kv_len - q_len)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def launched(fn: attnfuse.api.AttentionFunction, args: list[torch.Tensor]) -> dict[str, int]:
    """Kernel name -> programs along grid axis 0 (the split count of the split kernel) of
    the launches the call's launch plan runs."""
    from attnfuse.runtime.host import call_signature

    plan = fn._host.plan(call_signature(args))  # noqa: SLF001
    return {} if plan is None else {s.meta.name: s.grid[0] for s in plan.steps if hasattr(s, "meta")}


def _error_text(exc: BaseException) -> str:
    """An exception's type, its message's start and its end (where a compile worker's
    traceback puts the cause)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 900 else f"{text[:300]} [...] {text[-600:]}"


def _ms(fn: Callable[[], Any]) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _graph_ms(fn: Callable[[], Any]) -> float:
    """Median ms of one call replayed from a CUDA graph (the call captured once, as a
    server captures a decode step): the GPU's time without the host's launch path."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def run(batches: list[int], kv_lens: list[int], q_lens: list[int], pipeline: str,
        baseline_pipeline: str | None, page_size: int = 0, graphs: bool = False,
        flex: bool = True, kernels: bool = False, rope: bool = False,
        on_row: Callable[[list[dict[str, Any]]], None] = lambda rows: None) -> list[dict[str, Any]]:
    fn = attnfuse.compile(PROGRAM, pipeline=pipeline)
    rope_fn = attnfuse.compile(ROPE_PROGRAM, pipeline=pipeline) if rope else None
    rope_end_fn = attnfuse.compile(ROPE_END_PROGRAM, pipeline=pipeline) if rope else None
    rope_program = analyze(find_functions(reference.parse_program(ROPE_PROGRAM))[0]) if rope else None
    unsplit = attnfuse.compile(PROGRAM, pipeline=baseline_pipeline) if baseline_pipeline else None
    paged = attnfuse.compile(PAGED_PROGRAM, pipeline=pipeline, params={"page": page_size}) if page_size else None
    paged_baseline = attnfuse.compile(PAGED_PROGRAM, pipeline=baseline_pipeline, params={"page": page_size}) \
        if page_size and baseline_pipeline else None
    with_lens = attnfuse.compile(LENS_PROGRAM, pipeline=pipeline)
    lens_baseline = attnfuse.compile(LENS_PROGRAM, pipeline=baseline_pipeline) if baseline_pipeline else None
    fa = flash_kvcache()
    program = analyze(find_functions(reference.parse_program(PROGRAM))[0])
    rows: list[dict[str, Any]] = []
    for b in batches:
        for skv in kv_lens:
            for sq in q_lens:
                gen = torch.Generator(device="cuda").manual_seed(skv + sq)
                q = torch.randn(b, 32, sq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                v = torch.randn_like(k)
                row: dict[str, Any] = {"batch": b, "kv_len": skv, "q_len": sq}
                with torch.no_grad():
                    try:  # SDPA repeats K/V per query head: at B = 64, Skv = 128k that is 64 GiB
                        want: torch.Tensor | None = sdpa_lower_right(q, k, v)
                    except torch.OutOfMemoryError as exc:
                        want, row["reference_error"] = None, f"{type(exc).__name__}: {exc}"[:300]
                        torch.cuda.empty_cache()
                    impls = {"attnfuse": lambda: fn(q, k, v), "sdpa": lambda: sdpa_lower_right(q, k, v)}
                    if unsplit is not None:
                        impls["attnfuse_no_split"] = lambda: unsplit(q, k, v)
                    if paged is not None:
                        cache = page_cache(k, v, page_size, gen)
                        impls["attnfuse_paged"] = lambda: paged(q, *cache)
                        if paged_baseline is not None:
                            impls["attnfuse_paged_no_split"] = lambda: paged_baseline(q, *cache)
                    lens = torch.full((b,), skv, dtype=torch.int32, device="cuda")
                    impls["attnfuse_lens"] = lambda: with_lens(q, k, v, lens)
                    if lens_baseline is not None:
                        impls["attnfuse_lens_no_split"] = lambda: lens_baseline(q, k, v, lens)
                    if fa is not None:
                        impls["flash_kvcache"] = flash_kvcache_call(fa, q, k, v)
                    if sq > 1:
                        masked = sdpa_gqa_mask(sq, skv, "cuda")
                        impls["sdpa_gqa_mask"] = lambda: masked(q, k, v)
                    if flex:  # compiled afresh for this row's shapes (`flex_baseline`)
                        flex_fn = flex_baseline(program, [q, k, v])
                        impls["flex"] = lambda: flex_fn(q, k, v)
                    want_rope: torch.Tensor | None = None
                    if rope_fn is not None and rope_program is not None:
                        pos = rope_positions(b, sq, skv, "cuda")
                        rotate = qk_preamble(rope_program, [q, k, v, pos])
                        impls["sdpa_rope"] = lambda: sdpa_lower_right(rotate(q, k)[0], k, v)
                        if sq > 1:
                            impls["sdpa_gqa_mask_rope"] = lambda: masked(rotate(q, k)[0], k, v)
                        impls["attnfuse_rope"] = lambda: rope_fn(q, k, v, pos)
                        assert rope_end_fn is not None
                        impls["attnfuse_rope_end"] = lambda: rope_end_fn(q, k, v)
                        # what a loop without position ids pays for the operand each step
                        steps = torch.arange(sq, device="cuda", dtype=torch.int32)
                        impls["attnfuse_rope_pos_ops"] = lambda: rope_fn(q, k, v, lens[:, None] - sq + steps)
                        if flex:
                            flex_rope = flex_baseline(rope_program, [q, k, v, pos])
                            impls["flex_rope"] = lambda: flex_rope(q, k, v)
                    for name, call in impls.items():
                        try:
                            got = call()
                            if name == "sdpa_rope":
                                want_rope = got
                            against = want_rope if "_rope" in name else want
                            if against is not None:
                                row[f"{name}_max_diff_vs_sdpa"] = float((got.float() - against.float()).abs().max())
                            del got, against
                            row[f"{name}_ms"] = _ms(call)
                            if graphs:
                                row[f"{name}_graph_ms"] = _graph_ms(call)
                            if kernels:
                                row[f"{name}_kernel_us"] = kernel_times(call, 20)
                        except Exception as exc:  # reported, never hidden
                            row[f"{name}_error"] = _error_text(exc)
                    row["attnfuse_kernels"] = launched(fn, [q, k, v])
                    if paged is not None:
                        row["attnfuse_paged_kernels"] = launched(paged, [q, *cache])
                        del cache
                kernels_run = row["attnfuse_kernels"]  # the persistent kernel's grid counts programs
                row["splits"] = 1 if kernels_run.get("decode_split_kv_persistent") else max(
                    kernels_run.get(f"decode_split_kv{tier}", 0) for tier in ("", "_small", "_wide"))
                for suffix in ("", "_rope"):
                    _ratios(row, "ms", "", suffix)
                    _ratios(row, "graph_ms", "graph_", suffix)
                rows.append(row)
                on_row(rows)
                print(json.dumps(row), flush=True)
                del q, k, v, want, want_rope
                torch.cuda.empty_cache()
    return rows


def _ratios(row: dict[str, Any], ms: str, prefix: str, suffix: str = "") -> None:
    """Add to `row` the faster SDPA form's time (`sdpa_best<suffix>_<ms>`) and AttnFuse's
    ratios from its `<impl><suffix>_<ms>` times (`ms`: "ms" eager, "graph_ms" from CUDA
    graphs; `suffix`: "" or "_rope", the step with RoPE on the new queries), each key
    headed by `prefix`: `vs_<baseline>` / `rope_vs_<baseline>` (baseline / AttnFuse),
    `paged_vs_contiguous`, `lens_vs_contiguous`, and against the baseline pipeline
    `paged_vs_no_split`, `lens_vs_no_split`."""
    sdpa = [row[f"{impl}{suffix}_{ms}"] for impl in ("sdpa", "sdpa_gqa_mask") if f"{impl}{suffix}_{ms}" in row]
    if sdpa:
        row[f"sdpa_best{suffix}_{ms}"] = min(sdpa)
    ours = row.get(f"attnfuse{suffix}_{ms}")
    if ours is None:
        return
    head = prefix + suffix.lstrip("_") + ("_" if suffix else "")
    for other, impl in (("sdpa", "sdpa_best"), ("flex", "flex"), ("no_split", "attnfuse_no_split"),
                        ("flash", "flash_kvcache")):
        if f"{impl}{suffix}_{ms}" in row:
            row[f"{head}vs_{other}"] = row[f"{impl}{suffix}_{ms}"] / ours
    for form in ("paged", "lens") if not suffix else ():
        if f"attnfuse_{form}_{ms}" in row:
            row[f"{prefix}{form}_vs_contiguous"] = ours / row[f"attnfuse_{form}_{ms}"]
    for form in ("paged", "lens") if not suffix else ():
        if f"attnfuse_{form}_no_split_{ms}" in row and f"attnfuse_{form}_{ms}" in row:
            row[f"{prefix}{form}_vs_no_split"] = row[f"attnfuse_{form}_no_split_{ms}"] / row[f"attnfuse_{form}_{ms}"]


def _cell(row: dict[str, Any], key: str) -> str:
    """A time of the tables: ms, "err" where that implementation failed (`<impl>_error`,
    or SDPA's reference), blank where the run did not time it."""
    if key in row:
        return f"{row[key]:.4f}"
    impl = key.removesuffix("_ms").removesuffix("_graph").replace("sdpa_best", "sdpa")
    return "err" if f"{impl}_error" in row or (impl.startswith("sdpa") and "reference_error" in row) else ""


def summary(rows: list[dict[str, Any]]) -> str:
    lines = _graph_summary(rows) + ["| B | Skv | Sq | splits | AttnFuse ms | baseline pipeline ms | paged ms | SDPA ms (best) | flex ms | vs SDPA "
             "| vs flex | vs baseline pipeline | paged vs contiguous |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cell = [_cell(r, k) for k in
                ("attnfuse_ms", "attnfuse_no_split_ms", "attnfuse_paged_ms", "sdpa_best_ms", "flex_ms")]
        ratio = [f"{r[k]:.2f}" if k in r else "" for k in ("vs_sdpa", "vs_flex", "vs_no_split", "paged_vs_contiguous")]
        lines.append(f"| {r['batch']} | {r['kv_len']} | {r['q_len']} | {r.get('splits', '')} | {' | '.join(cell)} "
                     f"| {' | '.join(ratio)} |")
    return "\n".join(lines) + "\n"


def _graph_summary(rows: list[dict[str, Any]]) -> list[str]:
    """The CUDA-graph table (rows timed with --graphs), then a blank line; [] without them."""
    if not any("attnfuse_graph_ms" in r for r in rows):
        return []
    lines = ["CUDA-graph replay, ms per call:", "",
             "| B | Skv | Sq | AttnFuse | paged | with lengths | SDPA (best) | flex | baseline pipeline "
             "| paged, baseline pipeline | with lengths, baseline pipeline | vs SDPA | vs flex "
             "| vs baseline pipeline | paged vs contiguous | paged vs baseline pipeline | lengths vs contiguous "
             "| lengths vs baseline pipeline |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cell = [_cell(r, k) for k in
                ("attnfuse_graph_ms", "attnfuse_paged_graph_ms", "attnfuse_lens_graph_ms", "sdpa_best_graph_ms",
                 "flex_graph_ms", "attnfuse_no_split_graph_ms", "attnfuse_paged_no_split_graph_ms",
                 "attnfuse_lens_no_split_graph_ms")]
        ratio = [f"{r[k]:.2f}" if k in r else "" for k in ("graph_vs_sdpa", "graph_vs_flex", "graph_vs_no_split",
                                                          "graph_paged_vs_contiguous", "graph_paged_vs_no_split",
                                                          "graph_lens_vs_contiguous", "graph_lens_vs_no_split")]
        lines.append(f"| {r['batch']} | {r['kv_len']} | {r['q_len']} | {' | '.join(cell)} | {' | '.join(ratio)} |")
    if any("attnfuse_rope_graph_ms" in r for r in rows):
        lines += ["", "With RoPE on the new queries (AttnFuse fused; SDPA and flex after a compiled RoPE), CUDA graphs, "
                  "ms per call:", "", "| B | Skv | Sq | AttnFuse | aligned, no positions | positions built per call "
                  "| SDPA (best) | flex | vs SDPA | vs flex |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            cell = [_cell(r, k) for k in
                    ("attnfuse_rope_graph_ms", "attnfuse_rope_end_graph_ms", "attnfuse_rope_pos_ops_graph_ms",
                     "sdpa_best_rope_graph_ms", "flex_rope_graph_ms")]
            ratio = [f"{r[k]:.2f}" if k in r else "" for k in ("graph_rope_vs_sdpa", "graph_rope_vs_flex")]
            lines.append(f"| {r['batch']} | {r['kv_len']} | {r['q_len']} | {' | '.join(cell)} | {' | '.join(ratio)} |")
    return [*lines, "", "Eager calls (do_bench), ms per call:", ""]


def _flash_attn_version() -> str | None:
    """The installed flash_attn's version (its baseline rows `flash_kvcache_*`), or None."""
    try:
        import flash_attn
    except ImportError:
        return None
    return str(getattr(flash_attn, "__version__", "unknown"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--kv", default="1024,8192,32768,131072")
    parser.add_argument("--sq", default="1,4,16")
    parser.add_argument("--pipeline", default=DEFAULT_PIPELINE, help="AttnFuse's pipeline (default: the default one)")
    parser.add_argument("--baseline-pipeline", default=None,
                        help="a second AttnFuse pipeline timed in the same run, `attnfuse_no_split_*` and "
                             "`vs_no_split` (default: the default one without split-kv), e.g. the default with "
                             "'split-kv{merge=false}' for an A/B of one option; with --page-size the paged program "
                             "too (`attnfuse_paged_no_split_*`, `paged_vs_no_split`), and the program with lengths "
                             "(`attnfuse_lens_no_split_*`, `lens_vs_no_split`)")
    parser.add_argument("--no-baseline-pipeline", action="store_true",
                        help="skip timing a second pipeline")
    parser.add_argument("--page-size", type=int, default=16,
                        help="page size of the paged KV cache rows (0: no paged rows)")
    parser.add_argument("--graphs", action="store_true",
                        help="also time every call replayed from a CUDA graph (`<impl>_graph_ms`)")
    parser.add_argument("--no-flex", action="store_true", help="skip flex_attention (it compiles per shape)")
    parser.add_argument("--rope", action="store_true",
                        help="also time the step with RoPE on the new queries (`<impl>_rope_*`, `rope_vs_*`)")
    parser.add_argument("--kernels", action="store_true",
                        help="also record each call's GPU time per kernel (`<impl>_kernel_us`, torch.profiler)")
    args = parser.parse_args()
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    baseline = None if args.no_baseline_pipeline else (args.baseline_pipeline
                                                        or default_pipeline(without=["split-kv"]))
    args.out.mkdir(parents=True, exist_ok=True)

    def write(rows: list[dict[str, Any]]) -> None:  # after every row: a cut-short run keeps what it measured
        (args.out / "decode.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "pipeline": args.pipeline, "baseline_pipeline": baseline,
             "page_size": args.page_size,
             "flash_attn": _flash_attn_version(), "rows": rows}, indent=1))
        (args.out / "decode.md").write_text(summary(rows))

    rows = run(ints(args.batches), ints(args.kv), ints(args.sq), args.pipeline, baseline, args.page_size,
               graphs=args.graphs, flex=not args.no_flex, kernels=args.kernels, rope=args.rope, on_row=write)
    print(summary(rows))


if __name__ == "__main__":
    main()
