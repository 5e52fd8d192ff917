"""The cost model against a measured sweep: predicted vs measured time added over `hybrid`.

Reads a `bench/run_all.py` JSON file (its `sweep` / `sweep_training` sections) or a
`bench/cost_sweep.py` one (per program family, each row with its shape), predicts each
placement with `attnfuse.cost` on a target, and writes one PNG per pass (and family)
with the measured and predicted `t(fused) - t(hybrid)` and `t(separate) - t(hybrid)`
(in % of the measured `t(hybrid)`) against S, `fused`'s measured and predicted
crossovers marked, plus a markdown table of choices (no GPU needed; matplotlib):

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
    """Per placement, (measured, predicted) seconds added over hybrid."""
    t = case.times
    predicted = {p: model.predict(case.shape, target, p, backward=case.backward).total for p in model.PLACEMENTS}
    return {p: (t[p] - t["hybrid"], predicted[p] - predicted["hybrid"]) for p in ("fused", "separate")}


def crossing(seqs: list[int], diffs: list[float]) -> float | None:
    """The first S at which `diffs` (fused - other) turns from negative to >= 0, by
    linear interpolation between neighbouring S; None if it never does."""
    for (s0, d0), (s1, d1) in zip(zip(seqs, diffs), zip(seqs[1:], diffs[1:])):
        if d0 < 0 <= d1:
            return s0 + (s1 - s0) * -d0 / (d1 - d0)
    return None


def plot(cases: list[Case], target: Target, backward: bool, out: Path, family: str = "") -> Path:
    """Measured and predicted `t(p) - t(hybrid)` per S, both crossovers of `fused`
    (measured and predicted, each interpolated between the sweep's S) marked. Points
    that ran the Triton kernels in a Gluon family (S not a multiple of 128) are hollow
    and left out of the crossovers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = sorted((c for c in cases if c.backward == backward), key=lambda c: c.shape.seq_len)
    if not sel:
        raise SystemExit(f"no {'forward + backward' if backward else 'forward'} cases{' of ' + family if family else ''}")
    seqs = [c.shape.seq_len for c in sel]
    mixed = len({c.shape.hopper for c in sel}) > 1
    added = [_added(c, target) for c in sel]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for placement, color in (("fused", "tab:red"), ("separate", "tab:blue")):
        for k, (kind, style, marker) in enumerate((("measured", "-", "o"), ("predicted", "--", "x"))):
            ys = [100 * a[placement][k] / c.times["hybrid"] for a, c in zip(added, sel, strict=True)]
            ax.plot(seqs, ys, style, color=color, label=f"{placement} - hybrid, {kind}")
            for c, x, y in zip(sel, seqs, ys, strict=True):
                hollow = mixed and not c.shape.hopper and marker == "o"
                ax.plot([x], [y], marker, color=color, mfc="none" if hollow else color)
    ax.axhline(0.0, color="gray", lw=0.8)
    # crossings in seconds (a % of t(hybrid) interpolates differently), on the family's own kernel
    own = [i for i, c in enumerate(sel) if c.shape.hopper == sel[-1].shape.hopper]
    for other, style in (("hybrid", ":"), ("separate", "-.")):
        for k, (kind, color) in enumerate((("measured", "dimgray"), ("predicted", "black"))):
            diffs = [added[i]["fused"][k] - (added[i]["separate"][k] if other == "separate" else 0.0) for i in own]
            found = crossing([seqs[i] for i in own], diffs)
            if found is not None:
                ax.axvline(found, color=color, ls=style, lw=1.2 if k else 2.0, alpha=0.9,
                           label=f"fused/{other} crossover, {kind}: S = {found:.0f}")
            else:
                ax.plot([], [], " ", label=f"fused/{other}, {kind}: "
                        f"{'fused slower at every S' if diffs[0] >= 0 else 'fused faster at every S'}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("S (batch x S fixed)" + ("; hollow: the Triton kernels (S not a multiple of 128)" if mixed else ""))
    ax.set_ylabel("time added over hybrid, % of t(hybrid)")
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
