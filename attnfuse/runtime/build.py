"""Building launch plans: the state of one build and the steps it records.

`HostProgram` (`host.py`) turns each host op into an `Instruction` once; building the plan
of a new shape class runs them on a `Build` (the call's slots, what is static for the
shape class, what the plan keeps, the steps so far). The steps are what later calls of
the class run (`plan.LaunchPlan`): allocations, scalar arithmetic on dynamic scalars,
reductions, conversions and kernel launches (`launch.KernelLaunch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from attnfuse.dialects.host import ReduceSumOp
from attnfuse.runtime.launch import tma_view
from attnfuse.runtime.plan import Slots, Step


class Build:
    """The state of one plan build: the call's slots, what is static for its shape
    class (computed here and baked into the steps), what the plan keeps, its steps."""

    __slots__ = ("device", "kept", "kernels", "slots", "static", "steps")

    def __init__(self, slots: Slots, device: torch.device, kernels: Mapping[str, Any]) -> None:
        self.slots = slots
        self.device = device
        self.kernels = kernels
        self.static: set[int] = set()
        self.kept: dict[int, Any] = {}
        self.steps: list[Step] = []

    def static_value(self, index: int, value: Any) -> None:
        self.slots[index] = value
        self.static.add(index)

    def keep(self, index: int, value: Any) -> None:
        """A static value that every call of the plan finds in its slot (a buffer, a table)."""
        self.slots[index] = self.kept[index] = value
        self.static.add(index)


Instruction = Callable[[Build], None]
"""What building a plan does for one host op (`attnfuse.runtime.host.HostProgram`)."""


def scalar_instruction(fn: Callable[..., int], operands: tuple[int, ...], out: int) -> Instruction:
    """A scalar op: computed at build time when its operands are static, else a step."""

    def scalar(state: Build) -> None:
        slots, static = state.slots, state.static
        if static.issuperset(operands):  # every plan build runs this: no generator here
            slots[out] = fn(*[slots[i] for i in operands])
            static.add(out)
            return
        const = {i: slots[i] for i in operands if i in static}

        def int_op(s: Slots) -> None:
            s[out] = fn(*(const.get(i, s[i]) for i in operands))

        int_op(slots)
        state.steps.append(int_op)

    return scalar


def step_instruction(step: Step) -> Instruction:
    """An op whose step depends on nothing static: run it and keep it."""

    def run(state: Build) -> None:
        step(state.slots)
        state.steps.append(step)

    return run


def alloc_step(out: int, shape: tuple[int, ...], dtype: torch.dtype, make: Callable[..., torch.Tensor],
                order: tuple[int, ...] | None, device: torch.device) -> Step:
    if order is not None:  # allocate in memory order, then view in the type's dim order
        stored = tuple(shape[d] for d in order)
        inverse = tuple(order.index(d) for d in range(len(order)))

        def alloc_ordered(s: Slots) -> None:
            s[out] = make(stored, dtype=dtype, device=device).permute(inverse)

        alloc_ordered.out = out  # type: ignore[attr-defined]
        return alloc_ordered

    def alloc(s: Slots) -> None:
        s[out] = make(shape, dtype=dtype, device=device)

    alloc.out = out  # type: ignore[attr-defined]
    return alloc


NOT_DENSE = "has a layout no TMA descriptor reads"
"""How `tma_unready_reason` ends for an operand whose layout rules out TMA (one the caller can change)."""


def tma_unready_reason(tensors: Sequence[torch.Tensor], device: torch.device, arch: int, rows: int,
                       names: Sequence[str] = ()) -> str | None:
    """Why a call cannot use TMA kernels (see `host.tma_ready`), or None; `names` say
    what each tensor is (else "operand N"). A layout qualifies when `launch.tma_view`
    finds its 2-D view: contiguous [B, H, S, D], its [B, S, H, D] transpose, and any
    other whose last dim is contiguous and rows 16-byte aligned."""
    if device.type != "cuda":
        return f"device {device}"
    major, minor = torch.cuda.get_device_capability(device)
    if major != arch:
        return f"compute capability {major}.{minor}"
    for n, t in enumerate(tensors):
        what = names[n] if n < len(names) else f"operand {n}"
        if tma_view(t) is None:
            return f"{what} (shape {tuple(t.shape)}, strides {t.stride()}) {NOT_DENSE}"
        if t.shape[2] % rows:
            return f"{what} has length {t.shape[2]}, not a multiple of {rows}"
    return None


def reduce_step(op: ReduceSumOp, out: int, source: int) -> Step:
    dims = tuple(op.dims.get_values())
    keepdim = op.keepdim is not None

    def reduce(s: Slots) -> None:
        s[out] = s[source].sum(dim=dims, keepdim=keepdim, dtype=torch.float32)

    return reduce


def convert_step(out: int, source: int, dtype: torch.dtype, order: tuple[int, ...] | None = None) -> Step:
    """`source` as `dtype` (its strides kept), or written in the memory order `order`."""
    if order is not None:
        inverse = tuple(order.index(d) for d in range(len(order)))

        def convert_ordered(s: Slots) -> None:
            x = s[source]
            stored = x.new_empty(tuple(x.shape[d] for d in order), dtype=dtype)
            s[out] = stored.permute(inverse).copy_(x)

        return convert_ordered

    def convert(s: Slots) -> None:
        s[out] = s[source].to(dtype)

    return convert
