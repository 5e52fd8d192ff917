"""Decode against a KV cache: AttnFuse vs SDPA and flex_attention (issue 11's table; CUDA).

The program is Llama-3-8B attention over an already-rotated cache (32 query heads, 8
KV heads, D = 128, bf16) with a bottom-right causal mask, so the `Sq` new queries are
the last `Sq` positions. Per (B, Skv, Sq): GPU time per call (`do_bench` median) of
AttnFuse, SDPA (default backend choice, `causal_lower_right` mask; no mask for Sq = 1)
and compiled flex_attention (`bench/baselines.py`), the max difference to SDPA, and
ratios. JSON and a markdown table under --out:

    python bench/decode.py --out DIR [--batches 1,16,64] [--kv 1024,8192,32768,131072] [--sq 1,4,16]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import attnfuse
from attnfuse import reference
from attnfuse.program import analyze, find_functions
from baselines import flex_baseline

PROGRAM = """
func.func @decode(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>,
                  %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %s = attn.scores %q, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
"""


def sdpa_lower_right(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA with the bottom-right causal mask (the new queries are the last positions)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    if q.shape[2] == 1:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    mask = causal_lower_right(q.shape[2], k.shape[2])
    if q.shape[1] != k.shape[1]:  # the causal-bias path takes no enable_gqa
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _ms(fn: Callable[[], Any]) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def run(batches: list[int], kv_lens: list[int], q_lens: list[int]) -> list[dict[str, Any]]:
    fn = attnfuse.compile(PROGRAM)
    program = analyze(find_functions(reference.parse_program(PROGRAM))[0])
    rows: list[dict[str, Any]] = []
    for b in batches:
        for skv in kv_lens:
            for sq in q_lens:
                gen = torch.Generator(device="cuda").manual_seed(skv + sq)
                q = torch.randn(b, 32, sq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                v = torch.randn_like(k)
                row: dict[str, Any] = {"batch": b, "kv_len": skv, "q_len": sq}
                with torch.no_grad():
                    want = sdpa_lower_right(q, k, v)
                    impls = {"attnfuse": lambda: fn(q, k, v), "sdpa": lambda: sdpa_lower_right(q, k, v)}
                    flex = flex_baseline(program, [q, k, v])
                    impls["flex"] = lambda: flex(q, k, v)
                    for name, call in impls.items():
                        try:
                            row[f"{name}_max_diff_vs_sdpa"] = float((call().float() - want.float()).abs().max())
                            row[f"{name}_ms"] = _ms(call)
                        except Exception as exc:  # reported, never hidden
                            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                for other in ("sdpa", "flex"):
                    if f"{other}_ms" in row and "attnfuse_ms" in row:
                        row[f"vs_{other}"] = row[f"{other}_ms"] / row["attnfuse_ms"]
                rows.append(row)
                print(json.dumps(row), flush=True)
                del q, k, v, want
                torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    lines = ["| B | Skv | Sq | AttnFuse ms | SDPA ms | flex ms | vs SDPA | vs flex |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cell = [f"{r[k]:.4f}" if k in r else "err" for k in ("attnfuse_ms", "sdpa_ms", "flex_ms")]
        ratio = [f"{r[k]:.2f}" if k in r else "" for k in ("vs_sdpa", "vs_flex")]
        lines.append(f"| {r['batch']} | {r['kv_len']} | {r['q_len']} | {' | '.join(cell)} | {' | '.join(ratio)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--kv", default="1024,8192,32768,131072")
    parser.add_argument("--sq", default="1,4,16")
    args = parser.parse_args()
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    rows = run(ints(args.batches), ints(args.kv), ints(args.sq))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    (args.out / "decode.md").write_text(summary(rows))
    print(summary(rows))


if __name__ == "__main__":
    main()
