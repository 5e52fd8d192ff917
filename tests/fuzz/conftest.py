"""Print the differential fuzzer's summary (programs, cases, comparisons, time) at the end
of a pytest run that ran it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_summary import SUMMARY_KEY


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    line = config.stash.get(SUMMARY_KEY, None)
    if line is not None:
        terminalreporter.write_line(line)
