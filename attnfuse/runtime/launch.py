"""One kernel launch of a launch plan, with everything but the data resolved.

`KernelLaunch` holds a launch's grid and its argument list as a template: strides,
sizes, constant tables and buffers that a plan keeps are filled in; `fill` lists the
positions of the tensors and scalars that change from call to call, `descriptors` the
TMA descriptor arguments (Gluon kernels), each over a tensor slot with the block's default
NVMMA shared layout: a 1-D block reads the flat view; a 2-D block reads the tensor as
rows of its dim -2 stride (`tma_view`), the kernel finding a leading index's first row
and column from the steps that follow the descriptor in its argument list.

On a GPU the first launch goes through `JITFunction.run`, which binds, specializes and
compiles (or finds the compiled kernel in Triton's caches) and returns the
`CompiledKernel`; a plan fixes everything Triton specializes on, so later launches call
that kernel's launcher directly, on the current stream. When the kernel needs no
global or profiling scratch (Triton allocates it per launch otherwise) and no launch
hook is registered (Triton 3.6 keeps them in `HookChain`s, never None), the call goes
one level lower still, to the C launch function that `CudaLauncher.__call__` wraps,
with None for the hooks and no launch metadata: about 5 us less per launch on an H200
host. Launch hooks (`triton.knobs.runtime.launch_enter_hook`, profilers) that are
registered still run, through the launcher.

A Gluon kernel's launcher expands each descriptor argument into a filled `CUtensorMap`,
its shape and its strides (Triton's `wrap_handle_tensordesc`) after building and
validating a `TensorDescriptor`: about 10 us of Python per launch of three descriptors.
The direct path calls the C function under that wrapper with the expansion resolved per
plan: shapes and strides are constants of its argument list, and `TmaDescriptors` keeps
the filled maps by base address (a map is a kernel parameter, copied at launch, so one
serves any number of launches; a new address is checked and filled as Triton does). On
the CPU every launch goes through Triton's interpreter, one at a time
(`loader.INTERPRETER_LOCK`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnfuse.backends.triton.metadata import KernelMetadata
from attnfuse.runtime.loader import INTERPRETER_LOCK

TMA_CACHE_SIZE = 16
"""Filled TMA descriptors kept per descriptor argument of a launch (oldest dropped first)."""


class TmaDescriptors:
    """The filled TMA descriptors of one descriptor argument of a launch, by base address.

    `make(tensor)` is Triton's expansion of the argument, `[descriptor, *shape,
    *strides]`. A plan fixes everything a descriptor encodes but the address (the view's
    shape and strides, dtype, block, layout, padding), so a descriptor filled for an
    address serves every later call at that address; another address is filled anew."""

    __slots__ = ("lock", "make", "maps")

    def __init__(self, make: Callable[[torch.Tensor], list[Any]]) -> None:
        self.make = make
        self.maps: dict[int, Any] = {}
        self.lock = threading.Lock()

    def get(self, tensor: torch.Tensor) -> Any:
        """The descriptor of `tensor` (filled at the first call at its address)."""
        found = self.maps.get(tensor.data_ptr())
        return self.expand(tensor)[0] if found is None else found

    def expand(self, tensor: torch.Tensor) -> list[Any]:
        """Triton's expansion of `tensor`'s argument (a new descriptor), kept by address."""
        expanded = self.make(tensor)
        with self.lock:
            if len(self.maps) >= TMA_CACHE_SIZE:
                self.maps.pop(next(iter(self.maps)))
            self.maps[tensor.data_ptr()] = expanded[0]
        return expanded


class KernelLaunch:
    """A launch step of a plan (see the module docstring); call it with the slots."""

    __slots__ = ("compiled", "descriptors", "device_index", "direct_fill", "direct_template", "fill", "grid",
                 "kernel", "knobs", "meta", "options", "raw", "stream", "template", "tma")

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
        self.direct_template = template
        """The argument list of the C launch function (descriptors expanded)."""
        self.direct_fill = self.fill
        self.tma: tuple[tuple[int, int, TmaDescriptors], ...] = ()
        """(position in `direct_template`, slot, its descriptors) per descriptor argument."""

    def __call__(self, slots: list[Any]) -> None:
        if self.raw is not None:
            knobs = self.knobs
            if not _hooked(knobs.launch_enter_hook) and not _hooked(knobs.launch_exit_hook):
                args = self.direct_template.copy()
                for position, slot in self.direct_fill:
                    args[position] = slots[slot]
                for position, slot, maps in self.tma:
                    args[position] = maps.get(slots[slot])
                launch, head = self.raw
                kernel = self.compiled
                g0, g1, g2 = self.grid
                launch(g0, g1, g2, self.stream(self.device_index), kernel.function, *head, kernel.packed_metadata,
                       None, None, None, *args)
                return
        args = self.template.copy()
        for position, slot in self.fill:
            args[position] = slots[slot]
        if self.descriptors:
            self._descriptors(args, slots)
        if self.device_index is None:
            with INTERPRETER_LOCK:
                self.kernel[self.grid](*args, **self.options)
        elif self.compiled is None:
            self._first_launch(args, slots)
        else:
            kernel = self.compiled
            stream = self.stream(self.device_index)
            enter, exit_ = self.knobs.launch_enter_hook, self.knobs.launch_exit_hook
            metadata = kernel.launch_metadata(self.grid, stream, *args) if enter is not None else None
            g0, g1, g2 = self.grid
            kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, metadata, enter, exit_, *args)

    def _first_launch(self, args: list[Any], slots: list[Any]) -> None:
        from triton import knobs
        from triton.runtime import driver

        self.stream = driver.active.get_current_stream
        self.knobs = knobs.runtime
        self.compiled = self.kernel[self.grid](*args, **self.options)
        raw = _raw_launch(self.compiled)
        if raw is not None and self.descriptors:
            unwrapped = _descriptor_launch(raw[0], [position for position, *_ in self.descriptors])
            if unwrapped is None:
                return  # an unknown wrapper: the generic path
            launch, metas = unwrapped
            self._expand_descriptors(metas, slots)
            raw = launch, raw[1]
        self.raw = raw

    def _expand_descriptors(self, metas: Sequence[dict[str, Any]], slots: list[Any]) -> None:
        """The direct path's argument list: each descriptor argument expanded as Triton's
        wrapper does, its map left to `tma` (filled here for this call's tensor)."""
        descriptors = {d[0]: (d, meta) for d, meta in zip(self.descriptors, metas)}
        fill = dict(self.fill)
        template: list[Any] = []
        direct_fill: list[tuple[int, int]] = []
        tma: list[tuple[int, int, TmaDescriptors]] = []
        for position, value in enumerate(self.template):
            if position in descriptors:
                (_, slot, block, (layout, shape, strides)), meta = descriptors[position]
                maps = TmaDescriptors(functools.partial(_tensordesc_arg, meta, shape, strides, block, layout))
                tma.append((len(template), slot, maps))
                template.extend([None, *maps.expand(slots[slot])[1:]])
            else:
                if position in fill:
                    direct_fill.append((len(template), fill[position]))
                template.append(value)
        self.direct_template, self.direct_fill, self.tma = template, tuple(direct_fill), tuple(tma)

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
            assert tensor.is_contiguous(), "a 1-D descriptor reads a contiguous tensor"
            return position, slot, block, (layout, [tensor.numel()], [1])
        view = tma_view(tensor)
        assert view is not None, "host.tma_ready admits only tensors with a 2-D view"
        rows, width, _ = view
        return position, slot, block, (layout, [rows, width], [width, 1])


def tma_view(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...]] | None:
    """The 2-D view through which a descriptor with a 2-D block reads `tensor`, or None
    when its layout has none: (rows, width, steps). A row is `width` elements (the dim -2
    stride); `steps` gives (rows, columns) per leading dim (all but the last two): index
    `i` of a leading dim moves the tile by `i * rows` rows and `i * columns` columns. So a
    contiguous [B, H, S, D] is B*H*S rows of D with steps (H*S, 0), (S, 0), and the
    [B, H, S, D] view of a contiguous [B, S, H, D] is B*S rows of H*D with steps (S, 0),
    (0, D). None unless the last dim is contiguous, a row is a multiple of 16 bytes, the
    base 16-byte aligned and every tile's columns inside one row."""
    if tensor.dim() < 2 or tensor.data_ptr() % 16:
        return None
    *lead, n_rows, cols = tensor.shape
    *lead_strides, row_stride, col_stride = tensor.stride()
    width = row_stride if n_rows > 1 else cols
    if (cols > 1 and col_stride != 1) or width < 1 or width * tensor.element_size() % 16:
        return None
    steps: list[int] = []
    last_row, last_col = n_rows - 1, cols
    for size, stride in zip(lead, lead_strides):
        rows_step, cols_step = divmod(stride, width) if size > 1 else (0, 0)
        steps += [rows_step, cols_step]
        last_row += (size - 1) * rows_step
        last_col += (size - 1) * cols_step
    if last_col > width or last_row >= 2**31:
        return None
    return last_row + 1, width, tuple(steps)


def _hooked(hook: Any) -> bool:
    """Whether a launch hook does anything: None, or a Triton 3.6 `HookChain` with no calls, does not."""
    return hook is not None and getattr(hook, "calls", True) != []


def _raw_launch(compiled: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """(launch function, the arguments it takes between the function handle and the
    packed metadata) of a compiled kernel that needs no scratch buffers, else None (the
    generic `CudaLauncher.__call__` path)."""
    launcher = compiled.run
    try:
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            return None
        return launcher.launch, (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None)
    except AttributeError:  # another Triton version or backend
        return None


def _tensordesc_arg(meta: dict[str, Any], shape: list[int], strides: list[int], block: list[int], layout: Any,
                    tensor: torch.Tensor) -> list[Any]:
    """Triton's expansion of a descriptor argument over `tensor`: `[filled map, *shape,
    *strides]`, after `TensorDescriptor`'s checks (alignment, strides, block)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return make_tensordesc_arg(TensorDescriptor(tensor, shape, strides, block, layout), meta)


def _descriptor_launch(wrapper: Any, positions: Sequence[int]) -> tuple[Any, list[dict[str, Any]]] | None:
    """(the C launch function, the descriptors' metadata) under Triton 3.6's descriptor
    wrapper (`wrap_handle_tensordesc`'s `inner`) when it expands exactly the descriptor
    arguments at `positions` into filled maps; None otherwise (another Triton version,
    or descriptors it passes as base pointers)."""
    try:
        cells = dict(zip(wrapper.__code__.co_freevars, (c.cell_contents for c in wrapper.__closure__)))
    except (AttributeError, TypeError, ValueError):
        return None
    launch, indices, metas = cells.get("launcher"), cells.get("tensordesc_indices"), cells.get("tensordesc_meta")
    if not callable(launch) or indices != set(positions) or not isinstance(metas, list) or len(metas) != len(positions):
        return None
    if not all(isinstance(meta, dict) for meta in metas):
        return None
    return launch, metas
