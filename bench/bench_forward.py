"""Forward attention on Llama-3-8B shapes: AttnFuse vs SDPA (cuDNN, flash) and flex_attention.

Hq=32, Hkv=8, D=128, bf16, causal, RoPE (half style, theta 5e5), B*S = 16384 tokens.
Baselines apply RoPE with a `torch.compile`d function (an eager RoPE costs ~1.8 ms and
would flatter us); every number comes from this run (`triton.testing.do_bench`, median).

    python bench/bench_forward.py --out results.json [--seqs 2048,4096] [--configs 128x64x4x3,...]

A config is `block_m x block_n x num_warps x num_stages`; AttnFuse rows are reported for
every config and strategy, plus the best per sequence length.
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
import triton.testing

import attnfuse

THETA = 500000.0
HQ, HKV, D = 32, 8, 128
TOKENS = 16384


def rope_tables(seq: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float64, device=device) / D))
    angles = torch.arange(seq, dtype=torch.float64, device=device)[:, None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


rope = torch.compile(_rope)


def flops(batch: int, seq: int) -> float:
    return 4 * batch * HQ * seq * seq * D * 0.5  # causal


def bench(fn: Callable[[], Any]) -> float:
    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median"))


def baselines(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq: int) -> dict[str, Callable[[], Any]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cos, sin = rope_tables(seq, "cuda")
    kx = k.repeat_interleave(HQ // HKV, dim=1)
    vx = v.repeat_interleave(HQ // HKV, dim=1)

    def sdpa(backend: SDPBackend) -> Callable[[], Any]:
        def run() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True, enable_gqa=True)

        try:
            run()
        except RuntimeError:  # a backend without GQA support: expanded K/V
            def run() -> Any:  # noqa: F811
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(rope(q, cos, sin), rope(kx, cos, sin), vx, is_causal=True)
        return run

    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seq, seq, device="cuda")
    flex = torch.compile(flex_attention)

    def flex_run() -> Any:
        return flex(rope(q, cos, sin), rope(k, cos, sin), v, block_mask=mask, enable_gqa=True)

    def rope_only() -> Any:
        return rope(q, cos, sin), rope(k, cos, sin)

    return {
        "sdpa_cudnn+rope": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa_flash+rope": sdpa(SDPBackend.FLASH_ATTENTION),
        "flex+rope": flex_run,
        "rope_alone": rope_only,
    }


def pipeline(strategy: str, config: tuple[int, ...]) -> str:
    """The pipeline of one config; `()` is the default (auto) choice of tiles."""
    if not config:
        return f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,mask-tiling,lower-to-tile"
    bm, bn, warps, stages = config
    return (
        f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,"
        f"mask-tiling{{block-m={bm} block-n={bn}}},lower-to-tile{{num-warps={warps} num-stages={stages}}}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqs", default="2048,4096,8192,16384")
    parser.add_argument("--configs", default="auto,128x64x4x3,128x64x8x3,128x128x8x2")
    parser.add_argument("--strategies", default="fused,hybrid,separate")
    args = parser.parse_args()
    program = Path(__file__).parents[1] / "examples" / "llama3.attn"
    configs = [() if c == "auto" else tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    rows: list[dict[str, Any]] = []
    for seq in (int(s) for s in args.seqs.split(",")):
        batch = TOKENS // seq
        g = torch.Generator(device="cuda").manual_seed(seq)
        q = torch.randn(batch, HQ, seq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(batch, HKV, seq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(batch, HKV, seq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        times: dict[str, float] = {}
        for name, fn in baselines(q, k, v, seq).items():
            times[name] = bench(fn)
        ref_out = baselines(q, k, v, seq)["sdpa_cudnn+rope"]()
        for strategy in args.strategies.split(","):
            for config in configs:
                label = f"attnfuse_{strategy}_{'x'.join(map(str, config)) or 'auto'}"
                try:
                    t0 = time.time()
                    fn = attnfuse.compile(program, pipeline=pipeline(strategy, config))
                    out = fn(q, k, v)
                    compile_s = time.time() - t0
                    err = float((out.float() - ref_out.float()).abs().max())
                    times[label] = bench(lambda: fn(q, k, v))
                    rows.append({"seq": seq, "name": label, "compile_s": compile_s, "max_err_vs_cudnn": err})
                except Exception as exc:  # a config that does not compile (shared memory) is reported
                    rows.append({"seq": seq, "name": label, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        fl = flops(batch, seq)
        for name, ms in times.items():
            rows.append({"seq": seq, "batch": batch, "name": name, "ms": ms,
                         "tflops": None if name == "rope_alone" else fl / ms / 1e9})
        ours = {n: t for n, t in times.items() if n.startswith("attnfuse")}
        if ours:
            best = min(ours, key=ours.__getitem__)
            rows.append({"seq": seq, "name": "best_attnfuse", "config": best, "ms": ours[best],
                         "vs_cudnn": times["sdpa_cudnn+rope"] / ours[best],
                         "vs_flash": times["sdpa_flash+rope"] / ours[best],
                         "vs_flex": times["flex+rope"] / ours[best]})
        torch.cuda.empty_cache()
    payload = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "rows": rows}
    args.out.write_text(json.dumps(payload, indent=1))
    print(f"{'S':>6} {'name':40s} {'ms':>8} {'TFLOP/s':>8}")
    for r in rows:
        if "ms" in r and r["name"] != "best_attnfuse":
            tf = r.get("tflops")
            shown = "-" if tf is None else str(round(tf))
            print(f"{r['seq']:>6} {r['name']:40s} {r['ms']:8.3f} {shown:>8}")
        elif r["name"] == "best_attnfuse":
            print(f"{r['seq']:>6} BEST {r['config']} cudnn/ours={r['vs_cudnn']:.2f} flash/ours={r['vs_flash']:.2f} flex/ours={r['vs_flex']:.2f}")
        elif "error" in r:
            print(f"{r['seq']:>6} {r['name']:40s} ERROR {r['error'][:100]}")


if __name__ == "__main__":
    main()
