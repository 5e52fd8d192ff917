"""Test configuration: GPU tests carry the `gpu` marker and are skipped without CUDA.

CPU tensors run through the Triton interpreter without TRITON_INTERPRET (the loader
builds interpreter kernels itself), so the suite leaves the environment alone.
"""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
