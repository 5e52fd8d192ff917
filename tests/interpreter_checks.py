"""The Triton interpreter's int32 overflow checks, switched by the pytest process
(tests/conftest.py) and by the torchrun ranks of the ring tests
(tests/distributed/ring_worker.py), which cannot import a conftest."""

from __future__ import annotations

import dataclasses


def set_overflow_checks(on: bool) -> bool:
    """Turn the interpreter's int32 overflow checks (`sanitize_overflow`) on or off;
    returns the old setting."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    old = builder.options.sanitize_overflow
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=on)
    return old
