"""Packed variable-length batches: AttnFuse varlen vs the document mask and flex_attention (CUDA).

Llama-3-8B attention (32 query heads, 8 KV heads, D = 128, bf16, RoPE theta 500000, causal
within each sequence) on `--total` tokens cut into sequences of random lengths in
[`--min-len`, `--max-len`] (one draw per seed). The same attention four ways:

* `varlen`: examples/varlen.attn on the packed `[1, H, T, D]` tensors and cu_seqlens
  (every call also checks the cu_seqlens values on a host copy, a synchronisation that the
  GPU times below include; `check_ms` is the wall time of that check alone);
* `padded`: examples/document.attn on the batch padded to `[N, S_max]`, one sequence per
  row, its padding a document of its own (what running the batch padded costs);
* `document`: examples/document.attn on the same tokens in one `[1, T]` row, document ids
  and positions restarting per sequence (its runtime block map skips cross-document tiles);
* `flex`: compiled flex_attention with a document block mask over the packed tensors
  (`bench/baselines.py`'s translation of examples/varlen.attn).

For each: GPU time per call (`do_bench` median) of the forward and of forward + backward,
and the largest difference of its output to varlen's on the real tokens; then ratios
(`<impl>_ms / varlen_ms`, above 1: varlen is faster). JSON and a markdown table under --out:

    python bench/varlen.py --out DIR [--total 16384] [--min-len 256] [--max-len 4096] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import attnfuse
from attnfuse import examples, reference
from attnfuse.program import analyze, find_functions
from attnfuse.testing import cu_seqlens
from baselines import flex_baseline

IMPLS = ("varlen", "padded", "document", "flex")


def draw_lengths(total: int, low: int, high: int, seed: int) -> list[int]:
    """Lengths in [low, high] (the last one shorter when needed) summing to `total`."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(low, high), total - sum(lengths)))
    return lengths


def packed_inputs(lengths: Sequence[int], device: str, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """q `[1, 32, T, 128]`, k and v `[1, 8, T, 128]`, ~N(0, 1), and the cu_seqlens."""
    g = torch.Generator(device=device).manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(1, 32, total, 128, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(1, 8, total, 128, device=device, dtype=dtype, generator=g) for _ in range(2))
    return [q, k, v, cu_seqlens(list(lengths), device)]


def document_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> list[torch.Tensor]:
    """The packed tokens as one row for examples/document.attn: positions and document ids."""
    tokens = torch.arange(q.shape[2], device=q.device)
    seq = torch.searchsorted(cu[1:].long(), tokens, right=True)
    pos = (tokens - cu.long()[seq]).to(torch.int32)[None]
    return [q, k, v, pos, seq.to(torch.int32)[None]]


def padded_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> list[torch.Tensor]:
    """One sequence per row of `[N, S_max]` for examples/document.attn, positions from 0, the
    padding its own document (id 1, the tokens 0)."""
    bounds = cu.tolist()
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    rows, longest = len(lengths), max(lengths)
    out = []
    for x in (q, k, v):
        padded = x.new_zeros(rows, x.shape[1], longest, x.shape[3])
        for i, (a, n) in enumerate(zip(bounds, lengths)):
            padded[i, :, :n] = x[0, :, a:a + n]
        out.append(padded)
    pos = torch.arange(longest, device=q.device, dtype=torch.int32).repeat(rows, 1)
    doc = (pos >= torch.tensor(lengths, device=q.device)[:, None]).to(torch.int32)
    return [*out, pos, doc]


def unpad(out: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """`[N, H, S_max, D]` rows back to the packed `[1, H, T, D]` tokens."""
    bounds = cu.tolist()
    return torch.cat([out[i:i + 1, :, :b - a] for i, (a, b) in enumerate(zip(bounds, bounds[1:]))], dim=2)


def _wall_ms(fn: Callable[[], Any], repeats: int = 200) -> float:
    """Host wall time per call (for work that waits on the GPU rather than queueing)."""
    import time

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def _ms(fn: Callable[[], Any], grads: Sequence[torch.Tensor] = ()) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=25, rep=200, grad_to_none=list(grads), return_mode="median"))


Calls = dict[str, tuple[list[torch.Tensor], Callable[..., torch.Tensor]]]


def _calls(seed: int, lengths: list[int]) -> tuple[Calls, Callable[[], None]]:
    """Per implementation: its float inputs (q, k, v) and `call(q, k, v) -> packed out`;
    and the per-call cu_seqlens check of varlen alone."""
    varlen_text = examples.path("varlen").read_text()
    varlen = attnfuse.compile(examples.path("varlen"))
    document = attnfuse.compile(examples.path("document"))
    q, k, v, cu = packed_inputs(lengths, "cuda", torch.bfloat16, seed)
    doc_args = document_inputs(q, k, v, cu)
    pad_args = padded_inputs(q, k, v, cu)
    flex = flex_baseline(analyze(find_functions(reference.parse_program(varlen_text))[0]), [q, k, v, cu, cu])
    calls: Calls = {
        "varlen": ([q, k, v], lambda q_, k_, v_: varlen(q_, k_, v_, cu, cu)),
        "padded": (pad_args[:3], lambda q_, k_, v_: unpad(document(q_, k_, v_, *pad_args[3:]), cu)),
        "document": ([q, k, v], lambda q_, k_, v_: document(q_, k_, v_, *doc_args[3:])),
        "flex": ([q, k, v], flex),
    }
    return calls, lambda: varlen._checker.segment_values([q, k, v, cu, cu])  # noqa: SLF001


def run(total: int, low: int, high: int, seeds: list[int]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        lengths = draw_lengths(total, low, high, seed)
        row: dict[str, Any] = {
            "seed": seed, "tokens": total, "sequences": len(lengths), "max_len": max(lengths), "lengths": lengths,
            # query-key pairs a causal kernel must visit, packed vs padded to S_max
            "pairs_varlen": sum(n * (n + 1) // 2 for n in lengths),
            "pairs_padded": len(lengths) * max(lengths) * (max(lengths) + 1) // 2,
        }
        calls, check = _calls(seed, lengths)
        with torch.no_grad():
            want = calls["varlen"][1](*calls["varlen"][0])
        row["check_ms"] = _wall_ms(check)
        for name, (inputs, call) in calls.items():
            try:
                with torch.no_grad():
                    row[f"{name}_max_diff"] = float((call(*inputs).float() - want.float()).abs().max())
                    row[f"{name}_fwd_ms"] = _ms(lambda c=call, a=inputs: c(*a))
                leaves = [t.detach().requires_grad_() for t in inputs]
                grad = torch.randn_like(want)
                row[f"{name}_fwdbwd_ms"] = _ms(lambda c=call, a=leaves: c(*a).backward(grad), leaves)
            except Exception as exc:  # reported, never hidden
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        for name in IMPLS[1:]:
            for mode in ("fwd", "fwdbwd"):
                if f"{name}_{mode}_ms" in row and f"varlen_{mode}_ms" in row:
                    row[f"{name}_vs_varlen_{mode}"] = row[f"{name}_{mode}_ms"] / row[f"varlen_{mode}_ms"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "lengths"}), flush=True)
        del calls, want
        torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    cols = [f"{n}_{m}_ms" for m in ("fwd", "fwdbwd") for n in IMPLS]
    head = ["seed", "N", "S_max", *cols, "padded/varlen fwd", "document/varlen fwd", "flex/varlen fwd",
            "padded/varlen fwd+bwd", "document/varlen fwd+bwd", "flex/varlen fwd+bwd", "check ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in rows:
        cells = [str(r["seed"]), str(r["sequences"]), str(r["max_len"])]
        cells += [f"{r[c]:.3f}" if c in r else "err" for c in cols]
        cells += [f"{r[f'{n}_vs_varlen_{m}']:.2f}" if f"{n}_vs_varlen_{m}" in r else ""
                  for m in ("fwd", "fwdbwd") for n in IMPLS[1:]]
        cells.append(f"{r['check_ms']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--total", type=int, default=16384)
    parser.add_argument("--min-len", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    rows = run(args.total, args.min_len, args.max_len, [int(s) for s in args.seeds.split(",")])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "varlen.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    (args.out / "varlen.md").write_text(summary(rows))
    print(summary(rows))


if __name__ == "__main__":
    main()
