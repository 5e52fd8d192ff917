"""The cost model against a measured sweep: predicted vs measured time added over `hybrid`.

Reads a `bench/run_all.py` JSON file (its `sweep` / `sweep_training` sections) or a
`bench/cost_sweep.py` one (per program family, each row with its shape), predicts each
placement with `attnfuse.cost` on a target, and writes one PNG per pass (and family)
with the measured and predicted `t(fused) - t(hybrid)` and `t(separate) - t(hybrid)`
against S, the predicted crossovers marked, plus a markdown table of choices (no GPU
needed):

    python bench/cost_validation.py docs/bench/h200-run14.json --target h200 --out docs/bench
    python bench/cost_validation.py DIR/cost_sweep.json --target h200 --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnfuse.cost import model
from attnfuse.cost.fit import Case, load_cases, load_sweep, score
from attnfuse.cost.target import Target, get_target

SECTIONS = {"sweep": False, "sweep_training": True}


def _added(case: Case, target: Target) -> dict[str, tuple[float, float]]:
    """Per placement, (measured, predicted) ms added over hybrid."""
    t = case.times
    hybrid = model.predict(case.shape, target, "hybrid").extra
    return {p: ((t[p] - t["hybrid"]) * 1e3, (model.predict(case.shape, target, p).extra - hybrid) * 1e3)
            for p in ("fused", "separate")}


def plot(cases: list[Case], target: Target, backward: bool, out: Path, family: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = sorted((c for c in cases if c.backward == backward), key=lambda c: c.shape.seq_len)
    if not sel:
        raise SystemExit(f"no {'forward + backward' if backward else 'forward'} cases{' of ' + family if family else ''}")
    seqs = [c.shape.seq_len for c in sel]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for placement, color in (("fused", "tab:red"), ("separate", "tab:blue")):
        pairs = [_added(c, target)[placement] for c in sel]
        ax.plot(seqs, [m for m, _ in pairs], "o-", color=color, label=f"{placement} - hybrid, measured")
        ax.plot(seqs, [p for _, p in pairs], "x--", color=color, label=f"{placement} - hybrid, predicted")
    ax.axhline(0.0, color="gray", lw=0.8)
    shape = sel[0].shape
    for other, style in (("hybrid", ":"), ("separate", "-.")):
        found = model.crossover(shape, target, "fused", other)
        if found is not None:
            ax.axvline(found, color="black", ls=style, lw=1, label=f"predicted crossover fused/{other}: S = {found}")
        else:
            ax.plot([], [], " ", label=f"fused/{other}: no predicted crossover from S = {shape.fused_block_m}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("S (batch x S fixed)")
    ax.set_ylabel("ms added over hybrid (< 0: faster than hybrid)")
    ax.set_title(f"cost model vs measured on {target.name}, {family + ', ' if family else ''}"
                 f"{'forward + backward' if backward else 'forward'}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"cost-validation-{target.name}-{family + '-' if family else ''}{'training' if backward else 'forward'}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(cases: list[Case], target: Target) -> str:
    lines = ["| S | pass | fastest | auto | loss |", "|---:|---|---|---|---:|"]
    for c in sorted(cases, key=lambda c: (c.backward, c.shape.seq_len)):
        chosen = model.choose(c.shape, target, backward=c.backward)
        loss = c.times[chosen] / c.times[c.fastest] - 1
        lines.append(f"| {c.shape.seq_len} | {'fwd+bwd' if c.backward else 'fwd'} | {c.fastest} | {chosen} | "
                     f"{100 * loss:.1f}% |")
    s = score(cases, target)
    lines.append(f"\n{s.hits} of {s.cases} choices right ({100 * s.hit_rate:.0f}%), worst loss {100 * s.worst_loss:.1f}%")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a bench/run_all.py results.json with sweep sections")
    parser.add_argument("--target", default="h200")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    target = get_target(args.target)
    rows = json.loads(args.results.read_text())["rows"]
    families = sorted({r["family"] for r in rows if "shape" in r and "family" in r})
    groups = {f: load_sweep(args.results, [f]) for f in families} if families else {"": load_cases(args.results, SECTIONS)}
    if not any(groups.values()):
        raise SystemExit(f"{args.results}: no sweep rows with all of {', '.join(model.PLACEMENTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for family, cases in groups.items():
        for backward in sorted({c.backward for c in cases}):
            print(plot(cases, target, backward, args.out, family))
        print(f"\n{family}\n" if family else "", table(cases, target), sep="")


if __name__ == "__main__":
    main()
