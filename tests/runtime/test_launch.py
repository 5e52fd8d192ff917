"""The direct launch path of `KernelLaunch` (runtime/launch.py): when it is taken, that a
Gluon launch passes the C launch function what Triton's descriptor wrapper would (with
fakes of Triton's CUDA side), and, on a GPU, that it gives what the generic path gives
and still runs registered hooks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import attnfuse
from attnfuse import examples
from attnfuse.runtime import launch as launch_module
from attnfuse.runtime.launch import KernelLaunch, TmaDescriptors, _descriptor_launch, _hooked, _raw_launch


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


# ---------------------------------------------------------------- TMA descriptors (fakes of Triton's CUDA side)

def test_tma_descriptors_fill_once_per_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_module, "TMA_CACHE_SIZE", 2)
    made: list[int] = []

    def make(tensor: torch.Tensor) -> list[Any]:
        made.append(tensor.data_ptr())
        return [("map", tensor.data_ptr()), 8, 64, 64, 1]

    maps = TmaDescriptors(make)
    a, b, c = (torch.empty(8, 64) for _ in range(3))
    assert maps.get(a) == ("map", a.data_ptr()) and maps.get(a) == ("map", a.data_ptr())
    assert maps.get(a[:]) == ("map", a.data_ptr())  # another view at the same address
    assert maps.get(b) == ("map", b.data_ptr())
    assert made == [a.data_ptr(), b.data_ptr()]
    maps.get(c)  # a third address drops the oldest
    maps.get(a)
    assert made == [a.data_ptr(), b.data_ptr(), c.data_ptr(), a.data_ptr()]


def _wrapped(positions: list[int], n_args: int, metas: list[Any] | None, calls: list[tuple[Any, ...]]) -> Any:
    from triton.backends.nvidia.driver import wrap_handle_tensordesc

    signature = {i: "tensordesc<bf16[64, 64]>" if i in positions else "i32" for i in range(n_args)}
    return wrap_handle_tensordesc(lambda *args: calls.append(args), signature, metas)


def _meta(block: list[int]) -> dict[str, Any]:
    return {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": block, "fp4_padded": False}


def test_descriptor_launch_unwraps_only_a_known_wrapper() -> None:
    metas = [_meta([64, 64]), _meta([64, 64])]
    wrapper = _wrapped([0, 2], 4, metas, [])
    launch, found = _descriptor_launch(wrapper, [0, 2])  # type: ignore[misc]
    assert found is metas and launch is not wrapper and callable(launch)
    assert _descriptor_launch(wrapper, [0, 1]) is None  # not the descriptors of the launch
    assert _descriptor_launch(_wrapped([0, 2], 4, None, []), [0, 2]) is None  # base-pointer descriptors
    assert _descriptor_launch(print, [0]) is None
    assert _descriptor_launch(lambda *args: None, [0]) is None


class _FakeUtils:
    """`fill_tma_descriptor` of Triton's CUDA utils: a record of what it was given."""

    def __init__(self) -> None:
        self.filled: list[int] = []

    def fill_tma_descriptor(self, address: int, swizzle: int, elem_size: int, elem_type: int, block: list[int],
                            shape: list[int], strides: list[int], padding: int) -> SimpleNamespace:
        self.filled.append(address)
        return SimpleNamespace(address=address, swizzle=swizzle, elem_type=elem_type, block=list(block),
                               shape=list(shape), strides=list(strides), padding=padding)


def test_direct_descriptor_launch_passes_what_tritons_wrapper_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Gluon launch (descriptor, scalar, descriptor, tensor + strides): after the first
    launch the direct path gives the C launch function the argument list Triton's wrapper
    builds from `TensorDescriptor`s, and fills a descriptor once per address."""
    from triton.runtime import driver

    from attnfuse.backends.triton.metadata import KernelMetadata

    utils = _FakeUtils()
    monkeypatch.setattr(driver, "_active", SimpleNamespace(utils=utils, get_current_stream=lambda index: 77))
    names = ("k_desc", "n", "o_desc", "L", "L_stride0")
    meta = KernelMetadata("k", names, dict.fromkeys(names, "i32"), 4, 1, maxnreg=168,
                          tma={"k_desc": (64, 64), "o_desc": (32, 64)})
    calls: list[tuple[Any, ...]] = []
    wrapper = _wrapped([0, 2], 5, [_meta([64, 64]), _meta([32, 64])], calls)
    compiled = SimpleNamespace(function="fn", packed_metadata="packed", run=SimpleNamespace(
        launch=wrapper, global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
        launch_pdl=False))

    class Kernel:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **options: compiled

    step = KernelLaunch(Kernel(), meta, (2, 3, 1), [None, 5, None, None, 1], [(3, 4)], torch.device("cuda", 0),
                        ((0, 2, (64, 64)), (2, 3, (32, 64))))
    k = torch.empty(2, 4, 64, 64, dtype=torch.bfloat16)
    out, lse = torch.empty(2, 4, 32, 64, dtype=torch.bfloat16), torch.empty(8)
    slots: list[Any] = [None, None, k, out, lse]
    step(slots)  # the first launch: Triton's JIT (here the fake compiled kernel)
    assert step.raw is not None and step.tma and not calls
    step(slots)
    step(slots)
    direct = calls[-1]
    generic = step.template.copy()
    generic[3] = lse
    step._descriptors(generic, slots)
    wrapper(*direct[:13], *generic)  # what Triton's wrapper gives the C function
    args = direct[13:]  # after grid, stream, function, flags, scratch, metadata and hooks
    assert calls[-1] == direct and len(args) == 13  # each descriptor: map, 2 sizes, 2 strides
    assert direct[:5] == (2, 3, 1, 77, "fn") and args[5] == 5 and args[11] is lse and args[12] == 1
    assert args[0].address == k.data_ptr() and args[0].shape == [512, 64] and args[1:5] == (512, 64, 64, 1)
    assert args[6].address == out.data_ptr() and args[6].block == [32, 64] and args[7:11] == (256, 64, 64, 1)
    assert utils.filled == [k.data_ptr(), out.data_ptr(), k.data_ptr(), out.data_ptr()]  # first launch, then the check
    other = torch.empty_like(out)
    step([None, None, k, other, lse])
    assert calls[-1][13 + 6].address == other.data_ptr() and calls[-1][13].address == k.data_ptr()
    assert utils.filled[4:] == [other.data_ptr()]
