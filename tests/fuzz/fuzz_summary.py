"""How the fuzz test hands its one-line summary to `tests/conftest.py`'s
`pytest_terminal_summary`: a user property of the test's report, which pytest-xdist
carries from the worker that ran the test back to the process that prints the summary
(a `config.stash` entry would stay in the worker)."""

from __future__ import annotations

SUMMARY_PROPERTY = "differential_fuzz_summary"
"""The name of the report's user property; tests/conftest.py looks for this name."""
