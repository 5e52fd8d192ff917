"""Where the fuzz test leaves its one-line summary for `conftest.pytest_terminal_summary`."""

from __future__ import annotations

import pytest

SUMMARY_KEY = pytest.StashKey[str]()
