"""FSDP2 training of the Llama family with AttnFuse attention, against one process on the same data.

    torchrun --nproc-per-node 2 bench/train_fsdp2.py --out DIR     # FSDP2 (fully_shard), one GPU a process
    python bench/train_fsdp2.py --single --out DIR                 # one process, the same global batches

The model is train_step.py's LlamaForCausalLM (Llama-3-8B's width, 4 layers by
default, bf16, AdamW in bf16) with `attn_implementation` --impl (default attnfuse:
AttnFuse's HF backend, q and k rotated by the model, RoPE not fused). Each step's global
batch is world x --batch sequences of --seq synthetic tokens, drawn from a per-step
seed on the CPU.

- Distributed (under torchrun; NCCL on CUDA, gloo on the CPU): every rank builds the
  same seeded model, `torch.distributed.fsdp.fully_shard` shards each decoder layer and
  then the root; rank r trains on rows [r*B, (r+1)*B) of the global batch. FSDP2
  averages the gradients over ranks and the logged loss is the mean of the ranks'
  losses, so both are the global batch's (every rank has as many targets).
- `--single`: one process on the whole global batch (`--world` sets its size), the
  same computation up to rounding (reduction order, bf16 reduce-scatter).

Writes DIR/fsdp2.json or DIR/single.json (the loss and time of every step, median step
time after --warmup steps, tokens/s, peak memory of each rank); the run that finds the
other's file for the same setup also writes DIR/comparison.json (|loss difference| of
every step and the largest). Not compiled (torch.compile is not part of this run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from train_step import (
    DTYPES,
    IMPLEMENTATIONS,
    ROPE_NOTE,
    adamw,
    add_model_args,
    attention_context,
    build_model,
    describe,
    environment,
    llama_config,
    parameters,
    peak_gib,
    reset_peak,
    synchronize,
    synthetic_tokens,
    train_step,
)

MODES = {"fsdp2": "fsdp2.json", "single": "single.json"}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON results")
    parser.add_argument("--single", action="store_true",
                        help="one process on the whole global batch (default: distributed, under torchrun)")
    parser.add_argument("--world", type=int, default=2,
                        help="with --single: how many ranks' batches make a global batch (default 2); "
                             "distributed runs take torchrun's world size")
    parser.add_argument("--impl", choices=IMPLEMENTATIONS, default="attnfuse",
                        help="attention implementation (default attnfuse)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank and step (default 4)")
    parser.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the median time (default 2)")
    add_model_args(parser)
    return parser.parse_args(argv)


def setup(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """What a single-process and a distributed run must share to be compared."""
    config = llama_config(args, args.layers, args.seq)
    return {"model": describe(config), "parameters": parameters(config), "impl": args.impl, "dtype": args.dtype,
            "world": world, "batch_per_rank": args.batch, "seq": args.seq, "steps": args.steps,
            "seed": args.seed, "lr": args.lr}


def compare(out: Path) -> None:
    """DIR/comparison.json, when both runs are there for the same setup."""
    paths = [out / name for name in MODES.values()]
    if not all(p.exists() for p in paths):
        return
    fsdp2, single = (json.loads(p.read_text()) for p in paths)
    if fsdp2["setup"] != single["setup"]:
        print("fsdp2.json and single.json have different setups: not compared", flush=True)
        return
    diffs = [abs(a - b) for a, b in zip(fsdp2["losses"], single["losses"], strict=True)]
    result = {"setup": fsdp2["setup"], "max_abs_loss_diff": max(diffs), "abs_loss_diff": diffs,
              "fsdp2": fsdp2["losses"], "single": single["losses"],
              "median_step_ms": {"fsdp2": fsdp2["median_step_ms"], "single": single["median_step_ms"]}}
    (out / "comparison.json").write_text(json.dumps(result, indent=1))
    print(f"FSDP2 vs single process: max |loss difference| {max(diffs):.3g} over {len(diffs)} steps "
          f"(step 0: {diffs[0]:.3g})", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # read at CUDA's first use
    distributed = not args.single
    device = torch.device(args.device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
    else:
        rank, world = 0, args.world
    mode = "fsdp2" if distributed else "single"
    losses: list[float] = []
    times: list[float] = []
    with attention_context(args.impl):
        model = build_model(llama_config(args, args.layers, args.seq), args.impl, device, DTYPES[args.dtype],
                            args.seed)
        if distributed:
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
        optimizer = adamw(model, args.lr, device)
        for step in range(args.steps):
            tokens = synthetic_tokens(step, world * args.batch, args.seq, args.vocab, args.seed)
            ids = tokens[rank * args.batch:(rank + 1) * args.batch] if distributed else tokens
            if step == args.warmup:
                reset_peak(device)
            synchronize(device)
            start = time.perf_counter()
            loss = train_step(model, model, optimizer, ids.to(device))
            synchronize(device)
            times.append(time.perf_counter() - start)
            if distributed:
                dist.all_reduce(loss, op=dist.ReduceOp.SUM)  # gloo has no AVG
                loss /= world
            losses.append(float(loss))
            if rank == 0:
                print(f"[{mode} x{world} {args.impl}] step {step + 1}/{args.steps}: {times[-1] * 1e3:.1f} ms, "
                      f"loss {losses[-1]:.5f}", flush=True)
    peaks = [peak_gib(device)]
    if distributed:
        peaks = [None] * world
        dist.all_gather_object(peaks, peak_gib(device))
    median_ms = statistics.median(times[args.warmup:] or times) * 1e3
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {**environment(device), "mode": mode, "setup": setup(args, world), "losses": losses,
                  "step_ms": [t * 1e3 for t in times], "median_step_ms": median_ms,
                  "tokens_per_s": world * args.batch * args.seq / median_ms * 1e3, "peak_gib": peaks,
                  "notes": [ROPE_NOTE]}
        (args.out / MODES[mode]).write_text(json.dumps(result, indent=1))
        print(f"{mode}: median step {median_ms:.1f} ms, peak GiB per rank {peaks}", flush=True)
        compare(args.out)
    if distributed:
        dist.barrier()  # rank 0 has written the results
        dist.destroy_process_group()
        # On CPU (gloo, torch 2.13) a worker thread left running at interpreter shutdown
        # aborted one rank in about one run of four ("terminate called without an active
        # exception") after everything was written; leave without the shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
