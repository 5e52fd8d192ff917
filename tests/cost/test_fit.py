"""The model against the stored H200 measurements (docs/bench/, runs 11 and 13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnfuse.cost import model
from attnfuse.cost.fit import LLAMA3_8B, fit, load_cases, score
from attnfuse.cost.target import get_target

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"
H200 = get_target("h200")
RUN11 = load_cases(BENCH / "h200-run11-sweep.json", {"sweep": False, "sweep_training": True}, block_n=64)
RUN13 = load_cases(BENCH / "h200-run13.json", {"forward": False, "training": True})


def test_cases_loaded() -> None:
    assert [c.shape.seq_len for c in RUN11 if not c.backward] == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert len(RUN11) == 14 and len(RUN13) == 7
    assert all(c.shape.batch * c.shape.seq_len == 16384 for c in RUN11 + RUN13)


def test_constants_are_the_fit_of_run11() -> None:
    """The constants in model.py are what fit() returns on run 11 (rounded)."""
    result = fit(RUN11, H200)
    assert result.rotation_exposure == pytest.approx(model.ROTATION_EXPOSURE, rel=2e-3)
    assert result.prekernel_efficiency == pytest.approx(model.PREKERNEL_EFFICIENCY, rel=2e-3)
    assert result.rms_relative < 0.04  # differences to hybrid, relative to hybrid's time


def test_fused_vs_prekernel_decision_matches_run11() -> None:
    """Whether to rotate K in the kernel (the crossover the model is about): every point."""
    for case in RUN11:
        fused_fastest = case.fastest == "fused"
        assert (model.choose(case.shape, H200, backward=case.backward) == "fused") == fused_fastest


def test_auto_on_run11_sweep() -> None:
    """The three-way choice on run 11: 11 of 14 points. The misses are hybrid chosen
    where separate measured fastest at S >= 8192 (128x64 tiles), which the model has
    no term for (docs/cost-model.md); the worst costs 4.8%."""
    result = score(RUN11, H200)
    assert result.hits == 11 and result.cases == 14
    assert {(s, p) for s, _, p, _, _ in result.misses} == {(8192, "hybrid"), (16384, "hybrid")}
    assert all(fastest == "separate" for *_, fastest, _ in result.misses)
    assert result.worst_loss < 0.05


def test_auto_on_run13() -> None:
    assert score(RUN13, H200).hits == 7


def test_crossover_against_run11() -> None:
    """Measured: fused fastest at S = 256, hybrid from 512 (forward and training)."""
    shape = model.AttentionShape(**{**LLAMA3_8B.__dict__, "batch": 64, "seq_len": 256, "block_n": 64})
    s_star = model.crossover_closed_form(shape, H200)
    assert 256 < s_star < 512
    assert model.crossover(shape, H200) == 384
