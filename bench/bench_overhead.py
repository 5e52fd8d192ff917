"""Per-call host overhead and compiled variants: AttnFuse vs SDPA and flex_attention (needs CUDA).

Llama-3-8B attention (32/8 heads, D=128, bf16, causal; AttnFuse also applies RoPE) at
B=1, S=128, where a call is host-bound. For each implementation:

* `wall_us`: wall time per call over many back-to-back calls (synchronized at the end);
* `gpu_us`: the GPU time of the kernels of one call (from the profiler, summed);
* `host_us` = `wall_us - gpu_us`: what the host adds (issue 7 target: < 30 us for AttnFuse);
* `issue_us`: the host's time to issue one call, timed over 100 calls without waiting for
  the GPU (median of 30): the host's own cost also where the GPU time is the longer one,
  where `wall_us - gpu_us` measures the gaps between the kernels instead.

The same for one decode step (B = 1, Sq = 1 against 8192 cached keys; issue 11's serving
target: < 20 us): AttnFuse on a paged cache (bench/decode.py's program, pages of 16 keys)
and on a contiguous one, SDPA on the contiguous one. Then a decode loop whose cache grows
by one key per call (views of one preallocated cache, 8192 keys and up): every call is a
new shape class, so AttnFuse builds a launch plan each time; median wall time per
synchronized call against SDPA's.

Then AttnFuse's compiled variants per kernel (entries in Triton's kernel cache) after
calls at S in {127, 128, 129, 2048, 2049, 4096} and B in {1, 3} (target: at most 2),
the kernels of the placement versions that short calls run included
(`attnfuse.placement_versions`).

    python bench/bench_overhead.py [--out overhead.json] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import attnfuse
from attnfuse import examples
from attnfuse.runtime.loader import load_kernels

HQ, HKV, D = 32, 8, 128
LENGTHS = (127, 128, 129, 2048, 2049, 4096)
BATCHES = (1, 3)


def wall_us(fn: Callable[[], Any], calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def issue_us(fn: Callable[[], Any], calls: int = 100, repeats: int = 30) -> float:
    """Median host time per call to issue `calls` calls without waiting for the GPU (the
    launch queue holds them all): the host's own cost, whether the GPU or the host is the
    slower of the two (`wall_us - gpu_us` is that only for host-bound calls)."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def gpu_us(fn: Callable[[], Any], calls: int = 200) -> float:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(e.self_device_time_total for e in prof.key_averages() if e.self_device_time_total > 0)
    return total / calls


def implementations(batch: int, seq: int) -> dict[str, Callable[[], Any]]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q = torch.randn(batch, HQ, seq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, HKV, seq, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, HKV, seq, D, device="cuda", dtype=torch.bfloat16)
    fn = attnfuse.compile(examples.path("llama3"))
    flex = torch.compile(flex_attention)
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seq, seq, device="cuda")
    return {
        "attnfuse (llama3, RoPE + causal)": lambda: fn(q, k, v),
        "sdpa (causal)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        "flex_attention (causal block mask)": lambda: flex(q, k, v, block_mask=mask, enable_gqa=True),
    }


def decode_implementations(kv_len: int = 8192) -> dict[str, Callable[[], Any]]:
    from decode import PAGED_PROGRAM, PROGRAM, page_cache

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, HQ, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, HKV, kv_len, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    contiguous = attnfuse.compile(PROGRAM)
    paged = attnfuse.compile(PAGED_PROGRAM, params={"page": 16})
    k_cache, v_cache, table, lens = page_cache(k, v, 16, g)
    return {
        f"attnfuse decode (paged, Skv={kv_len})": lambda: paged(q, k_cache, v_cache, table, lens),
        f"attnfuse decode (contiguous, Skv={kv_len})": lambda: contiguous(q, k, v),
        f"sdpa decode (Skv={kv_len})": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    }


def growing_cache_us(steps: int = 200, start: int = 8192) -> dict[str, float]:
    """Median wall us per synchronized decode call, the cache one key longer each call."""
    from decode import PROGRAM

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, HQ, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, HKV, start + steps, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    fn = attnfuse.compile(PROGRAM)
    impls = {"attnfuse (new shape class per call)": lambda n: fn(q, k[:, :, :n], v[:, :, :n]),
             "sdpa": lambda n: F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True)}
    result = {}
    for name, call in impls.items():
        call(start - 1)  # compile / warm up
        torch.cuda.synchronize()
        times = []
        for n in range(start, start + steps):
            begin = time.perf_counter()
            call(n)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - begin) * 1e6)
        result[name] = sorted(times)[len(times) // 2]
    return result


def variants() -> dict[str, int]:
    """Compiled variants per AttnFuse kernel after calls at every (B, S)."""
    fn = attnfuse.compile(examples.path("llama3"))
    for batch in BATCHES:
        for seq in LENGTHS:
            q = torch.randn(batch, HQ, seq, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch, HKV, seq, D, device="cuda", dtype=torch.bfloat16)
            fn(q, k, k)
    torch.cuda.synchronize()
    device = torch.cuda.current_device()
    versions = fn._runner.versions  # noqa: SLF001 - the placements run per shape class
    sources = {"": fn.triton_source} | {
        f" ({placement} version)": host.source for placement, host in (versions.lowered if versions else {}).items()}
    return {
        name + suffix: len(kernel.device_caches[device][0])
        for suffix, source in sources.items()
        for name, kernel in load_kernels(source, interpret=False).items()
        if device in kernel.device_caches
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_overhead.py needs a CUDA GPU")
    rows = []
    for seq, impls in ((128, implementations(1, 128)), (1, decode_implementations())):
        for name, fn in impls.items():
            wall, gpu, issue = wall_us(fn, args.calls), gpu_us(fn), issue_us(fn)
            rows.append({"impl": name, "batch": 1, "seq": seq, "wall_us": wall, "gpu_us": gpu, "host_us": wall - gpu,
                         "issue_us": issue})
    print(f"{'implementation (B=1; S=128 or decode)':44} {'wall us':>9} {'gpu us':>9} {'host us':>9} {'issue us':>9}")
    for r in rows:
        print(f"{r['impl']:44} {r['wall_us']:9.1f} {r['gpu_us']:9.1f} {r['host_us']:9.1f} {r['issue_us']:9.1f}")
    growing = growing_cache_us()
    print("\ndecode, cache growing by one key per call (median wall us, synchronized):")
    for name, us in growing.items():
        print(f"  {name:40} {us:9.1f}")
    counts = variants()
    print(f"\ncompiled variants per kernel, S in {LENGTHS}, B in {BATCHES}:")
    for name, count in counts.items():
        print(f"  {name:40} {count}")
    result = {"device": torch.cuda.get_device_name(), "overhead": rows, "growing_cache_us": growing, "variants": counts,
              "lengths": LENGTHS, "batches": BATCHES}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
