"""Test configuration: GPU tests carry the `gpu` marker and are skipped without CUDA;
the differential fuzzer's summary line is printed at the end of the run; under
pytest-xdist's `--dist loadgroup` (`make test`) the modules in `ONE_WORKER` each run on a
single worker.

CPU tensors run through the Triton interpreter without TRITON_INTERPRET (the loader
builds interpreter kernels itself), so the suite leaves the environment alone. The
interpreter's int32 overflow checks (`sanitize_overflow`: every integer add, sub and mul
redone in int64 and compared with the int32 range; a third of an interpreted kernel's
time, GPU code has no such checks unless built with `debug`) are off for the suite and on
where a test asks for the `interpreter_overflow_checks` fixture: the differential fuzzer,
whose random programs cover every building block.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from interpreter_checks import set_overflow_checks

HAS_CUDA = torch.cuda.is_available()

ONE_WORKER = {
    "tests/distributed/test_ring.py": "two torchrun runs (2 and 3 gloo ranks) in module fixtures",
    "tests/lowering/test_sm90.py": "a module fixture compiles every kernel for sm_90",
    "tests/lowering/test_varlen_sm90.py": "a module fixture lowers the packed kernels",
    "tests/reference/test_rng.py": "a module fixture runs the Triton RNG script in a subprocess",
}
"""Modules whose tests share an expensive module-scoped fixture: `--dist loadgroup` sends
each one to a single worker as one unit, so the fixture runs once, not once per worker.
(The `xdist_group` mark would say this in the module itself, but pytest-xdist 3.8 groups
by appending `@group` to the node id, which pytest 9 ignores: the node ids are
structured. The scheduler below sees only node ids, so it keeps this list.)"""


@pytest.fixture(autouse=True, scope="session")
def _interpreter_without_overflow_checks() -> Iterator[None]:
    old = set_overflow_checks(False)
    yield
    set_overflow_checks(old)


@pytest.fixture
def interpreter_overflow_checks() -> Iterator[None]:
    """The Triton interpreter checks int32 overflow during the test (see the module docstring)."""
    old = set_overflow_checks(True)
    yield
    set_overflow_checks(old)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


FUZZ_SUMMARY = "differential_fuzz_summary"
"""The user property tests/fuzz/test_fuzz.py leaves its summary in (fuzz_summary.SUMMARY_PROPERTY)."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Print the fuzz test's summary line. It travels as a user property of the test's
    report, so it arrives here from a pytest-xdist worker too."""
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name == FUZZ_SUMMARY:
                    terminalreporter.write_line(str(value))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup`: one test at a time to whichever worker is free, except that
    every module in `ONE_WORKER` (and any `xdist_group` whose `@name` reaches the node
    id) is one unit for one worker; units with more tests are handed out first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):
                return nodeid.rsplit("@", 1)[1]
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER else nodeid

    return Scheduler(config, log)
