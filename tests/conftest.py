"""Test configuration: kernels run through the Triton interpreter when there is no GPU.

Triton reads TRITON_INTERPRET when it is imported, so it is set here, before any test
module imports triton. GPU tests carry the `gpu` marker and are skipped without CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
