"""`python -m attnfuse.demo` (what `make demo` runs), on the CPU through the Triton interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PASSES = ["attn-canonicalize", "rope-fusion", "online-softmax", "mask-tiling", "lower-to-tile"]


def run_demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, even on a GPU machine
    env.pop("TRITON_INTERPRET", None)  # CPU kernels run interpreted without it
    env["ATTNFUSE_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, "-m", "attnfuse.demo", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )


def test_demo_default(tmp_path: Path) -> None:
    proc = run_demo(tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "=== program: " in out and "llama3.attn ===" in out
    assert "func.func @llama3(" in out
    headers = [out.index(f"=== IR after {name} ===") for name in PASSES]
    assert headers == sorted(headers), "stages out of pipeline order"
    assert "rope-fusion strategy: auto (resolves to " in out
    # The lowered IR: host code in full, kernels abbreviated.
    assert "host.launch @llama3_fwd" in out
    assert "tile.kernel @llama3_fwd(" in out
    assert "more lines (" in out and "--full-ir prints them" in out
    # The Triton source of the forward kernel.
    triton_part = out[out.index("=== Triton source of @llama3_fwd ==="):]
    assert "@triton.jit" in triton_part
    assert "def llama3_fwd(" in triton_part
    assert "tl.dot(" in triton_part
    # The run and the check: all 32 query heads, 8 kv heads, at S=64 on the CPU.
    assert "=== run on cpu (Triton interpreter) ===" in out
    assert "q[1, 32, 64, 128] bfloat16, k[1, 8, 64, 128] bfloat16" in out
    assert "max |out - ref| = " in out
    assert "tolerance: |out - ref| <= 0.025 + 0.025 * |ref| (bfloat16)" in out
    assert out.rstrip().splitlines()[-1].startswith("PASS")
    assert "FAIL" not in out
    assert "warning: attnfuse.compile produced different Triton source" not in out


@pytest.mark.slow
def test_demo_options(tmp_path: Path) -> None:
    proc = run_demo(tmp_path, "--program", "gemma2", "--strategy", "fused", "--full-ir", "--seq", "40")
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gemma2.attn ===" in out
    assert "=== pipeline: attn-canonicalize,rope-fusion{strategy=fused}," in out
    assert "=== IR after rope-fusion ===" in out and "placement = \"kernel\"" in out
    assert "--full-ir prints them" not in out
    assert ", 40, " in out.split("inputs: ", 1)[1].splitlines()[0]
    assert out.rstrip().splitlines()[-1].startswith("PASS")


def test_demo_fails_on_wrong_reference(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import attnfuse.demo as demo

    real = demo.reference_run
    monkeypatch.setattr(demo, "reference_run", lambda *a, **k: real(*a, **k) + 1.0)
    assert demo.main(["--seq", "16"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: max error" in out and "PASS" not in out
