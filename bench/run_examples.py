"""The `examples` section of `bench/run_all.py`: every shipped example against
flex_attention (and SDPA cuDNN where the program is plain causal attention), forward and
forward + backward, on generated inputs at B = 2, S = 8192 (needs CUDA).

Each baseline is `bench/baselines.py`'s translation of the program (checked against the
float64 reference in CI); each row also records the max difference of the baseline's
output from AttnFuse's, which must stay at the dtype's rounding level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import attnfuse
from attnfuse import examples, reference
from attnfuse.program import analyze, find_functions
from attnfuse.testing import make_inputs
from baselines import Unsupported, flex_baseline, sdpa_baseline

EXAMPLES = ("llama3", "llama3_1", "qwen3", "gemma2", "gpt_oss", "alibi", "document", "t5_bias")
"""Shipped examples with a flex_attention translation (dropout has none)."""


def _qkv(program: Any, args: list[Any]) -> list[int]:
    return [program.q.arg_index, program.k.arg_index, program.v_arg]


def run_examples(bench: Callable[[Callable[[], Any]], float], rows: list[dict[str, Any]], *,
                 batch: int = 2, seq: int = 8192) -> None:
    for name in EXAMPLES:
        text = examples.path(name).read_text()
        function = find_functions(reference.parse_program(text))[0]
        program = analyze(function)
        args = make_inputs(function, batch, seq, seq, device="cuda", seed=3)
        index = _qkv(program, args)
        candidates: dict[str, Callable[..., torch.Tensor]] = {}
        fn = attnfuse.compile(text)
        candidates["attnfuse"] = lambda *qkv, fn=fn: fn(*[qkv[index.index(i)] if i in index else a
                                                           for i, a in enumerate(args)])
        try:
            candidates["flex"] = flex_baseline(program, args)
        except Unsupported as exc:
            rows.append({"section": "examples", "example": name, "name": "flex", "error": str(exc)})
        try:
            candidates["cudnn"] = sdpa_baseline(program, args)
        except Unsupported:
            pass
        qkv = [args[i] for i in index]
        g = torch.randn_like(qkv[0])
        outputs: dict[str, torch.Tensor] = {}
        for impl, run in candidates.items():
            row: dict[str, Any] = {"section": "examples", "example": name, "name": impl, "batch": batch, "seq": seq,
                                   "dtype": str(qkv[0].dtype)}
            try:
                with torch.no_grad():
                    outputs[impl] = run(*qkv).float()
                    row["fwd_ms"] = bench(lambda run=run: run(*qkv))
                leaves = [t.detach().requires_grad_(True) for t in qkv]

                def step(run: Callable[..., torch.Tensor] = run) -> None:
                    for t in leaves:
                        t.grad = None
                    run(*leaves).backward(g)

                row["fwd_bwd_ms"] = bench(step)
            except Exception as exc:  # reported, never hidden
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            if impl != "attnfuse" and impl in outputs and "attnfuse" in outputs:
                row["max_diff_vs_attnfuse"] = float((outputs[impl] - outputs["attnfuse"]).abs().max())
            rows.append(row)
        ours = next((r for r in rows if r.get("example") == name and r["name"] == "attnfuse"), {})
        for r in rows:
            if r.get("example") == name and r["name"] != "attnfuse":
                for key in ("fwd_ms", "fwd_bwd_ms"):
                    if key in r and key in ours:
                        r[f"{key[:-3]}_speedup_of_attnfuse"] = r[key] / ours[key]
        print(f"[examples] {name}: " + ", ".join(
            f"{r['name']} {r.get('fwd_ms', float('nan')):.3f}/{r.get('fwd_bwd_ms', float('nan')):.3f} ms"
            for r in rows if r.get("example") == name), flush=True)
        del args, qkv, outputs
        torch.cuda.empty_cache()
