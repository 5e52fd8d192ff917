"""Fit the model's free constants to measured placements, and score its choices.

The measurements are the rows of a ``bench/run_all.py`` or ``bench/cost_sweep.py`` JSON
file (docs/bench/): per sequence length, the time of each placement. :func:`fit` solves
a weighted linear least-squares problem for the constants that enter the model linearly
(a :class:`~attnfuse.cost.model.KernelConstants`: the rotation exposure, or the Q, K
rotation, K norm and pipeline-fill exposures apart, and 1 / the pre-kernel efficiency
unless a measured one is given), on the measured differences ``t(fused) - t(hybrid)``
and ``t(separate) - t(hybrid)`` (the attention itself cancels), each weighted by
1 / t(hybrid). The K/V slack enters through a ``max`` and is searched on a grid
(:func:`fit_kv_slack`); ``q_drag`` is not fitted here (see ``TRITON_WIDE``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnfuse.analysis.tile_plan import FUSED_TILES
from attnfuse.cost import model
from attnfuse.cost.model import HOPPER_FUSED_TILES, PLACEMENTS, AttentionShape, added_work
from attnfuse.cost.program_shape import gluon_takes
from attnfuse.cost.target import Target

__all__ = ["Case", "Fit", "LLAMA3_8B", "LLAMA3_8B_HOPPER", "Score", "fit", "fit_kv_slack", "load_cases", "load_sweep",
           "score"]

LLAMA3_8B = AttentionShape(batch=1, q_heads=32, kv_heads=8, seq_len=2048, head_dim=128)
"""The benchmarked program (examples/llama3.attn): GQA 32/8, head dim 128, bf16, causal,
on the Triton forward kernel (runs up to 15)."""
LLAMA3_8B_HOPPER = AttentionShape(batch=1, q_heads=32, kv_heads=8, seq_len=2048, head_dim=128, hopper=True,
                                  fused_block_m=HOPPER_FUSED_TILES[0], fused_block_n=HOPPER_FUSED_TILES[1])
"""The same on sm_90's warp-specialized Gluon forward (runs 16 on)."""


@dataclass(frozen=True)
class Case:
    """One measured shape: seconds per placement, forward or forward + backward."""

    shape: AttentionShape
    backward: bool
    seconds: tuple[tuple[str, float], ...]

    @property
    def times(self) -> dict[str, float]:
        return dict(self.seconds)

    @property
    def fastest(self) -> str:
        return min(self.seconds, key=lambda kv: kv[1])[0]


def load_cases(
    path: str | Path, sections: Mapping[str, bool], *, block_n: int = 128, base: AttentionShape = LLAMA3_8B
) -> list[Case]:
    """The cases of a run_all JSON file; ``sections`` maps a section name to whether
    it timed forward + backward; rows lacking a placement are skipped."""
    rows: list[dict[str, Any]] = json.loads(Path(path).read_text())["rows"]
    found: dict[tuple[str, int, int], dict[str, float]] = {}
    for row in rows:
        if row.get("section") in sections and row.get("name") in PLACEMENTS and "ms" in row:
            key = (row["section"], row["seq"], row["batch"])
            found.setdefault(key, {})[row["name"]] = row["ms"] * 1e-3
    cases = []
    for (section, seq, batch), times in sorted(found.items()):
        if set(times) == set(PLACEMENTS):
            shape = AttentionShape(**{**base.__dict__, "seq_len": seq, "batch": batch, "block_n": block_n})
            cases.append(Case(shape, sections[section], tuple(sorted(times.items()))))
    return cases


SWEEP_SECTIONS = {"cost_forward": False, "cost_training": True}
"""`bench/cost_sweep.py`'s sections and whether each timed forward + backward."""


def load_sweep(path: str | Path, families: Iterable[str] | None = None) -> list[Case]:
    """The cases of a `bench/cost_sweep.py` file (each row carries the call's
    `AttentionShape`), of the given families or all; rows lacking a placement
    (an error) leave their case out."""
    rows: list[dict[str, Any]] = json.loads(Path(path).read_text())["rows"]
    keep = None if families is None else set(families)
    found: dict[tuple[str, str, int], tuple[AttentionShape, dict[str, float]]] = {}
    for row in rows:
        if row.get("section") not in SWEEP_SECTIONS or "ms" not in row or (keep is not None and row["family"] not in keep):
            continue
        key = (row["section"], row["family"], row["seq"])
        if key not in found:
            found[key] = (_served(AttentionShape(**row["shape"])), {})
        found[key][1][row["name"]] = row["ms"] * 1e-3
    return [Case(shape, SWEEP_SECTIONS[section], tuple(sorted(times.items())))
            for (section, _, _), (shape, times) in sorted(found.items()) if set(times) == set(PLACEMENTS)]


def _served(shape: AttentionShape) -> AttentionShape:
    """`shape` with the kernels that ran it: sweeps before run 33 recorded every S of a
    Gluon family as Gluon, but S that :func:`gluon_takes` refuses ran the Triton kernels
    (with their fused tiles, `FUSED_TILES` at these head dims)."""
    if not shape.hopper or gluon_takes(shape.seq_len):
        return shape
    return AttentionShape(**{**shape.__dict__, "hopper": False, "fused_block_m": FUSED_TILES[0],
                             "fused_block_n": FUSED_TILES[1]})


@dataclass(frozen=True)
class Fit:
    """Fitted constants and the weighted RMS of the relative residuals."""

    rotation_exposure: float
    prekernel_efficiency: float
    rms_relative: float
    k_rotation_exposure: float | None = None
    k_norm_exposure: float | None = None
    """Set by ``fit(..., split_k=True)``; the K norm's only where a case has one."""
    fill_exposure: float = 0.0
    """Set by ``fit(..., split_k=True)``."""
    kv_slack: float = 0.0
    """The slack the fit was made with (``fit(..., kv_slack=)``)."""
    q_drag: float = 0.0
    """Set by ``fit(..., drag=True)``."""
    tile_exposure: float = 0.0
    """Set where `fused`'s tiles differ from the others' in some case."""

    @property
    def constants(self) -> model.KernelConstants:
        return model.KernelConstants(self.rotation_exposure, self.prekernel_efficiency, self.k_rotation_exposure,
                                     self.k_norm_exposure, q_drag=self.q_drag, fill_exposure=self.fill_exposure,
                                     kv_slack=self.kv_slack, tile_exposure=self.tile_exposure)


def fit(cases: Iterable[Case], target: Target, *, efficiency: float | None = None, split_k: bool = False,
        saved_sides: bool = True, kv_slack: float = 0.0, drag: bool = False) -> Fit:
    """Least-squares constants for ``target`` (see the module docstring). ``split_k``:
    separate exposures for Q, for K's rotation, for K's norm and for the work items'
    first K tiles (the Gluon schedule, whose producer transforms K), the K rotation less
    ``kv_slack`` K/V stream times; ``efficiency``: the pre-kernel efficiency held fixed
    (a per-kernel measurement) instead of fitted; ``drag``: also fit ``q_drag``;
    ``saved_sides``: the backward of :func:`~attnfuse.cost.model.backward_work` (False
    for sweeps before run 23). The tile exposure is fitted where `fused`'s tiles differ
    from the other placements' in some case."""
    import numpy as np

    cases = list(cases)
    names = ["q", "k_rot", "k_norm", "fill"] if split_k else ["rotation"]
    names += ["drag", "tiles", "inverse_efficiency"] if drag else ["tiles", "inverse_efficiency"]
    rows, ys = [], []
    for case in cases:
        t, shape = case.times, case.shape
        weight = 1.0 / t["hybrid"]
        floor = model.tile_flops(shape) / target.matmul_flops(shape.dtype)

        def work(p: str) -> tuple[dict[str, float], float]:
            """(seconds per unit of each fitted constant, seconds not fitted)."""
            w = added_work(shape, p)
            moved, fixed = w.prekernel_bytes, w.launches * model.LAUNCH_S
            if case.backward:
                bwd = model.backward_work(shape, p, saved_sides=saved_sides)
                moved += bwd.prekernel_bytes
                stored = model.KERNEL_STORE_EXPOSURE * bwd.kernel_store_bytes / target.bandwidth()
                fixed += bwd.launches * model.LAUNCH_S + stored
            q_side, k_rot, k_norm = w.in_kernel_seconds(target, shape)
            cols = {"inverse_efficiency": moved / target.bandwidth(), "drag": floor if p != "separate" else 0.0,
                    "tiles": model.fused_tile_seconds(shape, target) if p == "fused" else 0.0}
            if split_k:
                cols |= {"q": q_side, "k_rot": w.k_rotation_past_slack(target, shape, kv_slack), "k_norm": k_norm,
                         "fill": w.fill_seconds(target, shape)}
            else:
                cols["rotation"] = q_side + k_rot + k_norm
            return cols, fixed

        base, base_fixed = work("hybrid")
        for p in ("fused", "separate"):
            cols, fixed = work(p)
            rows.append([weight * (cols[n] - base[n]) for n in names])
            ys.append(weight * (t[p] - t["hybrid"] - (fixed - base_fixed)))
    a, y = np.array(rows), np.array(ys)
    used = [i for i, n in enumerate(names) if np.any(a[:, i]) and not (n == "inverse_efficiency" and efficiency)]
    if efficiency is not None:
        y = y - a[:, -1] / efficiency
    solution, *_ = np.linalg.lstsq(a[:, used], y, rcond=None)
    rms = float(np.sqrt(np.mean((a[:, used] @ solution - y) ** 2)))
    values = {names[i]: float(x) for i, x in zip(used, solution, strict=True)}
    first = values["q"] if split_k else values["rotation"]
    inverse_eff = values.get("inverse_efficiency")
    return Fit(first, efficiency if inverse_eff is None else 1.0 / inverse_eff, rms,
               values.get("k_rot"), values.get("k_norm"), values.get("fill", 0.0), kv_slack,
               values.get("drag", 0.0), values.get("tiles", 0.0))


def fit_kv_slack(cases: Iterable[Case], target: Target, *, efficiency: float | None = None,
                 slacks: Iterable[float] = tuple(i / 10 for i in range(31))) -> Fit:
    """``fit(..., split_k=True, kv_slack=h)`` for the ``h`` in ``slacks`` whose fit has
    the smallest residual (the slack enters the model through a ``max``, not linearly)."""
    cases = list(cases)
    return min((fit(cases, target, efficiency=efficiency, split_k=True, kv_slack=h) for h in slacks),
               key=lambda f: f.rms_relative)


@dataclass(frozen=True)
class Score:
    """How the model's choices compare with the measured-fastest placements."""

    cases: int
    hits: int
    misses: tuple[tuple[int, bool, str, str, float], ...]
    """(S, backward, chosen, fastest, loss = t(chosen) / t(fastest) - 1) per miss."""

    @property
    def hit_rate(self) -> float:
        return self.hits / self.cases if self.cases else 0.0

    @property
    def worst_loss(self) -> float:
        return max((m[4] for m in self.misses), default=0.0)


def score(cases: Iterable[Case], target: Target, *, saved_sides: bool = True) -> Score:
    """Compare :func:`~attnfuse.cost.model.choose` with the measured-fastest placement."""
    cases = list(cases)
    misses = []
    for case in cases:
        chosen = model.choose(case.shape, target, backward=case.backward, saved_sides=saved_sides)
        if chosen != case.fastest:
            t = case.times
            loss = t[chosen] / t[case.fastest] - 1
            misses.append((case.shape.seq_len, case.backward, chosen, case.fastest, loss))
    return Score(len(cases), len(cases) - len(misses), tuple(misses))
