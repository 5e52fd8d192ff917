"""The model against the stored H200 measurements (docs/bench/: run 14 on the Triton
forward, run 26's sweep and run 20 on the Gluon kernels; run 11 loads as history)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnfuse.cost import model
from attnfuse.cost.fit import LLAMA3_8B, LLAMA3_8B_HOPPER, fit, load_cases, load_sweep, score
from attnfuse.cost.target import get_target

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"
H200 = get_target("h200")
RUN14 = load_cases(BENCH / "h200-run14.json", {"sweep": False, "sweep_training": True})
RUN14_MAIN = load_cases(BENCH / "h200-run14.json", {"forward": False, "training": True})
RUN11 = load_cases(BENCH / "h200-run11-sweep.json", {"sweep": False, "sweep_training": True}, block_n=64)
RUN20 = load_cases(BENCH / "h200-run20" / "split_k" / "forward.json", {"forward": False}, base=LLAMA3_8B_HOPPER)
RUN26 = load_sweep(BENCH / "h200-run26" / "cost_sweep.json")
RUN26_GLUON = [c for c in RUN26 if c.shape.hopper]


def test_cases_loaded() -> None:
    assert [c.shape.seq_len for c in RUN14 if not c.backward] == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert len(RUN14) == 14 and len(RUN14_MAIN) == 7 and len(RUN11) == 14
    assert all(c.shape.batch * c.shape.seq_len == 16384 for c in RUN14 + RUN14_MAIN + RUN11)


def test_constants_are_the_fit_of_run14() -> None:
    """The constants in model.py are what fit() returns on run 14's sweep (rounded)."""
    result = fit(RUN14, H200)
    assert result.rotation_exposure == pytest.approx(model.TRITON.rotation_exposure, rel=2e-3)
    assert result.prekernel_efficiency == pytest.approx(model.TRITON.prekernel_efficiency, rel=2e-3)
    assert result.rms_relative < 0.03  # differences to hybrid, relative to hybrid's time


def test_hopper_constants_are_the_fit_of_run26() -> None:
    """The Gluon kernels' constants are what fit() returns on run 26's sweep (the six
    families the Gluon forward serves: head dims 64 and 128, GQA groups 1 / 4 / 8, a
    window, a QK-norm; S = 256 .. 65536; forward and forward + backward)."""
    assert len(RUN26) == 182 and len(RUN26_GLUON) == 156
    result = fit(RUN26_GLUON, H200)
    assert result.rotation_exposure == pytest.approx(model.HOPPER.rotation_exposure, rel=2e-3)
    assert result.prekernel_efficiency == pytest.approx(model.HOPPER.prekernel_efficiency, rel=2e-3)
    # a poor fit (docs/cost-model.md, run 26): what a placement does to the attention
    # kernel itself is not in the model
    assert 0.1 < result.rms_relative < 0.25
    assert model.HOPPER.rotation_exposure < model.TRITON.rotation_exposure


def test_auto_on_run26_sweep() -> None:
    """Where the model stands on the Gluon kernels: 128 of 156 choices right (82%, the
    issue asks 90%), the worst miss 9.3% (it asks < 3%)."""
    result = score(RUN26_GLUON, H200)
    assert (result.cases, result.hits) == (156, 128)
    assert result.worst_loss < 0.1


def test_auto_on_run20_forward() -> None:
    """hybrid measured fastest at every S of run 20, and the model picks it each time."""
    assert all(c.fastest == "hybrid" for c in RUN20)
    result = score(RUN20, H200)
    assert result.cases == 4 and result.hits == 4


def test_auto_on_run14_sweep() -> None:
    """The issue's bar on the sweep: >= 90% of choices right, < 3% lost per miss. 13 of
    14: the miss is hybrid chosen at S = 16384 forward + backward, where separate
    measured 2.1% faster."""
    result = score(RUN14, H200)
    assert result.cases == 14 and result.hits == 13 and result.hit_rate >= 0.9
    assert [(s, bwd, chosen, fastest) for s, bwd, chosen, fastest, _ in result.misses] == [
        (16384, True, "hybrid", "separate")]
    assert result.worst_loss < 0.03


def test_auto_on_run14_main_sections() -> None:
    """Run 14's forward / training sections (not in the fit): 5 of 7; both misses are
    hybrid chosen at 16384 where separate measured 1.7% / 0.5% faster."""
    result = score(RUN14_MAIN, H200)
    assert result.hits == 5 and result.worst_loss < 0.02
    assert {(s, fastest) for s, _, _, fastest, _ in result.misses} == {(16384, "separate")}


def test_fused_never_fastest_and_model_agrees() -> None:
    """Run 14: fused is slower than a pre-kernel placement at every measured S (its old
    win at S = 256 in run 11 is gone now that the pre-kernels read cos/sin tables); the
    model's crossover is below the smallest measured S."""
    assert all(c.fastest != "fused" for c in RUN14 + RUN14_MAIN)
    assert all(model.choose(c.shape, H200, backward=c.backward) != "fused" for c in RUN14 + RUN14_MAIN)
    shape = model.AttentionShape(**{**LLAMA3_8B.__dict__, "batch": 64, "seq_len": 256})
    assert model.crossover_closed_form(shape, H200) < 256
    assert model.crossover(shape, H200) is None


def test_sweep_rows_load_as_cases(tmp_path: Path) -> None:
    """bench/cost_sweep.py's rows (each with the call's shape) load as cases; a case
    with a failed placement is left out, families filter."""
    import dataclasses
    import json

    hopper = dataclasses.asdict(model.AttentionShape(**{**LLAMA3_8B_HOPPER.__dict__, "batch": 8}))
    d64 = {**hopper, "head_dim": 64}
    rows = [{"section": section, "family": family, "seq": 2048, "batch": 8, "name": p, "ms": ms, "shape": shape}
            for section in ("cost_forward", "cost_training")
            for family, shape in (("d128_g4", hopper), ("d64_g4", d64))
            for p, ms in (("fused", 0.8), ("hybrid", 0.6), ("separate", 0.65))]
    rows[-1] = {**rows[-1], "ms": None}
    del rows[-1]["ms"]  # d64_g4's training separate failed
    path = tmp_path / "cost_sweep.json"
    path.write_text(json.dumps({"rows": rows}))
    cases = load_sweep(path)
    assert [(c.shape.head_dim, c.backward) for c in cases] == [(128, False), (64, False), (128, True)]
    assert all(c.shape.hopper and c.fastest == "hybrid" for c in cases)
    assert [c.shape.head_dim for c in load_sweep(path, ["d128_g4"])] == [128, 128]


def test_sweep_families_build() -> None:
    """Every family of bench/cost_sweep.py builds, and its shape on the H200 is what the
    family says (32 query heads; the Gluon forward for head dims 64 and 128)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import cost_sweep

    for name, family in cost_sweep.FAMILIES.items():
        text = cost_sweep.program_text(name, family)
        shape = cost_sweep.shape_row(text, 4096, cost_sweep.batch_of(4096, 16384), H200)
        assert (shape["q_heads"], shape["kv_heads"], shape["head_dim"]) == (32, 32 // family.group, family.head_dim)
        assert (shape["window"], shape["q_norm"], shape["k_norm"], shape["batch"]) == (
            family.window, family.qk_norm, family.qk_norm, 4)
        assert shape["hopper"] == (family.head_dim in (64, 128))
