"""Run lowered programs: host code resolved once into launch plans.

A `HostProgram` reads the host code of one lowered function (sizes, buffers, launches,
reductions; see the `host` dialect) once, into IR-free instructions over numbered
slots. A call then looks up the `LaunchPlan` of its *shape class*: the tensor
arguments' shapes, strides, dtypes, device and 16-byte alignment, and whether each
integer scalar fits in 32 bits. That is everything Triton specializes a kernel on, so a
plan fixes every size, grid, buffer shape and kernel argument but the data pointers and
dynamic scalars. The first call of a shape class builds its plan while running (and
checks every tensor at the kernel boundary); later calls run the plan (`plan.LaunchPlan`):
a few allocations and kernel launches. Sizes, grids and run-time choices (how many
programs split the keys of a decode call, which kernels run: a zero grid launches nothing
and leaves no step) are integer `arith` (with `cmpi` and `select`) over `host.dim` and
`host.sm_count`, so a plan computes them once.

Tensors reach kernels as a pointer plus per-dim strides, so any strided view works
without a copy; a size-1 dim gets stride 0, which is how broadcast operands (a
`[1, H, S, S]` bias) are read. Kernels index within a tensor with 32-bit offsets (batch
and head offsets are 64-bit), so a stride, or the offset spanned by the dims after batch
and head, that exceeds int32 is an `AttnfuseArgumentError` naming the tensor.

A launch whose inputs are only shapes and constants (the block map of a mask that does
not read tensors, e.g. a custom predicate over indices, or a cos/sin table) runs once per
plan: its output buffers are kept with the plan. A block map that reads data (document
ids) runs on every call. A kernel whose metadata does not list what it writes
(`KernelMetadata.writes` None) is taken to write every tensor it takes, so a table it
reads is rebuilt on every call. A buffer with no elements (the split-KV workspace of a
call that does not split) is allocated once and kept with the plan too, unless the
function returns it. Calls that drop the lse may reuse one lse buffer per stream
(`plan.lean_steps`).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import ArrayAttr, DenseIntOrFPElementsAttr, IntegerAttr, TensorType
from xdsl.ir import Operation, SSAValue

from attnfuse.backends.triton.metadata import KernelMetadata
from attnfuse.dialects.host import (
    TOP_LEFT_BAND,
    AllocOp,
    ConvertOp,
    DimOp,
    KeepsResultsOp,
    LaunchOp,
    ReduceSumOp,
    SmCountOp,
    TmaReadyOp,
)
from attnfuse.runtime.checks import AttnfuseArgumentError, check_int32_layout, torch_dtype
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.runtime.plan import SCRATCH_BYTES, LaunchPlan, Scratch, Slots, Step

logger = logging.getLogger(__name__)

MAX_PLANS = 64
"""Launch plans kept per host program (oldest dropped first)."""

_INT_OPS: dict[type[Operation], Callable[..., int]] = {
    arith.AddiOp: lambda a, b: a + b,
    arith.SubiOp: lambda a, b: a - b,
    arith.MuliOp: lambda a, b: a * b,
    arith.CeilDivSIOp: lambda a, b: -(-a // b),
    arith.DivSIOp: lambda a, b: int(a / b),
    arith.MaxSIOp: max,
    arith.MinSIOp: min,
    arith.SelectOp: lambda c, a, b: a if c else b,
}
"""Scalar host ops and their meaning on Python ints (`arith.cmpi` below); `arith.select`
also joins the tensors of two guarded paths."""

_GUARDED = (AllocOp, LaunchOp, ConvertOp, ReduceSumOp)
"""Host ops that may carry a `when` guard (see the `host` dialect)."""

_CMPI: dict[int, Callable[[int, int], bool]] = {
    0: lambda a, b: a == b, 1: lambda a, b: a != b, 2: lambda a, b: a < b,
    3: lambda a, b: a <= b, 4: lambda a, b: a > b, 5: lambda a, b: a >= b,
}
"""`arith.cmpi` predicates eq, ne, slt, sle, sgt, sge (the signed ones: sizes are i32)."""


def _scalar_fn(op: Operation) -> Callable[..., int] | None:
    """What a scalar host op computes, or None for an op that is not one."""
    if isinstance(op, arith.CmpiOp):
        return _CMPI[op.predicate.value.data]
    return _INT_OPS.get(type(op))


INTERPRETER_SM_COUNT = 132
"""What `host.sm_count` reports on the CPU: an H200's SM count (see `SmCountOp`)."""


def sm_count(device: torch.device) -> int:
    """`host.sm_count` on `device`: its SM count, or `INTERPRETER_SM_COUNT` on the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SM_COUNT


def call_signature(args: Sequence[Any]) -> tuple[Any, ...] | None:
    """The shape class of a call (see the module docstring); None for arguments that
    have none (sparse tensors, non-integers): the checks then explain what is wrong."""
    try:
        return _signature(args)
    except (RuntimeError, TypeError, NotImplementedError):
        return None


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    key = []
    for a in args:  # a loop, not a generator: this runs on every call
        if isinstance(a, torch.Tensor):
            key.append((a.shape, a.stride(), a.dtype, a.device, a.data_ptr() % 16 == 0))
        else:
            key.append((type(a), -2147483648 <= a < 2147483648))
    return tuple(key)


class HostProgram:
    """The host code of one lowered attention function, read once."""

    def __init__(self, function: func.FuncOp, source: str, metadata: Mapping[str, KernelMetadata]) -> None:
        self.name = function.sym_name.data
        self.source = source
        self.metadata = dict(metadata)
        self.arg_names = [a.name_hint or f"arg{i}" for i, a in enumerate(function.args)]
        slots: dict[SSAValue, int] = {a: i for i, a in enumerate(function.args)}
        self.ops: list[Operation] = list(function.body.block.ops)
        for op in self.ops:
            for result in op.results:
                slots[result] = len(slots)
        self.slots = slots
        self.n_args = len(function.args)
        ret = function.body.block.last_op
        assert isinstance(ret, func.ReturnOp)
        self.returns = tuple(slots[v] for v in ret.arguments)
        self.keeps = next((slots[op.result] for op in self.ops if isinstance(op, KeepsResultsOp)), None)
        """The slot of `host.keeps_results`, which each call sets (`LaunchPlan.run`'s `lse`)."""
        self.cached_launches = self._launches_of_shapes_only()
        band = function.attributes.get(TOP_LEFT_BAND)
        self.top_left_band: tuple[int, ...] | None = (
            tuple(a.value.data for a in band.data) if isinstance(band, ArrayAttr) else None)  # type: ignore[attr-defined]
        self._plans: dict[tuple[Any, ...], LaunchPlan] = {}
        self._tables: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ calling

    def plan(self, signature: tuple[Any, ...] | None) -> LaunchPlan | None:
        """The plan of a shape class (`call_signature(args)`), if one was built."""
        return self._plans.get(signature) if signature is not None else None

    def build(self, args: Sequence[Any], signature: tuple[Any, ...] | None, device: torch.device) -> list[Any]:
        """Run on checked arguments of a new shape class, keeping its plan."""
        self._warn_top_left(args)
        if device.type == "cuda" and torch.cuda.current_device() != device.index:
            with torch.cuda.device(device):
                plan, results = self._build(args, device)
        else:
            plan, results = self._build(args, device)
        if signature is not None:
            with self._lock:
                if len(self._plans) >= MAX_PLANS:
                    self._plans.pop(next(iter(self._plans)))
                    logger.debug("@%s: dropped the oldest launch plan (%d kept)", self.name, MAX_PLANS)
                self._plans[signature] = plan
        if logger.isEnabledFor(logging.DEBUG):
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            logger.debug("@%s: built a launch plan (%d steps) for shapes %s on %s", self.name,
                         len(plan.steps), shapes, device)
        return results

    def _warn_top_left(self, args: Sequence[Any]) -> None:
        if self.top_left_band is None:
            return
        q, k = (args[i] for i in self.top_left_band)
        q_len, kv_len = int(q.shape[2]), int(k.shape[2])
        if q_len < kv_len:
            warnings.warn(
                f"@{self.name}: causal / window mask aligned top-left with {q_len} queries and {kv_len} keys: "
                f"query i sees keys up to i only (not the last {kv_len - q_len} keys of a cache); "
                'for decoding against a KV cache write the mask with align = "bottom_right"',
                UserWarning, stacklevel=6)

    def result_order(self, index: int) -> tuple[int, ...] | None:
        """The memory order of result `index` when the host code allocates it with one."""
        owner = self.ops[-1].operands[index].owner
        return owner.dim_order() if isinstance(owner, AllocOp) else None

    def plan_count(self) -> int:
        return len(self._plans)

    # ------------------------------------------------------------------ planning

    def _launches_of_shapes_only(self) -> set[LaunchOp]:
        """Launches that read only sizes and constants and write buffers no one else
        writes and the function does not return: their results depend on shapes only."""
        writers: dict[SSAValue, list[LaunchOp]] = {}
        written_by: dict[LaunchOp, set[SSAValue]] = {}
        for op in self.ops:
            if not isinstance(op, LaunchOp):
                continue
            meta = self.metadata[op.kernel.root_reference.data]
            tensors = [a for a in op.args if isinstance(a.type, TensorType)]
            if meta.writes is None:
                written = set(tensors)
            else:
                names = iter(meta.arg_names)
                by_name: dict[str, SSAValue] = {}
                for a in op.args:
                    name = next(names)
                    by_name[name] = a
                    if isinstance(a.type, TensorType) and name not in meta.tma:  # strides follow; not a descriptor's
                        for _ in a.type.get_shape():
                            next(names)
                written = {by_name[n] for n in meta.writes if n in by_name}
            written_by[op] = written
            for value in written:
                writers.setdefault(value, []).append(op)
        returned = {self.ops[-1].operands[i] for i in range(len(self.ops[-1].operands))}
        static: set[SSAValue] = set()
        cached: set[LaunchOp] = set()
        for op in self.ops:
            if isinstance(op, (DimOp, SmCountOp, arith.ConstantOp)) or (
                _scalar_fn(op) is not None and all(o in static for o in op.operands)
            ):
                static.update(op.results)
            elif isinstance(op, LaunchOp):
                written = written_by[op]
                reads_static = all(a in static or a in written for a in op.operands)
                owns = all(
                    isinstance(a.owner, AllocOp) and writers[a] == [op] and a not in returned
                    for a in written
                )
                if reads_static and owns and written:
                    cached.add(op)
                    static.update(written)
        return cached

    def _table(self, op: arith.ConstantOp, device: torch.device) -> torch.Tensor:
        key = (id(op), device)
        if key not in self._tables:
            value = op.value
            assert isinstance(value, DenseIntOrFPElementsAttr)
            data = [float(x) for x in value.get_values()]
            self._tables[key] = torch.tensor(data, dtype=torch.float32, device=device)
        return self._tables[key]

    def _build(self, args: Sequence[Any], device: torch.device) -> tuple[LaunchPlan, list[Any]]:
        """Run once, generically, recording the steps a later call of the same shape
        class needs (static values are computed here and baked into the steps)."""
        from attnfuse.runtime.loader import load_kernels

        kernels = load_kernels(self.source, interpret=device.type == "cpu")
        slots: Slots = [*args, *([None] * (len(self.slots) - self.n_args))]
        static: set[int] = set()
        kept: dict[int, Any] = {}
        steps: list[Step] = []
        for op in self.ops:
            if isinstance(op, func.ReturnOp):
                break
            if isinstance(op, _GUARDED) and op.cond is not None and (
                    bool(slots[self.slots[op.cond]]) == (op.unless is not None)):
                continue  # a guarded op on the path this shape class does not take
            out = self.slots[op.results[0]] if op.results else -1
            step: Step | None = None
            if isinstance(op, DimOp):
                slots[out] = int(slots[self.slots[op.source]].shape[op.index.value.data])
                static.add(out)
            elif isinstance(op, arith.ConstantOp):
                if isinstance(op.value, IntegerAttr):
                    slots[out] = op.value.value.data
                else:
                    slots[out] = kept[out] = self._table(op, device)
                static.add(out)
            elif isinstance(op, SmCountOp):
                slots[out] = sm_count(device)
                static.add(out)
            elif isinstance(op, KeepsResultsOp):
                slots[out] = 1  # the first call of a shape class returns every result
            elif (fn := _scalar_fn(op)) is not None:
                step = self._int_step(fn, op, out, slots, static)
            elif isinstance(op, AllocOp):
                step = self._alloc_step(op, out, slots, device)
                step(slots)
                if slots[out].numel() == 0 and out not in self.returns:  # no data: one buffer serves every call
                    kept[out] = slots[out]
                    static.add(out)
                else:
                    steps.append(step)
                continue
            elif isinstance(op, TmaReadyOp):
                slots[out] = self._tma_ready(op, slots, device)
                static.add(out)
            elif isinstance(op, LaunchOp):
                step = self._launch_step(op, slots, static, kernels, device)
                if op in self.cached_launches:
                    if step is not None:
                        step(slots)  # runs once; its buffers stay with the plan
                    for a in op.args:
                        index = self.slots[a]
                        if isinstance(a.type, TensorType) and index not in static:
                            static.add(index)
                            kept[index] = slots[index]
                    steps = [s for s in steps if getattr(s, "out", None) not in kept]
                    continue
            elif isinstance(op, ReduceSumOp):
                step = _reduce_step(op, out, self.slots[op.input])
            elif isinstance(op, ConvertOp):
                ty = op.result.type
                assert isinstance(ty, TensorType)
                step = _convert_step(out, self.slots[op.input], torch_dtype(ty.element_type))
            else:
                raise TypeError(f"the runtime cannot execute host op {op.name}")
            if step is not None:
                step(slots)
                steps.append(step)
        blank: Slots = [None] * (len(self.slots) - self.n_args)
        for index, value in kept.items():
            blank[index - self.n_args] = value
        return self._plan(device, blank, steps, slots), [slots[i] for i in self.returns]

    def _plan(self, device: torch.device, blank: Slots, steps: list[Step], slots: Slots) -> LaunchPlan:
        """The plan of `steps`, with the buffers they allocate that qualify as scratch
        (see `plan`): uninitialized, read by launches and shape checks only, not returned
        or returned after result 0 (then only for calls that drop those results: the lse
        and the saved transforms of a forward); in program order while they total at
        most `SCRATCH_BYTES`."""
        values = {index: value for value, index in self.slots.items()}
        droppable = {r for r in self.returns[1:] if self.returns.count(r) == 1 and r != self.returns[0]}
        internal: list[Step] = []
        dropped: list[Step] = []
        size = 0
        for step in steps:
            out = getattr(step, "out", None)
            if out is None or (out in self.returns and out not in droppable):
                continue
            nbytes = slots[out].numel() * slots[out].element_size()
            if not _launch_buffer(values[out]) or size + nbytes > SCRATCH_BYTES:
                continue
            size += nbytes
            (dropped if out in droppable else internal).append(step)
        if not internal and not dropped:
            return LaunchPlan(device, blank, steps, self.returns, keeps=self.keeps)
        scratch = Scratch(internal, dropped, self.n_args, device)
        reusing = [s for s in steps if s not in internal]
        return LaunchPlan(device, blank, steps, self.returns, scratch, reusing, [s for s in reusing if s not in dropped],
                          keeps=self.keeps)

    def _int_step(self, fn: Callable[..., int], op: Operation, out: int, slots: Slots,
                  static: set[int]) -> Step | None:
        operands = tuple(self.slots[o] for o in op.operands)
        if all(i in static for i in operands):
            slots[out] = fn(*(slots[i] for i in operands))
            static.add(out)
            return None
        const = {i: slots[i] for i in operands if i in static}

        def int_op(s: Slots) -> None:
            s[out] = fn(*(const.get(i, s[i]) for i in operands))

        return int_op

    def _alloc_step(self, op: AllocOp, out: int, slots: Slots, device: torch.device) -> Step:
        ty = op.result.type
        assert isinstance(ty, TensorType)
        sizes = iter(slots[self.slots[s]] for s in op.sizes)
        shape = tuple(next(sizes) if d < 0 else d for d in ty.get_shape())
        dtype = torch_dtype(ty.element_type)
        make = torch.zeros if op.zero is not None else torch.empty
        order = op.dim_order()
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

    def _tma_ready(self, op: TmaReadyOp, slots: Slots, device: torch.device) -> bool:
        """`host.tma_ready` of this shape class (logged at debug level when false)."""
        reason = tma_unready_reason(
            [slots[self.slots[t]] for t in op.tensors], device, op.arch.value.data, op.rows.value.data)
        if reason is not None:
            logger.debug("@%s: TMA kernels not used for this shape class: %s", self.name, reason)
        return reason is None

    def _launch_step(self, op: LaunchOp, slots: Slots, static: set[int], kernels: Mapping[str, Any],
                     device: torch.device) -> KernelLaunch | None:
        """The one place where a launch's argument list is built (see `KernelLaunch`);
        None for an empty grid, which launches nothing."""
        name = op.kernel.root_reference.data
        meta = self.metadata[name]
        grid = tuple(int(slots[self.slots[g]]) for g in (op.grid_x, op.grid_y, op.grid_z))
        template: list[Any] = []
        fill: list[tuple[int, int]] = []
        descriptors: list[tuple[int, int, tuple[int, ...]]] = []
        arg_names = iter(meta.arg_names)
        for value in op.args:
            index = self.slots[value]
            arg = slots[index]
            arg_name = next(arg_names)
            if isinstance(arg, torch.Tensor):
                where = self._describe(value)
                if arg.device != device:
                    raise AttnfuseArgumentError(f"{where}: on {arg.device}, but the call runs on {device}")
            if isinstance(arg, torch.Tensor) and arg_name in meta.tma:
                descriptors.append((len(template), index, meta.tma[arg_name]))
                template.append(None)
            elif isinstance(arg, torch.Tensor):
                for _ in arg.shape:
                    next(arg_names)
                check_int32_layout(arg, where)
                if index not in static:
                    fill.append((len(template), index))
                template.append(arg if index in static else None)
                template.extend(0 if size == 1 else stride for size, stride in zip(arg.shape, arg.stride()))
            else:
                if index not in static:
                    fill.append((len(template), index))
                template.append(arg if index in static else None)
        launch = KernelLaunch(kernels[name], meta, grid, template, tuple(fill), device, tuple(descriptors))
        return launch if 0 not in grid else None

    def _describe(self, value: SSAValue) -> str:
        index = self.slots[value]
        if index < self.n_args:
            return f"argument {index} '{self.arg_names[index]}' of @{self.name}"
        return f"buffer '{value.name_hint or index}' of @{self.name}"


def tma_unready_reason(tensors: Sequence[torch.Tensor], device: torch.device, arch: int, rows: int) -> str | None:
    """Why a call cannot use TMA kernels (see `host.tma_ready`), or None."""
    if device.type != "cuda":
        return f"device {device}"
    major, minor = torch.cuda.get_device_capability(device)
    if major != arch:
        return f"compute capability {major}.{minor}"
    for n, t in enumerate(tensors):
        if not t.is_contiguous() or t.data_ptr() % 16:
            return f"operand {n} is not contiguous and 16-byte aligned"
        if t.shape[2] % rows:
            return f"operand {n} has length {t.shape[2]}, not a multiple of {rows}"
    return None


def _launch_buffer(value: SSAValue) -> bool:
    """Whether `value` is an uninitialized `host.alloc` that only launches, shape-only
    ops (`host.dim`, `host.tma_ready`) and the return use."""
    owner = value.owner
    return isinstance(owner, AllocOp) and owner.zero is None and all(
        isinstance(use.operation, (LaunchOp, DimOp, TmaReadyOp, func.ReturnOp)) for use in value.uses)


def _reduce_step(op: ReduceSumOp, out: int, source: int) -> Step:
    dims = tuple(op.dims.get_values())
    keepdim = op.keepdim is not None

    def reduce(s: Slots) -> None:
        s[out] = s[source].sum(dim=dims, keepdim=keepdim, dtype=torch.float32)

    return reduce


def _convert_step(out: int, source: int, dtype: torch.dtype) -> Step:
    def convert(s: Slots) -> None:
        s[out] = s[source].to(dtype)

    return convert
