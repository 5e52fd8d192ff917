"""Split-KV decoding at real sizes on the GPU (issue 11, item 1).

* Llama-3-8B decode shapes (32 / 8 heads, D = 128, bf16, bottom-right causal): the
  split kernel serves the call, the output is within 2x SDPA's own bf16 error of the
  float64 reference and the lse within fp32 tolerance of the reference's;
* building blocks at decode sizes (RoPE of the new queries at the cache offset, gpt-oss
  sinks + 128-key window, Gemma 2 softcap + 4096-key window with D = 256, ALiBi);
* one compiled split kernel (and combine kernel) serves every length and batch: the
  split count changes, Triton compiles each kernel once;
* with `split-kv{merge=true}`, the last split program merging the splits, in two CUDA graphs of one plan replayed
  at once and between eager calls;
* a training step whose forward runs split: gradients against the reference.

Run on the GPU machine: `python -m pytest tests/gpu/test_split_kv_gpu.py -q`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from programs import Builder, Program, reference_lse  # noqa: E402
from split_kv_check import relative_error, torch_output  # noqa: E402

import attnfuse  # noqa: E402
from attnfuse import reference  # noqa: E402
from attnfuse.runtime.host import call_signature  # noqa: E402
from attnfuse.runtime.loader import load_kernels  # noqa: E402
from attnfuse.testing import assert_close, assert_grad_close  # noqa: E402

pytestmark = pytest.mark.gpu

BR = {"align": "bottom_right"}


def _cache_positions(g: torch.Generator, b: int, sq: int, skv: int) -> torch.Tensor:
    return torch.arange(skv - sq, skv, dtype=torch.int32).repeat(b, 1)


def llama3(rope: bool = False) -> Program:
    b = Builder("decode", hq=32, hkv=8, d=128, dtype="bf16")
    if rope:
        pos = b.arg("pos", "tensor<?x?xi32>", _cache_positions)
        b.rope("q", positions=pos, theta=500000.0)
    return b.mask("causal", **BR).build()


def _cuda(args: list[Any]) -> list[Any]:
    return [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]


def _split_launches(fn: attnfuse.api.AttentionFunction, args: list[Any]) -> dict[str, Any]:
    plan = fn._host.plan(call_signature(args))  # noqa: SLF001
    assert plan is not None
    return {s.meta.name: s.grid for s in plan.steps if hasattr(s, "meta")}


def check(program: Program, batch: int, q_len: int, kv_len: int, seed: int = 0) -> dict[str, Any]:
    """Run the default pipeline on the GPU; compare with the float64 reference within
    2x the error of PyTorch's own bf16 attention; return the launches of the call."""
    fn = attnfuse.compile(program.text)
    args = _cuda(program.inputs(batch, q_len, kv_len, seed))
    out, lse = fn(*args, return_lse=True)
    ran = _split_launches(fn, args)
    tiers = {f"{program.name}_split_kv{tier}" for tier in ("", "_small", "_wide", "_persistent")} & set(ran)
    assert len(tiers) == 1 and f"{program.name}_fwd" not in ran, ran
    want = reference.run(program.text, *args)
    want = want[0] if isinstance(want, tuple) else want
    ours, theirs = relative_error(out, want), relative_error(torch_output(program, args), want)
    assert ours <= 2 * max(theirs, torch.finfo(torch.bfloat16).eps), (ours, theirs)
    assert_close(lse, reference_lse(program, args), torch.float32 if "rope" not in program.text else torch.bfloat16)
    return ran


@pytest.mark.parametrize(("batch", "kv_len", "q_len"), [
    (1, 131072, 1), (1, 8192, 16), (1, 1000, 4), (16, 8192, 1), (16, 32768, 4), (64, 4096, 16), (64, 1024, 1),
])
def test_llama3_decode(batch: int, kv_len: int, q_len: int) -> None:
    check(llama3(), batch, q_len, kv_len)


def test_rope_at_cache_offset() -> None:
    check(llama3(rope=True), 4, 4, 8191)


def test_rope_aligned_at_the_cache_end() -> None:
    """`align = "bottom_right"`: the queries rotated at `Skv - Sq + i` in the split
    kernel, with no positions operand (Llama-3 scaling, up to 128k positions)."""
    b = Builder("decode_end", hq=32, hkv=8, d=128, dtype="bf16")
    b.rope("q", theta=500000.0, scaling="llama3", factor=8.0, align="bottom_right")
    p = b.mask("causal", **BR).build()
    check(p, 4, 4, 8191)
    check(p, 1, 1, 131072)
    ran = check(p, 48, 1, 1000)  # 384 pairs of 16 blocks: the persistent kernel, rotating in its pair loop
    assert "decode_end_split_kv_persistent" in ran, ran


def test_gpt_oss_sinks_window() -> None:
    b = Builder("gpt_oss", hq=64, hkv=8, d=64, dtype="bf16")
    p = b.mask("causal", **BR).mask("sliding_window", left=127, **BR).build(sinks=True)
    ran = check(p, 8, 1, 16384)
    assert ran["gpt_oss_split_kv_small"][0] == 2  # 8 packed rows; 128 keys reached: two splits of one block
    check(p, 2, 4, 16384)


def test_gemma2_softcap_window_d256() -> None:
    b = Builder("gemma2", hq=16, hkv=8, d=256, dtype="bf16")
    p = b.softcap(50.0).mask("causal", **BR).mask("sliding_window", left=4095, **BR).build()
    check(p, 2, 1, 32768)


def test_alibi() -> None:
    p = Builder("alibi", hq=32, hkv=8, d=128, dtype="bf16").alibi().mask("causal", **BR).build()
    check(p, 2, 4, 20000)


def test_one_kernel_serves_every_length() -> None:
    """Lengths and batches give different split counts; Triton compiles the split and
    combine kernels once each (their scalars are not specialized, the workspace strides
    are multiples of 16)."""
    p = llama3()
    # Renamed: other tests compile this program with other Sq (other lse strides) into the same kernels.
    assert "@decode(" in p.text
    fn = attnfuse.compile(p.text.replace("@decode(", "@decode_variants("))
    splits, launched = set(), set()
    for batch, kv_len in ((1, 1000), (1, 4096), (1, 65536), (16, 8192), (32, 4096), (64, 4096), (64, 1024),
                           (3, 12345)):
        args = _cuda(p.inputs(batch, 1, kv_len, 0))
        fn(*args)
        # 4 packed rows: the 16-row kernels within one wave (the wide one for splits of
        # at least 4 blocks), beyond two programs per SM (B = 64) the persistent one for
        # short caches (1024 keys) and the wide one for longer ones, else the full one
        # (B = 32); the 16-row kernels merge their splits
        ran = _split_launches(fn, args)
        launched |= set(ran)
        splits.add(max(ran.get(f"decode_variants_split_kv{tier}", (0,))[0] for tier in ("", "_small", "_wide")))
    torch.cuda.synchronize()
    assert len(splits) >= 3, splits
    assert {"decode_variants_split_kv", "decode_variants_split_kv_small", "decode_variants_split_kv_wide",
            "decode_variants_split_kv_persistent"} <= launched
    kernels = load_kernels(fn.triton_source)
    for name in ("decode_variants_split_kv", "decode_variants_split_kv_small", "decode_variants_split_kv_wide",
                 "decode_variants_split_kv_persistent", "decode_variants_split_kv_combine"):
        compiled = sum(len(cache[0]) for cache in kernels[name].device_caches.values())
        assert compiled == int(name in launched), f"{name}: {compiled} compiled variants"


def test_merged_splits_in_cuda_graphs() -> None:
    """`split-kv{merge=true}` (the default), B = 1, Skv = 8192: 16 splits that the last split program
    merges, counting on per-(batch, KV head) counters that must start each call at zero. Two graphs
    captured from the same launch plan (each takes its own zeroed counters), eager
    calls between their replays, and both graphs replayed on two streams at once:
    every output matches the reference on its own inputs."""
    p = llama3()
    fn = attnfuse.compile(p.text.replace("@decode(", "@decode_graphs("))
    inputs = [_cuda(p.inputs(1, 1, 8192, seed)) for seed in range(4)]
    wants = [reference.run(p.text, *args).float() for args in inputs]
    static = [[a.clone() for a in inputs[0]] for _ in range(2)]
    fn(*static[0])
    assert "decode_graphs_split_kv_combine" not in _split_launches(fn, static[0])
    graphs, outs = [], []
    for args in static:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append(fn(*args))
        graphs.append(graph)

    def close(out: torch.Tensor, want: torch.Tensor) -> bool:
        return float((out.float() - want).abs().max()) <= 2e-2

    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for step in range(6):
        for g, args in enumerate(static):
            for dst, src in zip(args, inputs[(step + g) % 4]):
                dst.copy_(src)
        torch.cuda.synchronize()
        if step % 2:
            for graph, stream in zip(graphs, streams):
                with torch.cuda.stream(stream):
                    graph.replay()
        else:
            for graph in graphs:
                graph.replay()
        eager = fn(*inputs[(step + 2) % 4])
        torch.cuda.synchronize()
        assert close(eager, wants[(step + 2) % 4])
        for g, out in enumerate(outs):
            assert close(out, wants[(step + g) % 4]), (step, g)


def test_training_step_with_split_forward() -> None:
    p = Builder("train", hq=32, hkv=8, d=128, dtype="bf16").rope().mask("causal", **BR).build(sinks=True)
    fn = attnfuse.compile(p.text)
    args = _cuda(p.inputs(2, 8, 3000, 1))
    leaves = [a.detach().requires_grad_(True) for a in args]
    out = fn(*leaves)
    assert "train_split_kv" in _split_launches(fn, args)  # 8 queries x 4 heads: the full tile
    g = torch.randn_like(out)
    out.backward(g)
    refs = [a.detach().double().requires_grad_(True) for a in args]
    reference.run(p.text, *refs).backward(g.double())
    for leaf, ref, name in zip(leaves, refs, ("q", "k", "v", "sinks")):
        assert_grad_close(leaf.grad, ref.grad, torch.bfloat16, name)
