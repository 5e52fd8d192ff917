"""Issue 9's validation sweep: every RoPE placement of a family of programs, timed (needs CUDA).

For each program family (head dim, GQA group, mask, QK-norm; 32 query heads, bf16,
RoPE theta 5e5) and each S, with B*S = --tokens while S <= --tokens (else B = 1), it
compiles the default pipeline with `rope-fusion{strategy=P}` for P in fused, hybrid,
separate and times the forward and the forward + backward (`triton.testing.do_bench`,
median). Rows go to DIR/cost_sweep.json in `run_all.py`'s layout (`section`
`cost_forward` / `cost_training`, `name` the placement, `ms`) plus `family` and `shape`:
the cost model's `AttentionShape` of the call on this GPU (`program_shape.shape_of`, the
target `h200` on a 9.x GPU), which `attnfuse.cost.fit.load_sweep` reads back. The file
is rewritten after every S, and `--resume` skips the (family, S) pairs it already
holds, so a sweep can span several device calls (`--budget-s` stops before starting a
pair once that many seconds have passed).

    python bench/cost_sweep.py --out DIR [--families d128_g4,d64_g4] [--seqs 256,512] [--resume] [--budget-s 540]
                               [--rounds 3] [--triton-only] [--min-calls 10] [--graphs]

`--rounds N` times the placements N times in turn, rotating their order, and keeps the
median (`ms`) and every round (`rounds_ms`): run 26 timed each once, and at S >= 16384
its differences between placements changed sign from one family to the next.

`--graphs` replays every step from a CUDA graph (`do_bench_cudagraph`): a forward +
backward step of 0.5 ms at S = 256 is host-bound, and its eager timing moved by up to 44%
between rounds in run 34; a step that cannot be captured is timed eagerly and its rows
carry `graph_error`. Each timing is the median of ten replays of a graph of at least
20 ms of steps (run 35: all 98 cases of S <= 1024 captured, forward and backward).

`--triton-only` compiles without sm_90's Gluon kernels (`lower-to-tile{hopper-forward=false}`,
`lower-backward{hopper-backward=false}`), so that an sm_90 GPU times the Triton kernels
every other GPU runs; the rows' shapes then carry the Triton forward (`hopper` false).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

import attnfuse
from attnfuse.cost.program_shape import shape_of
from attnfuse.cost.target import Target, get_target
from attnfuse.passes import default_pipeline
from attnfuse.program import AttentionProgram, analyze, find_functions
from attnfuse.reference import parse_program

PLACEMENTS = ("fused", "hybrid", "separate")
HEADS = 32


class Family(NamedTuple):
    head_dim: int
    group: int
    window: int | None = None
    qk_norm: bool = False


FAMILIES: dict[str, Family] = {
    "d128_g4": Family(128, 4),
    "d64_g4": Family(64, 4),
    "d256_g4": Family(256, 4),
    "d128_g1": Family(128, 1),
    "d128_g8": Family(128, 8),
    "d128_g4_window1024": Family(128, 4, window=1024),
    "d128_g4_qknorm": Family(128, 4, qk_norm=True),
}
"""Issue 9's axes, one at a time around Llama-3-8B (D = 128, G = 4, causal)."""

SEQS = (256, 320, 384, 448, 512, 768, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
"""Fine below 1024, where the model puts the sm_90 crossovers (docs/cost-model.md)."""


def program_text(name: str, family: Family) -> str:
    """The family's program: RoPE (and a QK-norm) on both sides, causal, maybe a window."""
    builder = attnfuse.attention(heads=HEADS, kv_heads=HEADS // family.group, head_dim=family.head_dim,
                                 dtype=torch.bfloat16, name=name)
    if family.qk_norm:
        builder = builder.qk_norm(weight=False)
    builder = builder.rope(theta=500000.0).causal()
    if family.window is not None:
        builder = builder.sliding_window(left=family.window)
    return builder.build().text()


TRITON_ONLY = {"lower-to-tile": "hopper-forward=false", "lower-backward": "hopper-backward=false"}
"""The pass options that leave sm_90's Gluon kernels out (`--triton-only`)."""


def pipeline(placement: str, triton_only: bool = False) -> str:
    return default_pipeline({"rope-fusion": f"strategy={placement}", **(TRITON_ONLY if triton_only else {})})


def batch_of(seq: int, tokens: int) -> int:
    return max(1, tokens // seq)


@functools.lru_cache(maxsize=None)
def _program(text: str) -> AttentionProgram:
    return analyze(find_functions(parse_program(text))[0])


def shape_row(text: str, seq: int, batch: int, target: Target | None) -> dict[str, Any]:
    """The cost model's shape of this call, as JSON."""
    return dataclasses.asdict(shape_of(_program(text), seq, batch, target=target))


def _time(fn: Callable[[], Any], min_calls: int = 1, graphs: bool = False) -> float:
    """Median ms of ``fn`` over `do_bench`'s 100 ms, or over at least ``min_calls`` calls
    where one call takes longer than 100 ms / ``min_calls`` (`do_bench` alone times a
    60 ms call once); ``graphs``: of ``fn`` captured once in a CUDA graph and replayed
    (`do_bench_cudagraph`: the host's launch path left out)."""
    import triton

    fn()  # the shape class's first call builds its launch plan
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    call_ms = start.elapsed_time(end)
    if graphs:  # ten replays of a graph of `rep` ms each: the median of ten 20 ms samples
        return float(triton.testing.do_bench_cudagraph(fn, rep=max(20.0, min_calls * call_ms),
                                                       return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=10, rep=max(100.0, min_calls * call_ms), return_mode="median"))


def measure(name: str, family: Family, text: str, seq: int, batch: int,
            compiled: dict[str, Any], rounds: int = 1, triton_only: bool = False,
            min_calls: int = 1, graphs: bool = False) -> list[dict[str, Any]]:
    """Forward and forward + backward ms of every placement at one S. With `rounds` > 1
    the placements are timed in turn that many times, the order rotated each round (a
    drift of the GPU's clocks during the sweep then falls on every placement alike):
    `ms` is the median over the rounds, `rounds_ms` every round's time. With `graphs`
    each step is replayed from a CUDA graph; a step whose capture fails is timed eagerly
    and its rows say why (`graph_error`)."""
    gen = torch.Generator(device="cuda").manual_seed(seq)

    def make(heads: int) -> torch.Tensor:
        return torch.randn(batch, heads, seq, family.head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_(True)

    q, k, v = make(HEADS), make(HEADS // family.group), make(HEADS // family.group)
    grad = torch.randn_like(q)
    steps: list[tuple[str, str, Callable[[], None]]] = []
    for placement in PLACEMENTS:
        if placement not in compiled:
            compiled[placement] = attnfuse.compile(text, pipeline=pipeline(placement, triton_only))
        fn = compiled[placement]

        def forward(fn: Any = fn) -> None:
            with torch.no_grad():
                fn(q, k, v)

        def training(fn: Any = fn) -> None:
            q.grad = k.grad = v.grad = None
            fn(q, k, v).backward(grad)

        steps += [("cost_forward", placement, forward), ("cost_training", placement, training)]
    times: dict[tuple[str, str], list[float]] = {(section, p): [] for section, p, _ in steps}
    errors: dict[tuple[str, str], str] = {}
    eager: dict[tuple[str, str], str] = {}  # steps whose graph capture failed
    for i in range(rounds):
        shift = (i * 2) % len(steps)  # rotate by one placement (its two sections) a round
        for section, placement, step in steps[shift:] + steps[:shift]:
            key = (section, placement)
            if key in errors:
                continue
            try:
                if graphs and key not in eager:
                    try:
                        times[key].append(_time(step, min_calls, graphs=True))
                        continue
                    except Exception as exc:  # noqa: BLE001 - not capturable: time it eagerly
                        eager[key] = f"{type(exc).__name__}: {exc}"[:400]
                        torch.cuda.synchronize()
                times[key].append(_time(step, min_calls))
            except Exception as exc:  # noqa: BLE001 - a placement that does not run is a result
                errors[key] = f"{type(exc).__name__}: {exc}"[:400]
    rows = []
    for section, placement, _ in sorted(steps, key=lambda s: (s[0], PLACEMENTS.index(s[1]))):
        row: dict[str, Any] = {"section": section, "family": name, "seq": seq, "batch": batch, "name": placement}
        if (section, placement) in eager:
            row["graph_error"] = eager[section, placement]
        if (section, placement) in errors:
            row["error"] = errors[section, placement]
        else:
            row["ms"] = statistics.median(times[section, placement])
            if rounds > 1:
                row["rounds_ms"] = times[section, placement]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--seqs", default=",".join(map(str, SEQS)))
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--resume", action="store_true", help="keep DIR/cost_sweep.json's rows, skip what they cover")
    parser.add_argument("--budget-s", type=float, default=0.0, help="start no new (family, S) after this many seconds")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the placements this many times in turn, the order rotated each round (ms: the median)")
    parser.add_argument("--min-calls", type=int, default=1,
                        help="each timing covers at least this many calls (default: do_bench's 100 ms)")
    parser.add_argument("--graphs", action="store_true",
                        help="replay each step from a CUDA graph (no host launch path in the time)")
    parser.add_argument("--triton-only", action="store_true", help="time the Triton kernels, not sm_90's Gluon ones")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("cost_sweep.py times kernels on a CUDA GPU and none is visible")
    unknown = [f for f in args.families.split(",") if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "cost_sweep.json"
    target = get_target("h200") if torch.cuda.get_device_capability()[0] == 9 else None
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "target": target and target.name,
            "triton_only": args.triton_only, "min_calls": args.min_calls, "graphs": args.graphs}
    rows: list[dict[str, Any]] = json.loads(path.read_text())["rows"] if args.resume and path.exists() else []
    done = {(r["family"], r["seq"]) for r in rows}
    started = time.time()
    for name in args.families.split(","):
        family = FAMILIES[name]
        text = program_text(name, family)
        compiled: dict[str, Any] = {}
        for seq in (int(s) for s in args.seqs.split(",")):
            if (name, seq) in done:
                continue
            if args.budget_s and time.time() - started > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent; rerun with --resume", flush=True)
                return
            batch = batch_of(seq, args.tokens)
            shape = shape_row(text, seq, batch, None if args.triton_only else target)
            new = measure(name, family, text, seq, batch, compiled, args.rounds, args.triton_only, args.min_calls,
                          args.graphs)
            torch.cuda.empty_cache()
            rows += [{**r, "shape": shape} for r in new]
            path.write_text(json.dumps({**meta, "rows": rows}, indent=1))
            print(json.dumps({"family": name, "seq": seq, **{f"{r['section'][5:]}:{r['name']}": r.get("ms")
                                                              for r in new}}), flush=True)


if __name__ == "__main__":
    main()
