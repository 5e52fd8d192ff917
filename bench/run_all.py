"""Every speed question of the Hopper issue in one run, each against its baselines.

    python bench/run_all.py --out DIR [--sections forward,training,sweep,memory] [--seqs ...]

Llama-3-8B attention (Hq=32, Hkv=8, D=128, bf16, causal, RoPE half/theta 5e5), B*S = 16384
tokens. Baselines in the same run: SDPA cuDNN and flash with a `torch.compile`d RoPE,
flex_attention (compiled, causal BlockMask) with the same RoPE. Writes DIR/results.json
(every row), DIR/summary.md (tables) and DIR/*.png (plots, when matplotlib is there).

Sections:
- forward: every rope-fusion strategy x tile config, plus ablation rows (each
  optimisation turned off);
- training: forward + backward per strategy and backward config, gradients compared
  with cuDNN's;
- sweep: S = 256 .. 16384 at B*S = 16384 for every strategy (where each placement wins);
- memory: peak extra memory of forward + backward at one long S, against SDPA cuDNN.
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
import triton
import triton.testing

import attnfuse

HQ, HKV, D, TOKENS, THETA = 32, 8, 128, 16384, 500000.0
PROGRAM = Path(__file__).parents[1] / "examples" / "llama3.attn"


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


rope = torch.compile(_rope)


def tables(seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float64, device="cuda") / D))
    angles = torch.arange(seq, dtype=torch.float64, device="cuda")[:, None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def pipeline(strategy: str, fwd: str = "", bwd: str | None = None, lower: str = "") -> str:
    """`fwd` = 'BMxBNxWxS' or '' (defaults); `bwd` = lower-backward options or None (no backward)."""
    tiles, lowering = "mask-tiling", f"lower-to-tile{{{lower}}}" if lower else "lower-to-tile"
    if fwd:
        bm, bn, warps, stages = (int(x) for x in fwd.split("x"))
        tiles = f"mask-tiling{{block-m={bm} block-n={bn}}}"
        lowering = f"lower-to-tile{{num-warps={warps} num-stages={stages}{' ' + lower if lower else ''}}}"
    backward = "" if bwd is None else (f"lower-backward{{{bwd}}}," if bwd else "lower-backward,")
    return f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,{tiles},{backward}{lowering}"


def bench(fn: Callable[[], Any], rep: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def inputs(seq: int, grad: bool = False) -> tuple[torch.Tensor, ...]:
    batch = max(1, TOKENS // seq)
    gen = torch.Generator(device="cuda").manual_seed(seq)

    def make(heads: int) -> torch.Tensor:
        t = torch.randn(batch, heads, seq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        return t.requires_grad_(grad)

    return make(HQ), make(HKV), make(HKV), torch.randn(batch, HQ, seq, D, device="cuda",
                                                       dtype=torch.bfloat16, generator=gen)


class Baselines:
    """SDPA cuDNN / flash and flex_attention, each with the compiled RoPE, at one S."""

    def __init__(self, seq: int) -> None:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        torch._dynamo.reset()  # compile for this S, not with the dynamic sizes of earlier ones (run 37)
        self.cos, self.sin = tables(seq)
        self.mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seq, seq, device="cuda")
        self.flex = torch.compile(flex_attention)

    def sdpa(self, backend: str) -> Callable[..., torch.Tensor]:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            with sdpa_kernel(chosen):
                return F.scaled_dot_product_attention(rope(q, self.cos, self.sin), rope(k, self.cos, self.sin), v,
                                                      is_causal=True, enable_gqa=True)
        return run

    def flex_rope(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.flex(rope(q, self.cos, self.sin), rope(k, self.cos, self.sin), v,
                         block_mask=self.mask, enable_gqa=True)

    def all(self) -> dict[str, Callable[..., torch.Tensor]]:
        return {"cudnn+rope": self.sdpa("cudnn"), "flash+rope": self.sdpa("flash"), "flex+rope": self.flex_rope}


_compiled: dict[str, Any] = {}


def compiled(pipe: str) -> Any:
    if pipe not in _compiled:
        _compiled[pipe] = attnfuse.compile(PROGRAM, pipeline=pipe)
    return _compiled[pipe]


def fwd_flops(seq: int) -> float:
    return 4 * max(1, TOKENS // seq) * HQ * seq * seq * D * 0.5


FORWARD_VARIANTS: dict[str, str] = {
    "hybrid": pipeline("hybrid"),
    "fused": pipeline("fused"),
    "separate": pipeline("separate"),
    "ablation:hybrid_no_fold_scale": pipeline("hybrid", lower="fold-scale=false"),
    "ablation:fused_no_rope_table": pipeline("fused", lower="rope-table=false"),
    "ablation:fused_128x128x8x2": pipeline("fused", "128x128x8x2"),
    "ablation:hybrid_no_hopper_forward": pipeline("hybrid", lower="hopper-forward=false"),
    "ablation:hybrid_no_hopper_persistent": pipeline("hybrid", lower="hopper-persistent=false"),
    "ablation:fused_no_hopper_persistent": pipeline("fused", lower="hopper-persistent=false"),
}
"""Forward rows: each strategy with the default tiles, the tiles of the previous default
(128x64, 8 warps, 3 stages), and ablations (one optimisation off each)."""

TRAINING_VARIANTS: dict[str, str] = {
    "hybrid": pipeline("hybrid", bwd=""),
    "fused": pipeline("fused", bwd=""),
    "separate": pipeline("separate", bwd=""),
    "ablation:hybrid_no_hopper_backward": pipeline("hybrid", bwd="hopper-backward=false"),
    "ablation:fused_no_hopper_backward": pipeline("fused", bwd="hopper-backward=false"),
    "ablation:hybrid_hopper_dk_transpose": pipeline("hybrid", bwd="rotate-in-epilogue=false"),
    # options of the Triton backward kernels, which the Hopper schedule replaces where it runs
    "ablation:hybrid_dkdv_transposed": pipeline("hybrid", bwd="hopper-backward=false dkdv-transposed=true"),
    "ablation:hybrid_dkdv_no_full_tiles": pipeline("hybrid", bwd="hopper-backward=false dkdv-full-tiles=false"),
    "ablation:fused_transforms_in_kernel": pipeline("fused", bwd="transforms-in-kernel=true"),
    "ablation:hybrid_no_rotate_in_epilogue": pipeline("hybrid", bwd="hopper-backward=false rotate-in-epilogue=false"),
    "ablation:hybrid_no_rope_table": pipeline("hybrid", bwd="hopper-backward=false rope-table=false",
                                              lower="rope-table=false"),
}
"""Forward + backward rows: each strategy with the default backward (the Hopper schedule
on sm_90), and the Triton backward kernels and their ablations."""

SLOW_ABLATIONS = ("ablation:fused_no_rope_table", "ablation:fused_transforms_in_kernel")
"""Measured at the first sequence length only (several times slower than the rest)."""


def run_forward(seqs: list[int], variants: dict[str, str], rows: list[dict[str, Any]], section: str) -> None:
    for seq in seqs:
        q, k, v, _ = inputs(seq)
        base = Baselines(seq)
        ref = base.sdpa("cudnn")(q, k, v)
        times = {name: bench(lambda fn=fn: fn(q, k, v)) for name, fn in base.all().items()}
        times["rope_alone"] = bench(lambda: (rope(q, base.cos, base.sin), rope(k, base.cos, base.sin)))
        errors: dict[str, float] = {}
        for name, pipe in variants.items():
            if name in SLOW_ABLATIONS and seq != seqs[0]:
                continue
            try:
                t0 = time.time()
                fn = compiled(pipe)
                out = fn(q, k, v)
                errors[name] = float((out.float() - ref.float()).abs().max())
                times[name] = bench(lambda fn=fn: fn(q, k, v))
                rows.append({"section": section, "seq": seq, "name": name, "kind": "compile", "s": time.time() - t0})
            except Exception as exc:  # reported, never hidden
                rows.append({"section": section, "seq": seq, "name": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
        for name, ms in times.items():
            row = {"section": section, "seq": seq, "batch": max(1, TOKENS // seq), "name": name, "ms": ms,
                   "tflops": fwd_flops(seq) / ms / 1e9 if name != "rope_alone" else None}
            if name in errors:
                row["max_err_vs_cudnn"] = errors[name]
                for b in ("cudnn+rope", "flash+rope", "flex+rope"):
                    row[f"vs_{b}"] = times[b] / ms
            rows.append(row)
        del q, k, v, ref
        torch.cuda.empty_cache()


def run_training(seqs: list[int], variants: dict[str, str], rows: list[dict[str, Any]], section: str) -> None:
    for seq in seqs:
        q, k, v, g = inputs(seq, grad=True)
        base = Baselines(seq)
        candidates: dict[str, Callable[..., torch.Tensor]] = {"cudnn+rope": base.sdpa("cudnn"), "flex+rope": base.flex_rope}
        for name, pipe in variants.items():
            if name not in SLOW_ABLATIONS or seq == seqs[0]:
                candidates[name] = compiled(pipe)
        times: dict[str, float] = {}
        grads: dict[str, list[torch.Tensor]] = {}
        for name, fn in candidates.items():
            def step(fn: Callable[..., torch.Tensor] = fn) -> None:
                q.grad = k.grad = v.grad = None
                fn(q, k, v).backward(g)
            try:
                step()
                torch.cuda.synchronize()
                grads[name] = [t.grad.float().clone() for t in (q, k, v)]  # type: ignore[union-attr]
                times[name] = bench(step)
            except Exception as exc:
                rows.append({"section": section, "seq": seq, "name": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
        for name, ms in times.items():
            row = {"section": section, "seq": seq, "batch": max(1, TOKENS // seq), "name": name, "ms": ms,
                   "tflops": 3.5 * fwd_flops(seq) / ms / 1e9}
            if name not in ("cudnn+rope", "flex+rope"):
                ref = grads["cudnn+rope"]
                row["max_grad_err_vs_cudnn"] = [float((a - b).abs().max()) for a, b in zip(grads[name], ref)]
                row["vs_cudnn+rope"] = times["cudnn+rope"] / ms
                row["vs_flex+rope"] = times["flex+rope"] / ms
            rows.append(row)
        del q, k, v, g, grads
        torch.cuda.empty_cache()


def run_memory(seq: int, rows: list[dict[str, Any]]) -> None:
    q, k, v, g = inputs(seq, grad=True)
    base = Baselines(seq)
    candidates = {"cudnn+rope": base.sdpa("cudnn"),
                  **{n: compiled(TRAINING_VARIANTS[n]) for n in ("hybrid", "fused", "separate")}}
    for name, fn in candidates.items():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(g)
        torch.cuda.synchronize()
        q.grad = k.grad = v.grad = None
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(q, k, v).backward(g)
        torch.cuda.synchronize()
        rows.append({"section": "memory", "seq": seq, "name": name,
                     "peak_extra_gib": (torch.cuda.max_memory_allocated() - before) / 2**30})


def summary(rows: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for section in ("forward", "training", "sweep", "sweep_training"):
        sel = [r for r in rows if r.get("section") == section and "ms" in r]
        if not sel:
            continue
        lines += [f"## {section}", "", "| S | name | ms | TFLOP/s | vs cuDNN+RoPE | vs flex+RoPE | max err |",
                  "|---:|---|---:|---:|---:|---:|---|"]
        for r in sel:
            tf = "" if r.get("tflops") is None else f"{r['tflops']:.0f}"
            err = r.get("max_err_vs_cudnn", r.get("max_grad_err_vs_cudnn", ""))
            err = f"{err:.3g}" if isinstance(err, float) else (", ".join(f"{e:.3g}" for e in err) if err else "")
            vc = f"{r['vs_cudnn+rope']:.2f}" if "vs_cudnn+rope" in r else ""
            vf = f"{r['vs_flex+rope']:.2f}" if "vs_flex+rope" in r else ""
            lines.append(f"| {r['seq']} | {r['name']} | {r['ms']:.3f} | {tf} | {vc} | {vf} | {err} |")
        lines.append("")
    mem = [r for r in rows if r.get("section") == "memory"]
    if mem:
        lines += ["## memory", "", "| S | name | peak extra GiB |", "|---:|---|---:|"]
        lines += [f"| {r['seq']} | {r['name']} | {r['peak_extra_gib']:.3f} |" for r in mem]
        lines.append("")
    ex = [r for r in rows if r.get("section") == "examples" and "fwd_ms" in r]
    if ex:
        lines += ["## examples (B=2, S=8192)", "",
                  "| example | impl | fwd ms | fwd+bwd ms | AttnFuse speedup fwd | fwd+bwd | max diff vs AttnFuse |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in ex:
            sp = [f"{r[k]:.2f}" if k in r else "" for k in ("fwd_speedup_of_attnfuse", "fwd_bwd_speedup_of_attnfuse")]
            diff = f"{r['max_diff_vs_attnfuse']:.3g}" if "max_diff_vs_attnfuse" in r else ""
            lines.append(f"| {r['example']} | {r['name']} | {r['fwd_ms']:.3f} | {r.get('fwd_bwd_ms', float('nan')):.3f} | "
                         f"{sp[0]} | {sp[1]} | {diff} |")
        lines.append("")
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["## errors", ""] + [f"- S={r.get('seq', '')} {r.get('example', '')} {r['name']}: {r['error']}"
                                      for r in errors]
    return "\n".join(lines)


def plots(rows: list[dict[str, Any]], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for section in ("sweep", "sweep_training"):
        sel = [r for r in rows if r.get("section") == section and "ms" in r]
        if not sel:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name in sorted({r["name"] for r in sel}):
            pts = sorted((r["seq"], r["ms"] / 1e3 / max(1, TOKENS // r["seq"]) / r["seq"] * 1e9)
                         for r in sel if r["name"] == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("S (B*S = 16384)")
        ax.set_ylabel("ns per token")
        ax.set_title(f"Llama-3-8B attention, {section}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{section}.png", dpi=110)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default="forward,training,sweep,memory,examples")
    parser.add_argument("--seqs", default="2048,4096,8192,16384")
    parser.add_argument("--training-seqs", default="2048,4096,8192,16384")
    parser.add_argument("--sweep", default="256,512,1024,2048,4096,8192,16384")
    parser.add_argument("--variants", default="", help="only these forward/training variants (comma-separated)")
    args = parser.parse_args()
    if args.variants:
        keep = set(args.variants.split(","))
        for table in (FORWARD_VARIANTS, TRAINING_VARIANTS):
            for name in [n for n in table if n not in keep]:
                del table[name]
    args.out.mkdir(parents=True, exist_ok=True)
    seqs = [int(s) for s in args.seqs.split(",")]
    sweep = [int(s) for s in args.sweep.split(",")]
    sections = args.sections.split(",")
    rows: list[dict[str, Any]] = []
    started = time.time()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "sections": sections}

    def save() -> None:  # after every section, so a run stopped at its time limit keeps what it measured
        (args.out / "results.json").write_text(json.dumps({**meta, "seconds": time.time() - started,
                                                           "rows": rows}, indent=1))
        print(f"[{time.time() - started:.0f} s] {len(rows)} rows", flush=True)

    if "forward" in sections:
        run_forward(seqs, FORWARD_VARIANTS, rows, "forward")
        save()
    if "training" in sections:
        run_training([int(s) for s in args.training_seqs.split(",")], TRAINING_VARIANTS, rows, "training")
        save()
    if "sweep" in sections:
        run_forward(sweep, {s: pipeline(s) for s in ("fused", "hybrid", "separate")}, rows, "sweep")
        save()
        run_training(sweep, {s: TRAINING_VARIANTS[s] for s in ("fused", "hybrid", "separate")}, rows, "sweep_training")
        save()
    if "memory" in sections:
        run_memory(32768, rows)
        save()
    if "examples" in sections:
        from run_examples import run_examples

        run_examples(bench, rows)
        save()
    text = summary(rows)
    (args.out / "summary.md").write_text(text)
    plots(rows, args.out)
    print(text)


if __name__ == "__main__":
    main()
