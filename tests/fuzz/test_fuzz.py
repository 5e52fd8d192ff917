"""The differential fuzzer as a standing guard: a fixed seed, a CI-sized run.

`FUZZ_PROGRAMS` random programs from seed `FUZZ_SEED`, each compiled under every
rope-fusion strategy that applies and compared with the float64 reference (forward, lse,
gradients; see differential.py), with the Triton interpreter's int32 overflow checks on
(tests/conftest.py). The summary (programs, cases, tensors compared, time) is printed at
the end of the pytest run. `make fuzz SEED=... COUNT=...` runs longer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from differential import fuzz
from fuzz_summary import SUMMARY_PROPERTY

FUZZ_SEED = 0
FUZZ_PROGRAMS = 6


@pytest.mark.usefixtures("interpreter_overflow_checks")
def test_differential_fuzz(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime import interpreter

    assert interpreter.interpreter_builder.options.sanitize_overflow  # int32 overflow in a kernel fails the case
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path))  # every program is lowered
    summary = fuzz(FUZZ_SEED, FUZZ_PROGRAMS)
    request.node.user_properties.append((SUMMARY_PROPERTY, summary.line()))
    assert summary.programs == FUZZ_PROGRAMS
    assert summary.cases >= FUZZ_PROGRAMS and summary.comparisons >= 5 * summary.cases
    assert not summary.failures, "\n".join(f.report() for f in summary.failures) + "\n" + summary.line()
