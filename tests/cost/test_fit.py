"""The model against the stored H200 measurements (docs/bench/: run 34's Triton-only
sweep and run 14 on the Triton kernels, run 30's rounds sweep, run 26's sweep and run 20
on the Gluon kernels; run 11 loads as history). Runs before 23 had no saved sides in the backward
(`saved_sides=False`)."""

from __future__ import annotations

import collections
import dataclasses
import json
import unittest.mock
from pathlib import Path

import pytest

from attnfuse.cost import model
from attnfuse.cost.fit import LLAMA3_8B, LLAMA3_8B_HOPPER, Case, fit, fit_kv_slack, load_cases, load_sweep, score
from attnfuse.cost.target import get_target

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"
H200 = get_target("h200")
RUN14 = load_cases(BENCH / "h200-run14.json", {"sweep": False, "sweep_training": True})
RUN14_MAIN = load_cases(BENCH / "h200-run14.json", {"forward": False, "training": True})
RUN11 = load_cases(BENCH / "h200-run11-sweep.json", {"sweep": False, "sweep_training": True}, block_n=64)
RUN20 = load_cases(BENCH / "h200-run20" / "split_k" / "forward.json", {"forward": False}, base=LLAMA3_8B_HOPPER)
RUN26 = load_sweep(BENCH / "h200-run26" / "cost_sweep.json")
RUN26_GLUON = [c for c in RUN26 if c.shape.hopper]
RUN30 = load_sweep(BENCH / "h200-run30" / "cost_sweep.json")
RUN30_GLUON = [c for c in RUN30 if c.shape.hopper]
RUN34_TRITON = load_sweep(BENCH / "h200-run34" / "callB" / "cost_sweep.json")
H200_SWEEP = load_sweep(BENCH / "h200-run35" / "merged" / "cost_sweep.json")
"""Issue 9's H200 sweep as scored: run 30's cases, those of S <= 1024 re-timed from CUDA
graphs (run 35, call B) and the Gluon families' S >= 16384 over 10 calls (run 34, call D)."""
H200_SWEEP_GLUON = [c for c in H200_SWEEP if c.shape.hopper]


def test_cases_loaded() -> None:
    assert [c.shape.seq_len for c in RUN14 if not c.backward] == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert len(RUN14) == 14 and len(RUN14_MAIN) == 7 and len(RUN11) == 14
    assert all(c.shape.batch * c.shape.seq_len == 16384 for c in RUN14 + RUN14_MAIN + RUN11)


def test_triton_constants_are_the_fit_of_run34() -> None:
    """The Triton kernels' constants are what fit() returns on run 34's Triton-only sweep
    (156 cases, the Gluon kernels switched off; rounded), the drag fitted with them; the
    tile term halves the residual, and without it the ragged S = 320 and 384, where
    `fused`'s 256-row q block is mostly padding, are chosen wrong by up to 22%."""
    assert len(RUN34_TRITON) == 156 and not any(c.shape.hopper for c in RUN34_TRITON)
    result = fit(RUN34_TRITON, H200, drag=True)
    for name in ("rotation_exposure", "prekernel_efficiency", "q_drag", "tile_exposure"):
        assert getattr(result, name) == pytest.approx(getattr(model.TRITON, name), rel=2e-3), name
    assert result.rms_relative < 0.035
    assert score(RUN34_TRITON, H200).hits == 132
    with unittest.mock.patch.object(model, "TRITON", dataclasses.replace(model.TRITON, tile_exposure=0.0)):
        untiled = score(RUN34_TRITON, H200)
    assert {(s, fastest) for s, bwd, _, fastest, loss in untiled.misses if loss > 0.1} == {(320, "hybrid"),
                                                                                         (384, "hybrid")}


def test_hopper_constants_are_the_fit_of_the_h200_sweep() -> None:
    """The Gluon kernels' constants are what fit() returns on the H200 sweep (the six
    families the Gluon forward serves: head dims 64 and 128, GQA groups 1 / 4 / 8, a
    window, a QK-norm; S = 256 .. 65536 where the Gluon forward takes S, i.e. not 320 and
    448; forward and forward + backward), the pre-kernel efficiency held at 0.816, the
    Q, K-rotation, K-norm and pipeline-fill exposures fitted apart and the K/V slack
    searched (the residual's minimum over 0 .. 3: 0.7; on run 30's eager timings alone
    1.3)."""
    assert len(H200_SWEEP) == 182 and len(H200_SWEEP_GLUON) == 132
    result = fit_kv_slack(H200_SWEEP_GLUON, H200, efficiency=model.HOPPER.prekernel_efficiency)
    assert result.kv_slack == model.HOPPER.kv_slack
    for name in ("rotation_exposure", "k_rotation_exposure", "k_norm_exposure", "fill_exposure"):
        assert getattr(result, name) == pytest.approx(getattr(model.HOPPER, name), rel=2e-3), name
    assert result.rms_relative < 0.034  # run 33's fit without fill and slack: 0.049; run 26's: 0.19
    without = fit(H200_SWEEP_GLUON, H200, efficiency=0.816, split_k=True)  # no slack; still a fill
    assert without.rms_relative > result.rms_relative
    # K rotated by the producer beside the matmuls hides partly; Q in the prologue does not
    assert model.HOPPER.k_exposure < 1.0 < model.HOPPER.rotation_exposure < model.TRITON.rotation_exposure
    # one shared exposure, the pre-kernel efficiency fitted: a worse fit of the same cases
    assert fit(H200_SWEEP_GLUON, H200).rms_relative > 2 * result.rms_relative
    eager = fit_kv_slack(RUN30_GLUON, H200, efficiency=0.816)
    assert eager.kv_slack == 1.3 and eager.rotation_exposure == pytest.approx(1.595, abs=1e-3)


def test_h200_sweep_is_run30_retimed() -> None:
    """The scored sweep holds every case of run 30 once, each from run 30 or from one of
    the re-timings, row for row as those files hold it."""
    rows = json.loads((BENCH / "h200-run35" / "merged" / "cost_sweep.json").read_text())["rows"]
    sources = {"run30": BENCH / "h200-run30", "run34/callD": BENCH / "h200-run34" / "callD",
               "run35/callB": BENCH / "h200-run35" / "callB"}
    originals = {name: {(r["family"], r["seq"], r["section"], r["name"]): r
                        for r in json.loads((path / "cost_sweep.json").read_text())["rows"]}
                 for name, path in sources.items()}
    assert [(r["family"], r["seq"], r["section"], r["name"]) for r in rows] == list(originals["run30"])
    by_source = collections.Counter((r["source"], r["seq"] <= 1024) for r in rows)
    assert by_source == {("run35/callB", True): 294, ("run34/callD", False): 108, ("run30", False): 144}
    for row in rows:
        source = row.pop("source")
        assert row == originals[source][row["family"], row["seq"], row["section"], row["name"]]


def test_fit_holds_out_families() -> None:
    """Fitted without one family, the constants choose that family's placements about as
    well as fitted with it: 112 of 132 choices right over the six held-out fits, against
    114 for the fit on all six. The K/V slack rests on group 1: fitted without that
    family it comes out 0 (16 of its 22 right), with it 0.5-0.9."""
    def key(c: Case) -> tuple[object, ...]:
        return c.shape.head_dim, c.shape.kv_heads, c.shape.window, c.shape.k_norm

    families = sorted({key(c) for c in H200_SWEEP_GLUON}, key=str)
    hits = 0
    for held in families:
        trained = fit_kv_slack([c for c in H200_SWEEP_GLUON if key(c) != held], H200, efficiency=0.816)
        shape_constants = trained.constants
        if trained.k_norm_exposure is None:  # the held-out family is the only one with a K norm
            shape_constants = dataclasses.replace(shape_constants, k_norm_exposure=model.HOPPER.k_norm_exposure)
        assert (trained.kv_slack == 0.0) == (held[1] == 32)
        with unittest.mock.patch.object(model, "HOPPER", shape_constants):
            hits += score([c for c in H200_SWEEP_GLUON if key(c) == held], H200).hits
    assert len(families) == 6 and hits == 112 and score(H200_SWEEP_GLUON, H200).hits == 114


def test_auto_on_the_h200_sweep() -> None:
    """Issue 9's bar on the H200 sweep: 164 of 182 choices right (90.1%; the issue asks
    90%), every miss within 3% (the worst 2.7%: `hybrid` for `separate` at S = 65536
    forward, groups 1 and 4, and at S = 16384 forward + backward); 17 of the 18 misses are
    `hybrid` against `separate`, the other `hybrid` against `fused` (0.4%). The re-timed
    cases alone: the 98 of S <= 1024, from CUDA graphs, all right."""
    result = score(H200_SWEEP, H200)
    assert (result.cases, result.hits) == (182, 164)
    assert 0.026 < result.worst_loss < 0.03
    assert sum({m[2], m[3]} == {"hybrid", "separate"} for m in result.misses) == 17
    graphs = load_sweep(BENCH / "h200-run35" / "callB" / "cost_sweep.json")
    assert (len(graphs), score(graphs, H200).hits) == (98, 98)


def test_auto_on_run30_eager_timings() -> None:
    """Run 30's own timings (eager `do_bench`, medians of three rounds): 163 of 182 right,
    four misses above 3%: forward + backward at head dim 64, S = 384 (5.1%, its `hybrid`
    rounds spread by 17%), the group-1 forward at S = 1024 (6.1%; `fused` 1.2% slower
    than `hybrid` from CUDA graphs) and the S = 65536 forwards of groups 1 and 4 (3.3
    and 3.9%; 2.7% each over 10 calls). A single round of the same sweep picks the
    medians' fastest placement in 90% of cases (docs/cost-model.md)."""
    result = score(RUN30, H200)
    assert (result.cases, result.hits) == (182, 163)
    assert sorted((s, bwd) for s, bwd, *_, loss in result.misses if loss > 0.03) == [
        (384, True), (1024, False), (65536, False), (65536, False)]


def test_saved_q_store_matches_run30() -> None:
    """`hybrid`'s forward kernel writes the rotated Q for the backward
    (`Work.kernel_store_bytes`), charged at the H200's bandwidth times
    `KERNEL_STORE_EXPOSURE`: measured, forward + backward `hybrid - separate` less the
    forward's is, per family (median over S = 256 .. 16384, batch x S = 16384), 0.39-1.07
    of the full store time, median 0.51 (before run 31 the model charged it as half a
    pre-kernel: at d256 103 us against 34 measured); with a QK-norm Q is recomputed
    either way (0.7 us measured, nothing charged)."""
    import statistics

    by_key = {(c.shape.head_dim, c.shape.group, c.shape.window, c.shape.k_norm, c.shape.seq_len, c.backward): c
              for c in RUN30}
    ratios = []
    for family in {key[:4] for key in by_key}:
        extra = []
        for s in (256, 320, 384, 448, 512, 768, 1024, 2048, 4096, 8192, 16384):
            fwd, both = by_key[(*family, s, False)], by_key[(*family, s, True)]
            extra.append((both.times["hybrid"] - both.times["separate"])
                         - (fwd.times["hybrid"] - fwd.times["separate"]))
        shape = by_key[(*family, 1024, True)].shape
        full = (model.backward_work(shape, "hybrid").kernel_store_bytes
                - model.backward_work(shape, "separate").kernel_store_bytes) / H200.bandwidth()
        if shape.q_norm:
            assert full == 0 and abs(statistics.median(extra)) < 2e-6
        else:
            ratios.append(statistics.median(extra) / full)
    assert len(ratios) == 6 and min(ratios) > 0.35 and max(ratios) < 1.1
    assert statistics.median(ratios) == pytest.approx(model.KERNEL_STORE_EXPOSURE, abs=0.02)


def test_wide_triton_drag_is_run30s_median() -> None:
    """`TRITON_WIDE.q_drag`: at head dim 256 (the Triton forward) the kernel that rotates Q
    is slower than the one reading it rotated by a fraction of the attention floor that
    does not move with S: its median over run 30's forward cases; with it the
    family's placements are right 26 of 26 times (with head dim 128's 2.5%: 20, 2 misses
    above 3%; without a drag: 14, and 5 misses above 3%)."""
    import statistics

    wide = [c for c in RUN30 if c.shape.head_dim > 128]
    assert not any(c.shape.hopper for c in wide) and len(wide) == 26
    drags = []
    for case in wide:
        if case.backward:
            continue
        hybrid, separate = (model.predict(case.shape, H200, p) for p in ("hybrid", "separate"))
        modelled = (hybrid.prekernels + hybrid.in_kernel_rotation - model.TRITON_WIDE.q_drag * hybrid.attention
                    - separate.extra)
        drags.append((case.times["hybrid"] - case.times["separate"] - modelled) / hybrid.attention)
    assert min(drags) > 0.14 and max(drags) < 0.22
    assert statistics.median(drags) == pytest.approx(model.TRITON_WIDE.q_drag, abs=1e-3)
    result = score(wide, H200)
    assert result.hits == 26
    with unittest.mock.patch.object(model, "TRITON_WIDE", model.TRITON):
        narrow = score(wide, H200)
    assert narrow.hits == 20 and sum(loss > 0.03 for *_, loss in narrow.misses) == 2
    with unittest.mock.patch.object(model, "TRITON_WIDE", dataclasses.replace(model.TRITON, q_drag=0.0)):
        undragged = score(wide, H200)
    assert undragged.hits == 14 and sum(loss > 0.03 for *_, loss in undragged.misses) == 5


def test_auto_on_run26_sweep() -> None:
    """Run 26's single timings of the Gluon families (not in the fit), at the S the Gluon
    forward takes: 109 of 132 right."""
    result = score(RUN26_GLUON, H200)
    assert (result.cases, result.hits) == (132, 109)


def test_sweeps_record_ragged_s_as_triton() -> None:
    """Sweeps before run 33 stored S = 320 and 448 of the Gluon families as Gluon shapes;
    those calls ran the Triton kernels (the TMA tiles need S a multiple of 128), and
    `load_sweep` says so: 24 such cases in run 30, scored with the Triton constants: all
    right (before the tile term, session 34, group 1's forward at S = 320 was not:
    `fused` chosen and 19% slower than `hybrid`, its second 256-row q block 3/4 padding)."""
    ragged = [c for c in RUN30 if c.shape.head_dim <= 128 and c.shape.seq_len % 128]
    assert len(ragged) == 24 and {c.shape.seq_len for c in ragged} == {320, 448}
    assert not any(c.shape.hopper for c in ragged)
    assert all((c.shape.fused_block_m, c.shape.fused_block_n) == (256, 64) for c in ragged)
    assert score(ragged, H200).hits == 24


def test_auto_on_run20_forward() -> None:
    """hybrid measured fastest at every S of run 20, and the model picks it each time."""
    assert all(c.fastest == "hybrid" for c in RUN20)
    result = score(RUN20, H200)
    assert result.cases == 4 and result.hits == 4


def test_auto_on_run14_sweep() -> None:
    """Run 14's Triton kernel (not in the fit since session 34; fitted alone it gave
    exposure 2.23, efficiency 0.545): 13 of 14, the miss `separate` chosen at S = 16384
    forward, where `hybrid` measured 0.4% faster."""
    result = score(RUN14, H200, saved_sides=False)
    assert result.cases == 14 and result.hits == 13 and result.hit_rate >= 0.9
    assert [(s, bwd, chosen, fastest) for s, bwd, chosen, fastest, _ in result.misses] == [
        (16384, False, "separate", "hybrid")]
    assert result.worst_loss < 0.005


def test_auto_on_run14_main_sections() -> None:
    """Run 14's forward / training sections: 7 of 7 (the drag of the kernel that rotates
    Q picks `separate` at 16384, where it measured 1.7% / 0.5% faster)."""
    result = score(RUN14_MAIN, H200, saved_sides=False)
    assert result.hits == 7


def test_fused_never_fastest_and_model_agrees() -> None:
    """Run 14: fused is slower than a pre-kernel placement at every measured S (its old
    win at S = 256 in run 11 is gone now that the pre-kernels read cos/sin tables); the
    model's crossover is below the smallest measured S."""
    assert all(c.fastest != "fused" for c in RUN14 + RUN14_MAIN)
    assert all(model.choose(c.shape, H200, backward=c.backward, saved_sides=False) != "fused"
               for c in RUN14 + RUN14_MAIN)
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


def test_sweep_triton_only_builds_no_gluon_kernel() -> None:
    """`cost_sweep.py --triton-only` lowers without sm_90's Gluon kernels (forward and
    backward), so an H200 times what other GPUs run (the same options for every
    placement: `hybrid`'s lowering is checked)."""
    import sys

    from attnfuse.dialects.tile_hopper import KernelOp as GluonKernelOp
    from attnfuse.pass_manager import PassManager
    from attnfuse.reference import parse_program

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import cost_sweep

    text = cost_sweep.program_text("d128_g4", cost_sweep.FAMILIES["d128_g4"])
    counts = []
    for triton_only in (False, True):
        module = PassManager(cost_sweep.pipeline("hybrid", triton_only)).run(parse_program(text))
        counts.append(sum(isinstance(op, GluonKernelOp) for op in module.walk()))
    assert counts[0] >= 2 and counts[1] == 0, counts  # the Gluon forward and backward, then neither
    assert all(cost_sweep.TRITON_ONLY[name] in cost_sweep.pipeline(p, True) for p in cost_sweep.PLACEMENTS
               for name in cost_sweep.TRITON_ONLY)


def test_validation_crossing_interpolates_the_first_sign_change() -> None:
    """`bench/cost_validation.py` marks a crossover where `fused - other` first turns from
    negative to >= 0, linearly between the sweep's neighbouring S."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import cost_validation

    assert cost_validation.crossing([1024, 2048, 4096], [-30.0, 10.0, 50.0]) == pytest.approx(1024 + 1024 * 0.75)
    assert cost_validation.crossing([256, 512], [5.0, 9.0]) is None  # fused slower at every S
    assert cost_validation.crossing([256, 512, 1024], [-1.0, 0.0, -2.0]) == 512



def test_calibrated_h200_profile_on_the_h200_sweep() -> None:
    """`attnfuse-calibrate` run on the H200 (run 35, call C): its profile chooses 162 of
    the sweep's 182 placements right, every miss within 3% (the table's `h200`: 164).
    The first run, whose L2 figure came from one copy of a quarter of the L2 (2.5 TB/s,
    below the HBM copy), got 29 right: the in-kernel tables' L2 reads dominated."""
    calibrated = get_target(str(BENCH / "h200-run35" / "callC" / "h200_profile_1.json"))
    assert 8e12 < calibrated.l2_bw < 11e12 and 4.1e12 < calibrated.hbm_bw < 4.4e12
    result = score(H200_SWEEP, calibrated)
    assert result.hits == 162 and result.worst_loss < 0.03
    first = get_target(str(BENCH / "h200-run35" / "callC-first" / "h200_profile_1.json"))
    assert first.l2_bw < first.hbm_bw and score(H200_SWEEP, first).hits == 29
