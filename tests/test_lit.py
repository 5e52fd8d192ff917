"""Run the lit + FileCheck suite (tests/filecheck) as one pytest test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).parent / "filecheck"


def test_lit_suite() -> None:
    """Every lit test passes; on failure the failing tests' output is shown."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("ATTNFUSE_TRACEBACK", None)
    lit = shutil.which("lit", path=env["PATH"])
    assert lit is not None, f"lit is not installed in {bin_dir} (pip install '.[test]')"
    assert shutil.which("attnfuse-opt", path=env["PATH"]), (
        "attnfuse-opt is not on PATH: install the package with pip install -e ."
    )
    proc = subprocess.run(
        [lit, "-v", "--no-progress-bar", str(SUITE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    failures = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(("FAIL:", "UNRESOLVED:"))
    ]
    assert proc.returncode == 0, (
        f"lit failed ({len(failures)} failing):\n"
        + "\n".join(failures)
        + "\n\n"
        + proc.stdout[-20000:]
        + proc.stderr[-5000:]
    )
    assert "Passed" in proc.stdout or "Passed" in proc.stderr
