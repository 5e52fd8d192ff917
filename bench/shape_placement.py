"""Where the per-shape-class RoPE placement lands (needs CUDA): calls without autograd of
Llama-3-8B attention (examples/llama3.attn, bf16, RoPE + causal) compiled by default
(the cost model's placement per shape class, `attnfuse.placement_versions`) against
the same program with `hybrid` and `fused` pinned in the pipeline, and SDPA.

For each (B, S): the launches of the default's plan, the largest difference between
the default's output and `hybrid`'s, and per implementation `wall_us` (back-to-back
calls) and `gpu_us` (profiler), as in bench_overhead.py.

    python bench/shape_placement.py [--out rows.json] [--shapes 1x128,1x256,4x512]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

import attnfuse
from attnfuse import examples
from attnfuse.passes import default_pipeline
from attnfuse.runtime.host import call_signature
from attnfuse.runtime.launch import KernelLaunch
from bench_overhead import gpu_us, wall_us

SHAPES = "1x128,1x256,1x512,1x1024,1x2048,4x512,8x2048"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--shapes", default=SHAPES, help=f"BxS,... (default {SHAPES})")
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("shape_placement.py needs a CUDA GPU")
    text = examples.path("llama3").read_text()
    default = attnfuse.compile(text)
    pinned = {s: attnfuse.compile(text.replace("@llama3", f"@llama3_{s}"),
                                  pipeline=default_pipeline({"rope-fusion": f"strategy={s}"}))
              for s in ("hybrid", "fused")}
    rows = []
    for shape in args.shapes.split(","):
        b, s = (int(x) for x in shape.split("x"))
        q = torch.randn(b, 32, s, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, 8, s, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out = default(q, k, v)
        plan = default._runner.inference[call_signature([q, k, v])]  # noqa: SLF001
        row = {"batch": b, "seq": s, "default_launches": sum(isinstance(step, KernelLaunch) for step in plan.lean),
               "max_diff_default_vs_hybrid": float((out.float() - pinned["hybrid"](q, k, v).float()).abs().max())}
        impls = {"default": lambda: default(q, k, v), "hybrid": lambda: pinned["hybrid"](q, k, v),
                 "fused": lambda: pinned["fused"](q, k, v),
                 "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)}
        for name, fn in impls.items():
            row[name] = {"wall_us": wall_us(fn, args.calls), "gpu_us": gpu_us(fn, 100)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
