"""Where the host time of one AttnFuse call goes (needs CUDA).

Llama-3-8B attention (examples/llama3.attn) at B=1, S=128, no autograd. Two figures per
implementation, next to SDPA in the same process:

* `issue_us`: CPU time of a call alone (perf_counter around each call, no
  synchronization; the GPU queue never fills at this size, so launches return at once);
* a cProfile of --calls calls (the top functions by own time), for AttnFuse only.

    python bench/host_profile.py [--out DIR] [--calls 3000]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import attnfuse
from attnfuse import examples


def issue_us(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
        if i % 64 == 63:
            torch.cuda.synchronize()  # keep the queue short
    torch.cuda.synchronize()
    return {"median": statistics.median(times), "p10": sorted(times)[len(times) // 10],
            "mean": statistics.fmean(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    q = torch.randn(1, 32, 128, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 128, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 8, 128, 128, device="cuda", dtype=torch.bfloat16)
    fn = attnfuse.compile(examples.path("llama3"))
    impls: dict[str, Callable[[], Any]] = {
        "attnfuse": lambda: fn(q, k, v),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        "torch.empty x3": lambda: (torch.empty(1, 32, 128, 128, device="cuda", dtype=torch.bfloat16),
                                   torch.empty(1, 32, 128, device="cuda"),
                                   torch.empty(1, 8, 128, 128, device="cuda", dtype=torch.bfloat16)),
    }
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "issue_us": {}}
    for name, impl in impls.items():
        result["issue_us"][name] = issue_us(impl, args.calls)
        print(f"{name:20} {result['issue_us'][name]}", flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        fn(q, k, v)
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    result["profile"] = text.getvalue()
    print(result["profile"])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_profile.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
