"""Where the time of Llama-3-8B forward + backward goes, kernel by kernel (needs CUDA).

For each `lower-backward` configuration (options as in a pipeline string) and each S
(B*S = 16384), compiles examples/llama3.attn with the default pipeline except for that
pass's options, checks the gradients against the first configuration's, and records:

* `fwd_bwd_ms`: forward + backward wall time (`triton.testing.do_bench`, median);
* `kernels_us`: the GPU time of every kernel of one forward + backward, by kernel name
  (torch.profiler, averaged over --iters calls);
* `bitwise_repeat`: whether a second call gives the same gradients bit for bit;
* `vs_cudnn+rope`, `vs_flex+rope`: baseline time / this time;

and the same for SDPA cuDNN and flex_attention, each with torch.compile'd RoPE, in the
same process. `--layout bshd` gives every implementation Q, K, V and the upstream
gradient as [B, H, S, D] views of [B, S, H, D] memory, as Hugging Face models do, and
compiles AttnFuse with `lower-to-tile{out-layout=bshd}` (the output stored so).

    python bench/backward_profile.py --out DIR [--seqs 2048,8192] [--configs 'a;b;...'] [--layout bshd]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

import attnfuse
from attnfuse import examples
from attnfuse.passes import default_pipeline
from run_all import Baselines, inputs

CONFIGS = (
    "",
    "dkdv-num-warps=8",
    "block-m=32 block-n=64 num-warps=8",
    "block-m=32 block-n=128 num-warps=8",
    "block-m=32 block-n=128 num-warps=8 num-stages=3",
    "block-m=64 block-n=128 num-warps=8",
    "block-m=128 block-n=64 num-warps=8",
    "block-m=128 block-n=64 num-warps=8 num-stages=3",
    "block-m=128 block-n=32 num-warps=4 num-stages=3",
    "dkdv-num-warps=8 num-stages=3",
)


def pipeline_with(options: str, layout: str = "bhsd") -> str:
    changed = {"lower-backward": options} if options else {}
    if layout == "bshd":
        changed["lower-to-tile"] = "out-layout=bshd"
    return default_pipeline(changed)


def kernel_times(fn: Callable[[], Any], iters: int) -> dict[str, float]:
    """GPU microseconds per call of every kernel `fn` launches, by name."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None)
        if device_us is None:
            device_us = event.cuda_time_total
        if device_us:
            totals[event.key[:90]] += device_us / iters
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqs", default="2048,8192")
    parser.add_argument("--configs", default=";".join(CONFIGS), help="lower-backward options, ';'-separated")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    configs = args.configs.split(";")
    for seq in (int(s) for s in args.seqs.split(",")):
        q, k, v, g = inputs(seq, grad=True)
        if args.layout == "bshd":
            q, k, v, g = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(t.requires_grad)
                          for t in (q, k, v, g))
        base = Baselines(seq)
        cudnn = base.sdpa("cudnn")

        def step(fn: Callable[..., torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                q.grad = k.grad = v.grad = None
                fn(q, k, v).backward(g)
            return run

        def grads() -> list[torch.Tensor]:
            return [t.grad.float().clone() for t in (q, k, v)]  # type: ignore[union-attr]

        ref_grads: list[torch.Tensor] | None = None
        baselines: dict[str, float] = {}
        candidates: list[tuple[str, Callable[[], Any]]] = [
            ("cudnn+rope", lambda: cudnn), ("flex+rope", lambda: base.flex_rope),
            *((options, lambda options=options: attnfuse.compile(examples.path("llama3"),
                                                                  pipeline=pipeline_with(options, args.layout)))
              for options in configs)]
        for config, make in candidates:
            row: dict[str, Any] = {"seq": seq, "config": config, "layout": args.layout}
            try:
                run = step(make())
                run()
                first = grads()
                run()
                row["bitwise_repeat"] = all(torch.equal(a, b) for a, b in zip(first, grads()))
                if config not in ("cudnn+rope", "flex+rope"):
                    ref_grads = ref_grads or first
                    row["max_grad_diff_vs_first"] = [float((a - b).abs().max()) for a, b in zip(first, ref_grads)]
                row["fwd_bwd_ms"] = float(triton.testing.do_bench(run, warmup=25, rep=200))
                row["kernels_us"] = kernel_times(run, args.iters)
                if config in ("cudnn+rope", "flex+rope"):
                    baselines[config] = row["fwd_bwd_ms"]
                else:
                    row.update({f"vs_{b}": ms / row["fwd_bwd_ms"] for b, ms in baselines.items()})
            except Exception as err:  # noqa: BLE001 - a config that does not fit is a result
                row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            rows.append(row)
            print(json.dumps({k2: row.get(k2) for k2 in ("seq", "config", "fwd_bwd_ms", "vs_cudnn+rope",
                                                          "vs_flex+rope", "error")}), flush=True)
            (args.out / "backward_profile.json").write_text(json.dumps(rows, indent=1))
        del q, k, v, g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
