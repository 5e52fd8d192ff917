"""The examples that lost to flex_attention (issue 7), each with its optimisations on and off.

    python bench/examples_ablation.py --out DIR [--examples t5_bias,document] [--seq 8192] [--batch 2]

For every example: flex_attention (bench/baselines.py, compiled) once, then AttnFuse with
the default pipeline and with the ablation variants of `VARIANTS` (pass options turned
off, or other tile configs), forward and forward + backward (gradients of q, k, v), at
B = 2, S = 8192 as `run_all.py --sections examples`. Writes DIR/examples_ablation.json
(one row per example x variant: ms, speed-up over flex = flex ms / AttnFuse ms, max
|out - flex| and, for flex and each variant, max |out - float64 reference| over batch row 0:
the forward calls run without gradients, as eager inference does; the backward kernels
that ran, and why `host.tma_ready` refused the TMA kernels where it did) and prints a
table.
Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import attnfuse
from attnfuse import examples, reference
from attnfuse.program import analyze, find_functions
from attnfuse.testing import make_inputs
from baselines import flex_baseline
from run_all import bench


def pipe(tiles: str = "", backward: str = "", lower: str = "") -> str:
    """The default pipeline with options for mask-tiling, lower-backward and lower-to-tile."""
    def opt(name: str, options: str) -> str:
        return f"{name}{{{options}}}" if options else name
    return ("attn-canonicalize,rope-fusion{strategy=auto},online-softmax,"
            f"{opt('mask-tiling', tiles)},{opt('lower-backward', backward)},{opt('lower-to-tile', lower)}")


IEEE = "f32-dot=ieee"


def ieee_forward(bm: int, bn: int, warps: int) -> str:
    """FMA dots with a forward tile config (the backward at its FMA default)."""
    return pipe(f"block-m={bm} block-n={bn} {IEEE}", IEEE, f"num-warps={warps} {IEEE}")


NO_FOLD = "fold-scale=false alibi-vectors=false"
VARIANTS: dict[str, dict[str, str]] = {
    "t5_bias": {
        "default": pipe(),  # f32 with tf32x3 dots: forward 128 x 64 x 8 warps, backward 32 x 32 x 4
        "ieee": pipe(IEEE, IEEE, IEEE),  # FMA dots: forward 64 x 32 x 8 warps, backward 32 x 32 x 4
        "ieee_fwd_32x32x4": ieee_forward(32, 32, 4),
        "ieee_fwd_128x32x4": ieee_forward(128, 32, 4),  # flex's sm_90 f32 D=64 config
        "tf32": pipe("f32-dot=tf32", "f32-dot=tf32", "f32-dot=tf32"),  # one TF32 product: less accurate
        "bwd_64x64": pipe("", "block-m=64 block-n=64"),
    },
    "document": {
        "default": pipe(),
        "no_dkdv_block_map": pipe("", "dkdv-block-map=false"),
        "triton_forward": pipe("", "", "hopper-forward=false"),
        "hopper_block_map": pipe("", "hopper-block-map=true"),
    },
    "alibi": {
        "default": pipe(),
        "no_fold_no_vectors": pipe("", NO_FOLD, NO_FOLD),
        "no_vectors": pipe("", "alibi-vectors=false", "alibi-vectors=false"),
        "fwd_4_warps": pipe("", "", "num-warps=4"),
        "triton_forward": pipe("", "", "hopper-forward=false"),
    },
    "qwen3": {
        "default": pipe(),
        "no_fold": pipe("", "fold-scale=false", "fold-scale=false"),
    },
    "llama3": {
        "default": pipe(),
        "no_fold": pipe("", "fold-scale=false", "fold-scale=false"),
    },
}


def time_pair(run: Callable[..., torch.Tensor], qkv: list[torch.Tensor], g: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        fwd = bench(lambda: run(*qkv))
    leaves = [t.detach().requires_grad_(True) for t in qkv]

    def step() -> None:
        for t in leaves:
            t.grad = None
        run(*leaves).backward(g)

    return {"fwd_ms": fwd, "fwd_bwd_ms": bench(step)}


def backward_kernels(fn: Any) -> list[str]:
    """The kernels of the backward launch plans `fn` has built (which path ran: the Gluon
    `_bwd_ws` kernel or the Triton dQ and dK/dV kernels)."""
    runner = fn._runner
    hosts = [h for h in (runner.backward, runner.backward_saved) if h is not None]
    return sorted({step.meta.name for h in hosts for plan in h._plans.values() for step in plan.steps
                   if hasattr(step, "meta")})


class _TmaRefusals(logging.Handler):
    """The reasons `host.tma_ready` gave for not running the TMA (Gluon) kernels."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "TMA kernels not used" in message:
            self.reasons.append(message)


def run_example(name: str, variants: list[str], batch: int, seq: int, rows: list[dict[str, Any]]) -> None:
    text = examples.path(name).read_text()
    function = find_functions(reference.parse_program(text))[0]
    program = analyze(function)
    args = make_inputs(function, batch, seq, seq, device="cuda", seed=3)
    index = [program.q.arg_index, program.k.arg_index, program.v_arg]
    qkv = [args[i] for i in index]
    g = torch.randn_like(qkv[0])
    base = {"example": name, "batch": batch, "seq": seq, "dtype": str(qkv[0].dtype)}
    flex = flex_baseline(program, args)
    first = [a[:1] if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == batch else a for a in args]
    want = reference.run(text, *first)
    want = want[0] if isinstance(want, tuple) else want

    def f64_error(out: torch.Tensor) -> float:
        return float((out[:1].double() - want).abs().max())

    with torch.no_grad():
        flex_out = flex(*qkv).float()
    flex_times = time_pair(flex, qkv, g)
    rows.append({**base, "variant": "flex", "max_err_vs_f64": f64_error(flex_out), **flex_times})
    for variant in variants:
        pipeline = VARIANTS[name][variant]
        row: dict[str, Any] = {**base, "variant": variant, "pipeline": pipeline}
        try:
            fn = attnfuse.compile(text, pipeline=pipeline)

            def run(*t: torch.Tensor, fn: Any = fn) -> torch.Tensor:
                return fn(*[t[index.index(i)] if i in index else a for i, a in enumerate(args)])

            with torch.no_grad():
                out = run(*qkv).float()
            row["max_diff_vs_flex"] = float((out - flex_out).abs().max())
            row["max_err_vs_f64"] = f64_error(out)
            refusals = _TmaRefusals()
            host_log = logging.getLogger("attnfuse.runtime.host")
            level = host_log.level
            host_log.addHandler(refusals)
            host_log.setLevel(logging.DEBUG)
            try:
                row.update(time_pair(run, qkv, g))
            finally:
                host_log.removeHandler(refusals)
                host_log.setLevel(level)
            row["bwd_kernels"] = backward_kernels(fn)
            row["tma_refusals"] = sorted(set(refusals.reasons))
            for key in ("fwd_ms", "fwd_bwd_ms"):
                row[f"{key[:-3]}_speedup_vs_flex"] = flex_times[key] / row[key]
        except Exception as exc:  # reported, never hidden
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        rows.append(row)
        print(json.dumps(row), flush=True)
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--examples", default=",".join(VARIANTS))
    parser.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8192)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(filter(None, args.variants.split(",")))
    rows: list[dict[str, Any]] = []
    start = time.time()
    for name in args.examples.split(","):
        variants = [v for v in VARIANTS[name] if not wanted or v in wanted]
        run_example(name, variants, args.batch, args.seq, rows)
        (out / "examples_ablation.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "seconds": time.time() - start,
             "rows": rows}, indent=1))
    print(f"\n{'example':10} {'variant':20} {'fwd ms':>9} {'x flex':>7} {'fwd+bwd ms':>11} {'x flex':>7} {'err f64':>9}")
    for r in rows:
        print(f"{r['example']:10} {r['variant']:20} {r.get('fwd_ms', float('nan')):9.3f} "
              f"{r.get('fwd_speedup_vs_flex', float('nan')):7.2f} {r.get('fwd_bwd_ms', float('nan')):11.3f} "
              f"{r.get('fwd_bwd_speedup_vs_flex', float('nan')):7.2f} {r.get('max_err_vs_f64', float('nan')):9.2e}  "
              f"{r.get('error', '')}")


if __name__ == "__main__":
    main()
