"""The direct launch path of `KernelLaunch` (runtime/launch.py): when it is taken, and,
on a GPU, that it gives what the generic path gives and still runs registered hooks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import attnfuse
from attnfuse import examples
from attnfuse.runtime.launch import _hooked, _raw_launch


def test_hooked_is_false_for_none_and_empty_chains() -> None:
    from triton.knobs import HookChain

    chain: HookChain[Any] = HookChain()
    assert not _hooked(None)
    assert not _hooked(chain)
    chain.add(print)
    assert _hooked(chain)
    assert _hooked(print)  # a plain callable (older Triton) is a hook


def _compiled(global_scratch: int, profile_scratch: int) -> Any:
    launcher = SimpleNamespace(global_scratch_size=global_scratch, profile_scratch_size=profile_scratch,
                               launch="c-launch", launch_cooperative_grid=False, launch_pdl=True)
    return SimpleNamespace(run=launcher)


def test_raw_launch_only_without_scratch() -> None:
    assert _raw_launch(_compiled(0, 0)) == ("c-launch", (False, True, None, None))
    assert _raw_launch(_compiled(256, 0)) is None
    assert _raw_launch(_compiled(0, 64)) is None
    assert _raw_launch(SimpleNamespace(run=SimpleNamespace())) is None  # unknown launcher: generic path


@pytest.mark.gpu
def test_direct_launch_matches_and_runs_hooks() -> None:
    from triton import knobs

    fn = attnfuse.compile(examples.path("llama3"))
    torch.manual_seed(0)
    q = torch.randn(2, 32, 256, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
    first = fn(q, k, v)  # builds the plan (generic launches)
    direct = fn(q, k, v)  # direct launches
    names: list[str] = []

    def hook(metadata: Any) -> None:
        names.append(metadata.get()["name"])

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        hooked = fn(q, k, v)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert torch.equal(first, direct) and torch.equal(first, hooked)
    assert any(name.endswith(("_fwd", "_fwd_ws")) for name in names), names
