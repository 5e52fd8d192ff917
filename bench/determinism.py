"""Are AttnFuse's gradients reproducible? Llama-3-8B forward + backward run --repeats
times on the same inputs and upstream gradient, per `lower-backward` configuration:
whether every repeat gives the same bits as the first, and the largest difference.

    python bench/determinism.py --out DIR [--seq 2048] [--configs ';hopper-backward=false;...']
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from backward_profile import pipeline_with

import attnfuse
from attnfuse import examples


def check(config: str, seq: int, repeats: int) -> dict[str, object]:
    fn = attnfuse.compile(examples.path("llama3"), pipeline=pipeline_with(config))
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch = 16384 // seq
    q = torch.randn(batch, 32, seq, 128, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(batch, 8, seq, 128, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    d_out = torch.randn(batch, 32, seq, 128, device="cuda", generator=gen).to(torch.bfloat16)

    def grads() -> list[torch.Tensor]:
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward(d_out)
        return [leaf.grad for leaf in leaves]  # type: ignore[misc]

    first = grads()
    same, worst = [True] * 3, [0.0] * 3
    for _ in range(repeats - 1):
        for i, (a, b) in enumerate(zip(first, grads())):
            same[i] = same[i] and torch.equal(a, b)
            worst[i] = max(worst[i], float((a.float() - b.float()).abs().max()))
    torch.cuda.synchronize()
    return {"config": config, "seq": seq, "repeats": repeats, "bitwise_same_dq_dk_dv": same,
            "max_abs_diff_dq_dk_dv": worst}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", default=";hopper-backward=false")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for config in args.configs.split(";"):
        rows.append(check(config, args.seq, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
        (args.out / "determinism.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
