"""Forward + backward attention on Llama-3-8B shapes: AttnFuse vs SDPA cuDNN and flex_attention,
each baseline with a `torch.compile`d RoPE (whose backward is included), in the same run.

Hq=32, Hkv=8, D=128, bf16, causal, RoPE (half, theta 5e5), B*S = 16384 tokens. Time is
the median of `triton.testing.do_bench` over `out = attn(q, k, v); out.backward(g)`.
FLOPs: forward 4*B*Hq*S^2*D/2 (causal), forward+backward 3.5x that.

    python bench/bench_training.py --out training.json [--seqs 2048,16384] [--strategies hybrid,separate,fused]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.testing

import attnfuse

HQ, HKV, D, TOKENS = 32, 8, 128, 16384
THETA = 500000.0


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


rope = torch.compile(_rope)


def tables(seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float64, device="cuda") / D))
    angles = torch.arange(seq, dtype=torch.float64, device="cuda")[:, None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def step(attn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
         q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        q.grad = k.grad = v.grad = None
        attn(q, k, v).backward(g)

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqs", default="2048,4096,8192,16384")
    parser.add_argument("--strategies", default="hybrid,separate,fused")
    args = parser.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention)
    program = Path(__file__).parents[1] / "examples" / "llama3.attn"
    compiled = {
        s: attnfuse.compile(program, pipeline=(
            f"attn-canonicalize,rope-fusion{{strategy={s}}},online-softmax,mask-tiling,lower-backward,lower-to-tile"))
        for s in args.strategies.split(",")
    }
    rows: list[dict[str, Any]] = []
    for seq in (int(x) for x in args.seqs.split(",")):
        batch = TOKENS // seq
        gen = torch.Generator(device="cuda").manual_seed(seq)

        def make(heads: int) -> torch.Tensor:
            return torch.randn(batch, heads, seq, D, device="cuda", dtype=torch.bfloat16,
                               generator=gen).requires_grad_(True)

        q, k, v = make(HQ), make(HKV), make(HKV)
        g = torch.randn(batch, HQ, seq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        cos, sin = tables(seq)
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seq, seq, device="cuda")

        def cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v,
                                                      is_causal=True, enable_gqa=True)

        def flex_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return flex(rope(q, cos, sin), rope(k, cos, sin), v, block_mask=mask, enable_gqa=True)

        candidates: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
            "sdpa_cudnn+rope": cudnn, "flex+rope": flex_rope,
        }
        for name, fn in compiled.items():
            candidates[f"attnfuse_{name}"] = fn
        times: dict[str, float] = {}
        grads: dict[str, list[torch.Tensor]] = {}
        for name, fn in candidates.items():
            try:
                run = step(fn, q, k, v, g)
                run()
                torch.cuda.synchronize()
                grads[name] = [t.grad.float().clone() for t in (q, k, v)]  # type: ignore[union-attr]
                times[name] = float(triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median"))
            except Exception as exc:  # report, do not hide
                rows.append({"seq": seq, "name": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        flops = 3.5 * 4 * batch * HQ * seq * seq * D * 0.5
        for name, ms in times.items():
            row: dict[str, Any] = {"seq": seq, "batch": batch, "name": name, "ms": ms, "tflops": flops / ms / 1e9}
            if name in grads and "sdpa_cudnn+rope" in grads:
                row["max_grad_diff_vs_cudnn"] = [float((a - b).abs().max()) for a, b in zip(grads[name], grads["sdpa_cudnn+rope"])]
            if name.startswith("attnfuse"):
                row["cudnn_over_ours"] = times.get("sdpa_cudnn+rope", float("nan")) / ms
                row["flex_over_ours"] = times.get("flex+rope", float("nan")) / ms
            rows.append(row)
        del q, k, v, g
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "triton": triton.__version__, "rows": rows}, indent=1))
    for r in rows:
        if "ms" in r:
            extra = f" cudnn/ours={r['cudnn_over_ours']:.2f} flex/ours={r['flex_over_ours']:.2f}" if "cudnn_over_ours" in r else ""
            print(f"{r['seq']:>6} {r['name']:28s} {r['ms']:8.3f} ms {r['tflops']:6.0f} TFLOP/s{extra}")
        else:
            print(f"{r['seq']:>6} {r['name']:28s} ERROR {r['error'][:150]}")


if __name__ == "__main__":
    main()
