"""Paged KV caches at real sizes on the GPU (issue 11, item 2).

* Llama-3-8B decode and prefill against a paged cache (32 / 8 heads, D = 128, bf16,
  pages of 16, shuffled block tables, lengths that are not multiples of the page size):
  the split kernel serves decode calls, the forward kernel prefill calls, and the output
  is within 2x PyTorch's own bf16 error of the float64 reference;
* building blocks at decode sizes (RoPE on the new queries at the cache offset, gpt-oss
  sinks + 128-key window, Gemma 2 softcap + window with D = 256, ALiBi);
* `append_paged_kv` with Llama-3 RoPE followed by attention, against the contiguous
  reference;
* pools beyond i32 offsets (reported so) take the split kernel with i64 offsets;
* one compiled kernel serves every length (lengths are data, not shapes);
* a contiguous cache with per-sequence lengths (`kv_lens` without a block table).

Run on the GPU machine: `python -m pytest tests/gpu/test_paged_gpu.py -q`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from paged_programs import BR, PagedProgram, inputs, paged, torch_output  # noqa: E402
from split_kv_check import relative_error  # noqa: E402

import attnfuse  # noqa: E402
from attnfuse import reference  # noqa: E402
from attnfuse.inference import append_paged_kv  # noqa: E402
from attnfuse.runtime.host import call_signature  # noqa: E402
from attnfuse.runtime.loader import load_kernels  # noqa: E402

pytestmark = pytest.mark.gpu

CAUSAL = f"attn.mask causal {{x}} {BR} : {{s}}"


def llama3(rope: bool = False) -> PagedProgram:
    p = paged(32, 8, 128, dtype="bf16", page=16, rope="{theta = 500000.0}" if rope else None, score_ops=[CAUSAL])
    p.heads = 32
    return p


def _launches(fn: attnfuse.api.AttentionFunction, args: list[Any]) -> dict[str, Any]:
    plan = fn._host.plan(call_signature(args))  # noqa: SLF001
    assert plan is not None
    return {s.meta.name: s.grid for s in plan.steps if hasattr(s, "meta")}


def check(program: PagedProgram, lens: list[int], q_len: int, *, split: bool = True,
          seed: int = 0) -> dict[str, Any]:
    """Run `program` on fresh inputs; its output within 2x PyTorch's bf16 error of the
    float64 reference; the launches (kernel names as for a function `@f`)."""
    fn = attnfuse.compile(program.text)
    cpu = inputs(program, lens, q_len, seed=seed, dtype=torch.bfloat16)
    args = [a.cuda() for a in cpu]
    out = fn(*args)
    out = out[0] if isinstance(out, tuple) else out
    fname = program.text.split("func.func @", 1)[1].split("(", 1)[0]
    ran = {"f" + name.removeprefix(fname): grid for name, grid in _launches(fn, args).items()}
    tiers = {"f_split_kv", "f_split_kv_small", "f_split_kv_short", "f_split_kv_wide", "f_split_kv_i64",
             "f_split_kv_persistent"} & set(ran)
    assert len(tiers) == int(split) and ("f_fwd" in ran) == (not split), ran
    want = reference.run(program.text, *cpu)
    want = want[0] if isinstance(want, tuple) else want
    ours, theirs = relative_error(out.cpu(), want), relative_error(torch_output(program, cpu), want)
    assert ours <= 2 * max(theirs, torch.finfo(torch.bfloat16).eps), (ours, theirs)
    return ran


@pytest.mark.parametrize(("lens", "q_len", "split"), [
    ([8191], 1, True), ([1000, 8191, 17, 4096], 4, True), ([300] * 16, 16, True), ([2000, 700], 17, False),
    ([5000, 33], 128, False),
])
def test_llama3(lens: list[int], q_len: int, split: bool) -> None:
    check(llama3(), lens, q_len, split=split)


def test_many_sequences_take_the_persistent_kernel() -> None:
    """72 sequences x 8 KV heads, more pairs than two per SM, a block table of 1024 keys
    (`PERSISTENT_MAX_BLOCKS` blocks of 64, one spare page): the persistent kernel, its
    programs walking pairs of different lengths (1 to 1008 keys)."""
    lens = [1 + (37 * i * i) % 1008 for i in range(72)]
    ran = check(llama3(), lens, 1)
    assert "f_split_kv_persistent" in ran, ran


def test_pools_beyond_i32_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools that i32 offsets do not reach (reported so) take the split kernel with i64
    offsets."""
    monkeypatch.setattr("attnfuse.runtime.host.fits_i32", lambda tensors: False)
    program = llama3()
    program.text = program.text.replace("@f(", "@big_pools(")  # compiled programs and their plans are shared
    assert "f_split_kv_i64" in check(program, [8191, 100, 3000], 1)


def test_rope_at_cache_offset() -> None:
    check(llama3(rope=True), [8191, 100, 3000, 4], 4)


@pytest.mark.parametrize(("q_len", "split"), [(4, True), (37, False)])
def test_rope_aligned_at_each_sequence_end(q_len: int, split: bool) -> None:
    """`align = "bottom_right"`, no positions operand: each sequence's queries rotated at
    `kv_lens[b] - Sq + i` in the split kernel (decode) or the forward kernel (a chunk)."""
    from test_rope_bottom_right import bottom_right

    check(bottom_right(llama3(rope=True)), [8191, 100, 3000, 40], q_len, split=split)


def test_gpt_oss_sinks_window() -> None:
    p = paged(64, 8, 64, dtype="bf16", page=16, sinks=True, score_ops=[
        CAUSAL, 'attn.mask sliding_window {x} {{align = "bottom_right", left = 127}} : {s}'])
    p.heads = 64
    check(p, [16384, 200, 7], 1)


def test_gemma2_softcap_window_d256() -> None:
    p = paged(16, 8, 256, dtype="bf16", page=16, score_ops=[
        "attn.softcap {x} {{cap = 50.0}} : {s}", CAUSAL,
        'attn.mask sliding_window {x} {{align = "bottom_right", left = 4095}} : {s}'])
    p.heads = 16
    check(p, [32768, 5000], 1)


def test_alibi() -> None:
    p = paged(32, 8, 128, dtype="bf16", page=16, score_ops=["attn.bias alibi {x} : {s}", CAUSAL])
    p.heads = 32
    check(p, [20000, 3], 4)


def test_append_then_attend() -> None:
    """Append 7 new tokens with Llama-3 RoPE into a cache of 4000, then attend with the
    new queries at the cache offset; the reference rotates the contiguous keys."""
    p = llama3(rope=True)
    rope = {"theta": 500000.0}
    g = torch.Generator().manual_seed(0)
    pages, page, batch, cached, new = 1024, 16, 2, 4000, 7
    k_cache = torch.randn(pages, 8, page, 128, generator=g).to(torch.bfloat16).cuda()
    v_cache = torch.randn(pages, 8, page, 128, generator=g).to(torch.bfloat16).cuda()
    table = torch.randperm(pages, generator=g)[:batch * 300].view(batch, 300).to(torch.int32).cuda()
    lens = torch.full((batch,), cached, dtype=torch.int32, device="cuda")
    k, v = (torch.randn(batch, 8, new, 128, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
    lens = append_paged_kv(k_cache, v_cache, table, lens, k, v, rope=rope, check_values=True)
    q = torch.randn(batch, 32, new, 128, generator=g).to(torch.bfloat16).cuda()
    pos = torch.arange(cached, cached + new, dtype=torch.int32, device="cuda").repeat(batch, 1)
    out = attnfuse.compile(p.text)(q, k_cache, v_cache, table, lens, pos)
    args = [q, k_cache, v_cache, table, lens, pos]
    want = reference.run(p.text, *[a.cpu() for a in args])
    ours = relative_error(out.cpu(), want)
    theirs = relative_error(torch_output(p, [a.cpu() for a in args]), want)
    assert ours <= 2 * max(theirs, torch.finfo(torch.bfloat16).eps), (ours, theirs)
    # the new keys are rotated: rows 0..6 of page table[b, 250] (4000 = 250 * 16) against the reference rope
    ty = "tensor<?x8x?x128xf32>"
    rope_text = (f"func.func @r(%k: {ty}, %pos: tensor<?x?xi32>) -> {ty} {{\n  %r = attn.rope %k positions %pos "
                 f"{{theta = 500000.0}} : {ty}, tensor<?x?xi32>\n  func.return %r : {ty}\n}}")
    rotated = reference.run(rope_text, k.cpu().float(), pos.cpu())
    stored = k_cache[table[:, cached // page].long(), :, cached % page:cached % page + new].cpu().double()
    assert (stored - rotated).abs().max() < 3e-2


def test_one_kernel_serves_every_length() -> None:
    """Lengths are data: new lengths (and new pool sizes) reuse the compiled kernels. Strides
    stay specialized (backends/triton/metadata.py): the block tables here have rows of 64
    and 257 pages, one stride divisible by 16 and one not, hence at most two variants."""
    p = llama3()
    fn = attnfuse.compile(p.text.replace("@f(", "@paged_variants("))
    for n, lens in enumerate(([1000], [4096, 3], [65536], [12345, 1, 77])):
        fn(*[a.cuda() for a in inputs(p, lens, 1, seed=n, dtype=torch.bfloat16)])
    torch.cuda.synchronize()
    kernels = load_kernels(fn.triton_source)
    for name in ("paged_variants_split_kv", "paged_variants_split_kv_small", "paged_variants_split_kv_short",
                 "paged_variants_split_kv_wide", "paged_variants_split_kv_combine"):
        compiled = sum(len(cache[0]) for cache in kernels[name].device_caches.values())
        assert compiled <= 2, f"{name}: {compiled} compiled variants"


@pytest.mark.parametrize(("lens", "q_len", "split"), [([8191], 1, True), ([1000, 8191, 17, 4096], 4, True),
                                                      ([2000, 700], 17, False)])
def test_llama3_contiguous_cache_with_lengths(lens: list[int], q_len: int, split: bool) -> None:
    """A contiguous cache of 8192 keys per sequence with `kv_lens` (no block table), rows
    past each length NaN: decode (split kernels) and prefill (forward kernel)."""
    from test_cache_lengths import cache_inputs, contiguous

    p = contiguous(llama3())
    fn = attnfuse.compile(p.text)
    cpu = cache_inputs(p, lens, q_len, dtype=torch.bfloat16, capacity=8192)
    args = [a.cuda() for a in cpu]
    out = fn(*args)
    ran = _launches(fn, args)
    assert bool({"f_split_kv", "f_split_kv_small", "f_split_kv_wide", "f_split_kv_persistent"} & set(ran)) == split and ("f_fwd" in ran) == (not split), ran
    assert not torch.isnan(out).any()
    want = reference.run(p.text, *cpu)
    ours, theirs = relative_error(out.cpu(), want), relative_error(torch_output(p, cpu), want)
    assert ours <= 2 * max(theirs, torch.finfo(torch.bfloat16).eps), (ours, theirs)
