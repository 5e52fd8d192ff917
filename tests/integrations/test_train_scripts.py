"""bench/train_step.py and bench/train_fsdp2.py on a tiny Llama on the CPU (f32, kernels
through the Triton interpreter, no torch.compile): finite losses, AttnFuse's equal to
SDPA's at step 0, the JSON fields the GPU runs report, and FSDP2 on gloo with two
processes against one process on the same data."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
MODEL = ["--device", "cpu", "--dtype", "f32", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
         "--head-dim", "16", "--mlp", "128", "--vocab", "256", "--layers", "2"]
FSDP2 = [*MODEL, "--batch", "1", "--seq", "16", "--steps", "2", "--warmup", "1"]


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    """The two scripts as modules (train_fsdp2 imports train_step from its folder)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        yield importlib.import_module("train_step"), importlib.import_module("train_fsdp2")
    finally:
        sys.path.remove(str(REPO / "bench"))


def _finite(values: list[float]) -> bool:
    return bool(values) and all(math.isfinite(v) for v in values)


def test_timed_steps(bench: tuple[ModuleType, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train_step, _ = bench
    fused: list[object] = []
    compiled_fused = train_step.huggingface_rope.compiled_fused
    monkeypatch.setattr(train_step.huggingface_rope, "compiled_fused",
                        lambda config: fused.append(config) or compiled_fused(config))
    train_step.main(["--out", str(tmp_path), *MODEL, "--impls", "attnfuse,attnfuse_rope,sdpa", "--seqs", "16",
                     "--tokens", "32", "--warmup", "1", "--steps", "1", "--compile", "none"])
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["estimate_gib"]["total"] > 0 and result["parameters"] > 0 and "RoPE" in result["notes"][0]
    rows = {row["impl"]: row for row in result["rows"]}
    assert set(rows) == {"attnfuse", "attnfuse_rope", "sdpa"}
    for row in rows.values():
        assert {"step_ms", "tokens_per_s", "peak_gib", "time_ratio_to_best", "first_step_s", "graph_breaks",
                "graph_break_reasons", "attnfuse_kernels", "step_ms_all"} <= set(row)
        assert row["graph_breaks"] == sum(row["graph_break_reasons"].values())
        assert row["seq"] == 16 and row["batch"] == 2 and _finite(row["losses"]) and len(row["losses"]) == 2
    assert min(row["time_ratio_to_best"] for row in rows.values()) == 1.0
    assert abs(rows["attnfuse"]["losses"][0] - rows["sdpa"]["losses"][0]) < 1e-5
    # RoPE in AttnFuse's kernels (f32 tables) against the model's: the same loss
    assert abs(rows["attnfuse_rope"]["losses"][0] - rows["sdpa"]["losses"][0]) < 1e-5 and fused
    assert "| attnfuse |" in (tmp_path / "summary.md").read_text()


def test_convergence(bench: tuple[ModuleType, ModuleType], tmp_path: Path) -> None:
    train_step, _ = bench
    train_step.main(["--out", str(tmp_path), *MODEL, "--impls", "attnfuse,sdpa", "--seqs", "16", "--convergence",
                     "--convergence-steps", "2", "--convergence-tokens", "32", "--compile", "none"])
    result = json.loads((tmp_path / "convergence.json").read_text())
    assert result["corpus"]["bytes"] > 100_000 and len(result["corpus"]["sha256"]) == 64
    assert result["reference"] == "sdpa" and not result["errors"]
    assert all(_finite(curve) and len(curve) == 2 for curve in result["curves"].values())
    assert abs(result["curves"]["attnfuse"][0] - result["curves"]["sdpa"][0]) < 1e-5
    assert result["differences"]["attnfuse vs sdpa"]["max_abs"] < 1e-4
    assert "| attnfuse |" in (tmp_path / "convergence.md").read_text()


def test_fsdp2_against_one_process(bench: tuple[ModuleType, ModuleType], tmp_path: Path) -> None:
    _, train_fsdp2 = bench
    train_fsdp2.main(["--out", str(tmp_path / "sdpa"), *FSDP2, "--single", "--impl", "sdpa", "--steps", "1"])
    train_fsdp2.main(["--out", str(tmp_path), *FSDP2, "--single"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(REPO / "bench" / "train_fsdp2.py"), "--out", str(tmp_path), *FSDP2],
                   check=True, env=env, timeout=300)
    single, fsdp2 = (json.loads((tmp_path / name).read_text()) for name in ("single.json", "fsdp2.json"))
    sdpa = json.loads((tmp_path / "sdpa" / "single.json").read_text())
    assert fsdp2["mode"] == "fsdp2" and fsdp2["setup"]["world"] == 2 and len(fsdp2["peak_gib"]) == 2
    assert {"losses", "step_ms", "median_step_ms", "tokens_per_s", "peak_gib", "notes"} <= set(fsdp2)
    assert _finite(single["losses"]) and _finite(fsdp2["losses"])
    assert abs(single["losses"][0] - sdpa["losses"][0]) < 1e-5
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    assert len(comparison["abs_loss_diff"]) == 2 and comparison["max_abs_loss_diff"] < 1e-5
