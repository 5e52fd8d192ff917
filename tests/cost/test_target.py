"""The GPU target table and name lookup."""

from __future__ import annotations

import dataclasses

import pytest

from attnfuse.cost.target import TARGETS, UnknownTargetError, get_target, known_targets, target_for_device

REQUIRED = {"a100", "h100-sxm", "h200", "b200", "rtx3090", "rtx4090", "l4", "l40s", "mi300x"}


def test_table_covers_the_issue_list() -> None:
    assert REQUIRED <= set(known_targets())


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_figures_are_sane(name: str) -> None:
    t = TARGETS[name]
    assert t.name == name
    assert t.peak_tensor_flops("bf16") > t.peak_tensor_flops("f32") > t.vector_f32_flops / 2
    assert t.vector_f32_flops > t.sfu_ops > 0
    assert t.smem_bw > t.l2_bw > t.hbm_bw > 0  # each level faster than the next
    assert 50 < t.compute_to_bandwidth() < 1000  # FLOP per byte (H200 184, L40S 419)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.sms = 1  # type: ignore[misc]


def test_measured_overrides() -> None:
    h200, h100 = get_target("h200"), get_target("h100-sxm")
    assert h200.matmul_flops("bf16") == 790e12 and h200.peak_tensor_flops("bf16") == 989.4e12
    assert h200.bandwidth() == 4.3e12 and h200.hbm_bw == 4.8e12
    assert h200.matmul_flops("f32") == h200.peak_tensor_flops("f32")  # measured is bf16 only
    assert h100.matmul_flops("bf16") == h100.peak_tensor_flops("bf16")


def test_lookup() -> None:
    assert get_target("H100_SXM") is get_target("h100") is TARGETS["h100-sxm"]
    assert get_target(" RTX 4090 ") is TARGETS["rtx4090"]
    with pytest.raises(UnknownTargetError, match=r"unknown target 'v100'; known targets: a100, b200, h100-sxm, h200"):
        get_target("v100")
    with pytest.raises(ValueError, match="no tensor-core rate for f8"):
        get_target("a100").peak_tensor_flops("f8")


@pytest.mark.parametrize(("device", "target"), [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA L4", "l4"), ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("AMD Instinct MI300X", "mi300x"), ("NVIDIA B200", "b200"), ("Tesla T4", None), ("", None),
])
def test_device_names(device: str, target: str | None) -> None:
    """Driver names map to the table's entry they contain (the longest: L40S is not an L4)."""
    found = target_for_device(device)
    assert (found.name if found is not None else None) == target
