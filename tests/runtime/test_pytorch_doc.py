"""The ```python snippets of docs/pytorch.md run, in order, in one namespace (on the CPU);
those using transformers only where it is installed (the `hf` extra)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "pytorch.md"


def test_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(blocks) >= 11
    namespace: dict[str, object] = {}
    torch._dynamo.reset()
    for block in blocks:
        if "transformers" in block and importlib.util.find_spec("transformers") is None:
            continue
        exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    assert namespace["result"] and namespace["out"] is not None
