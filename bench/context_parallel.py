"""Context parallelism (ring attention, `attnfuse.distributed`) on 2 GPUs against 1 GPU.

    torchrun --nproc-per-node 2 bench/context_parallel.py --out DIR          # H200s, NCCL
    torchrun --nproc-per-node 2 bench/context_parallel.py --out DIR --smoke  # CPU, gloo, tiny sizes

Llama-3-8B attention (32 query / 8 KV heads of 128, bf16, RoPE theta 5e5 on global
positions, causal), B = 1, at every --seqs length S:

- **Correctness** on rank 0: the context-parallel output and q/k/v gradients (zigzag
  shards, all-gathered) against one GPU running the same program on the whole sequence,
  and both against the same program compiled in f32 (run on the bf16 inputs converted):
  `cp_vs_single`, `cp_vs_f32`, `single_vs_f32` (max |difference| and relative L2 error
  ||a - b|| / ||b||). `cp_vs_f32 / single_vs_f32` near 1 means the ring adds no error of
  its own beyond bf16 rounding of the per-block outputs. A length whose single-GPU run
  does not fit (out of memory) is a row with an `error`; the timing rows still come.
- **Time**: median of --iters forward and forward+backward calls after --warmup, on 2
  GPUs (the slower rank) and on 1 GPU (rank 0 alone, the other rank waiting), and the
  speedup of 2 over 1; the peak memory of the timed calls (the ring's: the largest rank's).

Writes DIR/context_parallel.json (rewritten after every length) and DIR/context_parallel.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import attnfuse
from attnfuse.distributed import RingAttention

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
SMOKE = ["--seqs", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--dtype", "f32",
         "--warmup", "0", "--iters", "1", "--device", "cpu"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--seqs", default="32768,131072", help="comma-separated sequence lengths")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--theta", type=float, default=500000.0, help="RoPE theta")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (the first compiles)")
    parser.add_argument("--iters", type=int, default=5, help="timed calls")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run: " + " ".join(SMOKE))
    args = parser.parse_args(argv)
    return parser.parse_args([*(argv if argv is not None else sys.argv[1:]), *SMOKE]) if args.smoke else args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], None], warmup: int, iters: int, device: torch.device) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _max_over_ranks(ms: float, device: torch.device) -> float:
    value = torch.tensor([ms], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def _errors(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    a, b = a.double(), b.double()
    return {"max_abs": float((a - b).abs().max()), "rel_l2": float((a - b).norm() / b.norm().clamp_min(1e-30))}


def _run(fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor
         ) -> dict[str, torch.Tensor]:
    """out and q/k/v gradients of `(fn(q, k, v) * g).sum()`, in the dtype of q."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(g.to(out.dtype))
    return {"out": out.detach(), **{n: t.grad for n, t in zip("qkv", leaves)}}


def _inputs(args: argparse.Namespace, seq: int, device: torch.device) -> list[torch.Tensor]:
    """Full q, k, v and output gradient, the same on every rank (a seeded generator)."""
    gen = torch.Generator(device).manual_seed(seq)
    dtype = DTYPES[args.dtype]
    shapes = [(1, args.heads, seq, args.head_dim), *[(1, args.kv_heads, seq, args.head_dim)] * 2,
              (1, args.heads, seq, args.head_dim)]
    return [torch.randn(s, generator=gen, device=device, dtype=dtype) for s in shapes]


def correctness(args: argparse.Namespace, ring: RingAttention, single: Any, f32: Any, seq: int,
                device: torch.device) -> dict[str, Any]:
    """Errors of the ring against one GPU and of both against f32 (rank 0's row)."""
    q, k, v, g = _inputs(args, seq, device)
    local = _run(ring, *(ring.shard(t) for t in (q, k, v)), ring.shard(g))
    cp = {n: ring.unshard(t) for n, t in local.items()}
    del local
    if ring.rank:
        return {}
    one = _run(single, q, k, v, g)
    row: dict[str, Any] = {"cp_vs_single": {n: _errors(cp[n], one[n]) for n in cp}}
    try:
        exact = _run(f32, q.float(), k.float(), v.float(), g)
    except Exception as error:  # noqa: BLE001 - the f32 scale is optional: record why it is missing
        return {**row, "f32_error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}
    row["cp_vs_f32"] = {n: _errors(cp[n], exact[n]) for n in cp}
    row["single_vs_f32"] = {n: _errors(one[n], exact[n]) for n in cp}
    return row


def timing(args: argparse.Namespace, ring: RingAttention, single: Any, seq: int, device: torch.device
           ) -> dict[str, Any]:
    """Median ms of a forward and a forward+backward on 2 GPUs (ring) and on rank 0 alone."""
    full = _inputs(args, seq, device)
    shards = [ring.shard(t).requires_grad_() for t in full[:3]]
    g_local = ring.shard(full[3])
    del full  # the ring's peak memory: its shards only
    row: dict[str, Any] = {}

    def ring_forward() -> None:
        with torch.no_grad():
            ring(*shards)

    def ring_step() -> None:
        ring(*shards).backward(g_local)

    dist.barrier()
    _reset_peak(device)
    row["ring_fwd_ms"] = _max_over_ranks(_median_ms(ring_forward, args.warmup, args.iters, device), device)
    row["ring_fwd_bwd_ms"] = _max_over_ranks(_median_ms(ring_step, args.warmup, args.iters, device), device)
    row["ring_peak_gib"] = _max_over_ranks(_peak_gib(device), device)
    del shards, g_local
    if ring.rank == 0:
        _reset_peak(device)
        try:
            *full, g_full = _inputs(args, seq, device)
            for t in full:
                t.requires_grad_()

            def single_forward() -> None:
                with torch.no_grad():
                    single(*full)

            def single_step() -> None:
                single(*full).backward(g_full)

            row["single_fwd_ms"] = _median_ms(single_forward, args.warmup, args.iters, device)
            row["single_fwd_bwd_ms"] = _median_ms(single_step, args.warmup, args.iters, device)
            row["speedup_fwd"] = row["single_fwd_ms"] / row["ring_fwd_ms"]
            row["speedup_fwd_bwd"] = row["single_fwd_bwd_ms"] / row["ring_fwd_bwd_ms"]
            row["single_peak_gib"] = _peak_gib(device)
        except torch.OutOfMemoryError as error:
            row["single_error"] = f"out of memory: {str(error).splitlines()[0]}"
    dist.barrier()
    return row


def _program(args: argparse.Namespace, dtype: object) -> Any:
    return (attnfuse.attention(args.heads, args.head_dim, kv_heads=args.kv_heads, dtype=dtype, name="llama3")
            .rope(theta=args.theta).causal().build())


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Context parallelism: {result['setup']}", "",
             "| S | ring fwd ms | 1 GPU fwd ms | speedup | ring fwd+bwd ms | 1 GPU fwd+bwd ms | speedup | "
             "out rel L2 vs 1 GPU | dq / dk / dv rel L2 vs 1 GPU | cp/f32 over 1-GPU/f32 (out, dq, dk, dv) | "
             "peak GiB ring / 1 GPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        c = row.get("correctness", {})
        rel = {n: e["rel_l2"] for n, e in c.get("cp_vs_single", {}).items()}
        ratio = {n: f"{c['cp_vs_f32'][n]['rel_l2'] / c['single_vs_f32'][n]['rel_l2']:.2f}"
                 for n in c.get("cp_vs_f32", {}) if c["single_vs_f32"][n]["rel_l2"] > 0}

        def fmt(key: str) -> str:
            return f"{row[key]:.3g}" if key in row else row.get("single_error", row.get("error", "-"))

        lines.append(
            f"| {row['seq']} | {fmt('ring_fwd_ms')} | {fmt('single_fwd_ms')} | {fmt('speedup_fwd')} | "
            f"{fmt('ring_fwd_bwd_ms')} | {fmt('single_fwd_bwd_ms')} | {fmt('speedup_fwd_bwd')} | "
            f"{rel.get('out', float('nan')):.2g} | "
            + " / ".join(f"{rel.get(n, float('nan')):.2g}" for n in "qkv") + " | "
            + ", ".join(ratio.get(n, "n/a") for n in ("out", "q", "k", "v"))
            + "".join(f" ({c[key]})" for key in ("error", "f32_error") if key in c)
            + f" | {fmt('ring_peak_gib')} / {fmt('single_peak_gib')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # read at CUDA's first use
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    # rank 1 waits at a barrier while rank 0 runs (and first compiles) the 1-GPU and f32 programs
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=30),
                            device_id=device if device.type == "cuda" else None)
    ring = RingAttention(_program(args, DTYPES[args.dtype]))
    single = attnfuse.compile(_program(args, DTYPES[args.dtype]))
    f32 = attnfuse.compile(_program(args, torch.float32))
    setup = (f"{args.heads}/{args.kv_heads} heads of {args.head_dim}, {args.dtype}, causal, RoPE theta {args.theta:g}, "
             f"B = 1, {ring.world} ranks ({device.type})")
    result: dict[str, Any] = {
        "setup": setup, "world": ring.world, "sharding": "zigzag (2 * world chunks; rank r: r and 2W-1-r)",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "argv": sys.argv[1:] if argv is None else argv, "rows": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for seq in (int(s) for s in args.seqs.split(",")):
        row: dict[str, Any] = {"seq": seq}
        try:
            row["correctness"] = correctness(args, ring, single, f32, seq, device)
        except torch.OutOfMemoryError as error:
            row["correctness"] = {"error": f"out of memory: {str(error).splitlines()[0]}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()
        dist.barrier()
        row.update(timing(args, ring, single, seq, device))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        if ring.rank == 0:
            (args.out / "context_parallel.json").write_text(json.dumps(result, indent=1))
            print(json.dumps(row), flush=True)
    if ring.rank == 0:
        (args.out / "context_parallel.md").write_text(markdown(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
