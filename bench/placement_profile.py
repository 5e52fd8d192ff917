"""Per-kernel GPU time of each RoPE placement's forward at a few S (issue 9; needs CUDA).

The cost sweep (`cost_sweep.py`) times whole calls; this splits a call into its kernels
(torch.profiler, averaged over `--iters` calls) so the difference between two placements
can be put on the kernel that carries it (e.g. `hybrid` against `separate` at long S):

    python bench/placement_profile.py --out DIR --family d128_g4 --seqs 4096,32768
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from backward_profile import kernel_times
from cost_sweep import FAMILIES, HEADS, PLACEMENTS, batch_of, pipeline, program_text

import attnfuse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--family", default="d128_g4", choices=sorted(FAMILIES))
    parser.add_argument("--seqs", default="4096,32768")
    parser.add_argument("--tokens", type=int, default=16384, help="batch x S (batch at least 1)")
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    family = FAMILIES[args.family]
    text = program_text(args.family, family)
    rows: list[dict[str, Any]] = []
    compiled = {p: attnfuse.compile(text, pipeline=pipeline(p)) for p in args.placements.split(",")}
    for seq in map(int, args.seqs.split(",")):
        batch = batch_of(seq, args.tokens)
        gen = torch.Generator(device="cuda").manual_seed(seq)
        q, k, v = (torch.randn(batch, h, seq, family.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h in (HEADS, HEADS // family.group, HEADS // family.group))
        for placement, fn in compiled.items():
            with torch.no_grad():
                kernels = kernel_times(lambda fn=fn: fn(q, k, v), args.iters)
            row = {"family": args.family, "seq": seq, "batch": batch, "placement": placement,
                   "total_us": sum(kernels.values()), "kernels_us": kernels}
            print(json.dumps(row), flush=True)
            rows.append(row)
            (args.out / "placement_profile.json").write_text(json.dumps(
                {"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
