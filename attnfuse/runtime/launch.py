"""One kernel launch of a launch plan, with everything but the data resolved.

`KernelLaunch` holds a launch's grid and its argument list as a template: strides,
sizes, constant tables and buffers that a plan keeps are filled in; `fill` lists the
positions of the tensors and scalars that change from call to call, `descriptors` the
TMA descriptor arguments (Gluon kernels), built on every call from a tensor slot as a
2-D view over its last dim (the flat view for a 1-D block) with the block's default NVMMA shared layout.

On a GPU the first launch goes through `JITFunction.run`, which binds, specializes and
compiles (or finds the compiled kernel in Triton's caches) and returns the
`CompiledKernel`; a plan fixes everything Triton specializes on, so later launches call
that kernel's launcher directly, on the current stream. When the kernel needs no
global or profiling scratch (Triton allocates it per launch otherwise) the call goes one
level lower still, to the C launch function that `CudaLauncher.__call__` wraps, and
when no launch hook is registered (Triton 3.6 keeps them in `HookChain`s, never None)
it passes None for the hooks and builds no launch metadata: about 5 us less per launch
on an H200 host. Launch hooks (`triton.knobs.runtime.launch_enter_hook`, profilers)
that are registered still run. On the CPU every launch goes through Triton's
interpreter, one at a time (`loader.INTERPRETER_LOCK`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnfuse.backends.triton.metadata import KernelMetadata
from attnfuse.runtime.loader import INTERPRETER_LOCK


class KernelLaunch:
    """A launch step of a plan (see the module docstring); call it with the slots."""

    __slots__ = ("compiled", "descriptors", "device_index", "fill", "grid", "kernel", "knobs", "meta", "options",
                 "raw", "stream", "template")

    def __init__(self, kernel: Any, meta: KernelMetadata, grid: tuple[int, int, int],
                 template: list[Any], fill: Sequence[tuple[int, int]], device: torch.device,
                 descriptors: Sequence[tuple[int, int, tuple[int, ...]]] = ()) -> None:
        self.kernel = kernel
        self.options: dict[str, int] = {"num_warps": meta.num_warps, "num_stages": meta.num_stages}
        if meta.maxnreg is not None:
            self.options["maxnreg"] = meta.maxnreg
        self.descriptors = tuple((position, slot, list(block), None) for position, slot, block in descriptors)
        self.meta = meta
        self.grid = grid
        self.template = template
        self.fill = tuple(fill)
        self.device_index = device.index if device.type == "cuda" else None
        self.compiled: Any = None
        self.stream: Any = None
        self.knobs: Any = None
        self.raw: tuple[Any, tuple[Any, ...]] | None = None

    def __call__(self, slots: list[Any]) -> None:
        args = self.template.copy()
        for position, slot in self.fill:
            args[position] = slots[slot]
        if self.descriptors:
            self._descriptors(args, slots)
        if self.device_index is None:
            with INTERPRETER_LOCK:
                self.kernel[self.grid](*args, **self.options)
        elif self.compiled is None:
            self._first_launch(args)
        else:
            kernel = self.compiled
            stream = self.stream(self.device_index)
            enter, exit_ = self.knobs.launch_enter_hook, self.knobs.launch_exit_hook
            g0, g1, g2 = self.grid
            if self.raw is not None and not _hooked(enter) and not _hooked(exit_):
                launch, head = self.raw
                launch(g0, g1, g2, stream, kernel.function, *head, kernel.packed_metadata, None, None, None, *args)
                return
            metadata = kernel.launch_metadata(self.grid, stream, *args) if enter is not None else None
            kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, metadata, enter, exit_, *args)

    def _first_launch(self, args: list[Any]) -> None:
        from triton import knobs
        from triton.runtime import driver

        self.stream = driver.active.get_current_stream
        self.knobs = knobs.runtime
        self.compiled = self.kernel[self.grid](*args, **self.options)
        self.raw = _raw_launch(self.compiled)

    def _descriptors(self, args: list[Any], slots: list[Any]) -> None:
        """TMA descriptors of this call's tensors. Shapes are fixed by the plan: the layout
        and the view's shape and strides are computed at the first call."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        if self.descriptors[0][3] is None:
            self.descriptors = tuple(self._describe(position, slot, block, slots[slot])
                                     for position, slot, block, _ in self.descriptors)
        for position, slot, block, (layout, shape, strides) in self.descriptors:
            args[position] = TensorDescriptor(slots[slot], shape, strides, block, layout)

    @staticmethod
    def _describe(position: int, slot: int, block: list[int], tensor: torch.Tensor) -> tuple[Any, ...]:
        from triton.experimental.gluon import language as gl

        layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, str(tensor.dtype).removeprefix("torch.")))
        if len(block) == 1:  # the flat view
            return position, slot, block, (layout, [tensor.numel()], [1])
        cols = tensor.shape[-1]
        return position, slot, block, (layout, [tensor.numel() // cols, cols], [cols, 1])


def _hooked(hook: Any) -> bool:
    """Whether a launch hook does anything: None, or a Triton 3.6 `HookChain` with no calls, does not."""
    return hook is not None and getattr(hook, "calls", True) != []


def _raw_launch(compiled: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """(C launch function, the arguments it takes between the function handle and the
    packed metadata) of a compiled kernel that needs no scratch buffers, else None (the
    generic `CudaLauncher.__call__` path)."""
    launcher = compiled.run
    try:
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            return None
        return launcher.launch, (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None)
    except AttributeError:  # another Triton version or backend
        return None
