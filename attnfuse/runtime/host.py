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
and head, that exceeds int32 is an `AttnfuseArgumentError` naming the tensor. A tensor
that a Gluon kernel reads through a 2-D TMA descriptor reaches it as the descriptor plus
(rows, columns) steps per leading dim (`launch.tma_view`), so [B, H, S, D] views of
[B, S, H, D] memory (what Hugging Face models pass) take the TMA kernels too.

A launch whose inputs are only shapes and constants (the block map of a mask that does
not read tensors, e.g. a custom predicate over indices, or a cos/sin table) runs once per
plan: its output buffers are kept with the plan. A block map that reads data (document
ids) runs on every call. A kernel whose metadata does not list what it writes
(`KernelMetadata.writes` None) is taken to write every tensor it takes, so a table it
reads is rebuilt on every call. A buffer with no elements (the split-KV workspace of a
call that does not split) is allocated once and kept with the plan too, unless the
function returns it. A `zero restored` buffer (counters the kernels set back to zero)
is scratch like an uninitialized one; a call captured into a CUDA graph takes it from
memory zeroed before the capture (`counters`). Calls that drop the lse may reuse one
lse buffer per stream (`plan.lean_steps`).
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
    FitsI32Op,
    KeepsResultsOp,
    LaunchOp,
    ReduceSumOp,
    SmCountOp,
    TmaReadyOp,
)
from attnfuse.runtime.checks import AttnfuseArgumentError, check_int32_layout, element_span, torch_dtype
from attnfuse.runtime.launch import KernelLaunch, tma_view
from attnfuse.runtime.build import (
    NOT_DENSE,
    Build,
    Instruction,
    alloc_step,
    convert_step,
    reduce_step,
    scalar_instruction,
    step_instruction,
    tma_unready_reason,
)
from attnfuse.runtime.counters import restored_zeros
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
    arith.AndIOp: lambda a, b: a and b,
    arith.OrIOp: lambda a, b: a or b,
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


def fits_i32(tensors: Sequence[torch.Tensor]) -> bool:
    """`host.fits_i32`: i32 element offsets from each tensor's first element reach all
    of it."""
    return all(element_span(t.shape, t.stride()) < 2**31 for t in tensors if t.numel())


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
        self._loaded: dict[bool, Mapping[str, Any]] = {}
        self._layout_noted = False
        """Whether the INFO line about an operand layout that rules out TMA kernels was logged."""
        self._lock = threading.Lock()
        self._instructions = [self._instruction(op) for op in self.ops[:-1]]
        self._launch_buffers = {index for value, index in slots.items() if _launch_buffer(value)}
        """The slots that may be scratch (see `_plan`)."""

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
        """The memory order of result `index` when the host code gives it one (an ordered
        `host.alloc` or `host.convert`, through the `select`s that join guarded paths,
        which allocate alike); None: row-major, or an argument's."""
        value = self.ops[-1].operands[index]
        while True:
            owner = value.owner
            if isinstance(owner, arith.SelectOp):
                value = owner.lhs
            elif isinstance(owner, ConvertOp) and owner.order is None:
                value = owner.input
            else:
                return owner.dim_order() if isinstance(owner, (AllocOp, ConvertOp)) else None

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
                    for _ in range(_trailing_args(meta, name, a)):  # strides or descriptor steps
                        next(names)
                written = {by_name[n] for n in meta.writes if n in by_name}
            written_by[op] = written
            for value in written:
                writers.setdefault(value, []).append(op)
        returned = {self.ops[-1].operands[i] for i in range(len(self.ops[-1].operands))}
        static: set[SSAValue] = set()
        cached: set[LaunchOp] = set()
        for op in self.ops:
            if isinstance(op, (DimOp, SmCountOp, FitsI32Op, arith.ConstantOp)) or (
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
        state = Build([*args, *([None] * (len(self.slots) - self.n_args))], device, self._kernels(device))
        for instruction in self._instructions:
            instruction(state)
        blank: Slots = [None] * (len(self.slots) - self.n_args)
        for index, value in state.kept.items():
            blank[index - self.n_args] = value
        return self._plan(device, blank, state.steps, state.slots), [state.slots[i] for i in self.returns]

    def _kernels(self, device: torch.device) -> Mapping[str, Any]:
        """The program's kernels for `device`: compiled, or interpreted on the CPU."""
        interpret = device.type == "cpu"
        found = self._loaded.get(interpret)
        if found is None:
            from attnfuse.runtime.loader import load_kernels

            found = self._loaded[interpret] = load_kernels(self.source, interpret=interpret)
        return found

    def _plan(self, device: torch.device, blank: Slots, steps: list[Step], slots: Slots) -> LaunchPlan:
        """The plan of `steps`, with the buffers they allocate that qualify as scratch
        (see `plan`): uninitialized, read by launches and shape checks only, not returned
        or returned after result 0 (then only for calls that drop those results: the lse
        and the saved transforms of a forward); in program order while they total at
        most `SCRATCH_BYTES`."""
        droppable = {r for r in self.returns[1:] if self.returns.count(r) == 1 and r != self.returns[0]}
        internal: list[Step] = []
        dropped: list[Step] = []
        size = 0
        for step in steps:
            out = getattr(step, "out", None)
            if out is None or (out in self.returns and out not in droppable):
                continue
            nbytes = slots[out].numel() * slots[out].element_size()
            if out not in self._launch_buffers or size + nbytes > SCRATCH_BYTES:
                continue
            size += nbytes
            (dropped if out in droppable else internal).append(step)
        if not internal and not dropped:
            return LaunchPlan(device, blank, steps, self.returns, keeps=self.keeps)
        scratch = Scratch(internal, dropped, self.n_args, device)
        reusing = [s for s in steps if s not in internal]
        return LaunchPlan(device, blank, steps, self.returns, scratch, reusing, [s for s in reusing if s not in dropped],
                          keeps=self.keeps)

    # ------------------------------------------------------------------ instructions

    def _instruction(self, op: Operation) -> Instruction:
        """What building a plan does for `op`, with everything read from the IR here, once
        (`_build` runs these on every new shape class)."""
        out = self.slots[op.results[0]] if op.results else -1
        run = self._unguarded(op, out)
        if not isinstance(op, _GUARDED) or op.cond is None:
            return run
        cond, skip_when = self.slots[op.cond], op.unless is not None

        def guarded(state: Build) -> None:
            if bool(state.slots[cond]) != skip_when:  # else: a path this shape class does not take
                run(state)

        return guarded

    def _unguarded(self, op: Operation, out: int) -> Instruction:
        if isinstance(op, DimOp):
            source, index = self.slots[op.source], op.index.value.data
            return lambda state: state.static_value(out, int(state.slots[source].shape[index]))
        if isinstance(op, arith.ConstantOp):
            if isinstance(op.value, IntegerAttr):
                value = op.value.value.data
                return lambda state: state.static_value(out, value)
            return lambda state: state.keep(out, self._table(op, state.device))
        if isinstance(op, SmCountOp):
            return lambda state: state.static_value(out, sm_count(state.device))
        if isinstance(op, FitsI32Op):
            tensors = [self.slots[t] for t in op.tensors]
            return lambda state: state.static_value(out, fits_i32([state.slots[t] for t in tensors]))
        if isinstance(op, KeepsResultsOp):
            return lambda state: state.slots.__setitem__(out, 1)  # a first call returns every result
        if (fn := _scalar_fn(op)) is not None:
            return scalar_instruction(fn, tuple(self.slots[o] for o in op.operands), out)
        if isinstance(op, AllocOp):
            return self._alloc_instruction(op, out)
        if isinstance(op, TmaReadyOp):
            tensors, arch, rows = [self.slots[t] for t in op.tensors], op.arch.value.data, op.rows.value.data
            names = [self._describe(t) for t in op.tensors]

            def tma_ready(state: Build) -> None:
                reason = tma_unready_reason([state.slots[t] for t in tensors], state.device, arch, rows, names)
                if reason is not None:
                    logger.debug("@%s: TMA kernels not used for this shape class: %s", self.name, reason)
                    if reason.endswith(NOT_DENSE) and not self._layout_noted:  # a layout the caller may change
                        self._layout_noted = True
                        logger.info("@%s: %s, so the Triton kernels run instead of the TMA (sm_%d) ones; "
                                    "tensors with a contiguous last dim and 16-byte aligned rows ([B, H, S, D] or "
                                    "[B, S, H, D] memory) would take them", self.name, reason, arch * 10)
                state.static_value(out, reason is None)

            return tma_ready
        if isinstance(op, LaunchOp):
            return self._launch_instruction(op)
        if isinstance(op, ReduceSumOp):
            return step_instruction(reduce_step(op, out, self.slots[op.input]))
        if isinstance(op, ConvertOp):
            ty = op.result.type
            assert isinstance(ty, TensorType)
            return step_instruction(convert_step(out, self.slots[op.input], torch_dtype(ty.element_type),
                                                 op.dim_order()))
        raise TypeError(f"the runtime cannot execute host op {op.name}")

    def _alloc_instruction(self, op: AllocOp, out: int) -> Instruction:
        ty = op.result.type
        assert isinstance(ty, TensorType)
        dims, sizes = ty.get_shape(), [self.slots[s] for s in op.sizes]
        dtype = torch_dtype(ty.element_type)
        make = torch.empty if op.zero is None else restored_zeros if op.restored is not None else torch.zeros
        order = op.dim_order()
        returned = out in self.returns

        def alloc_instruction(state: Build) -> None:
            given = iter(state.slots[i] for i in sizes)
            step = alloc_step(out, tuple(next(given) if d < 0 else d for d in dims), dtype, make, order, state.device)
            step(state.slots)
            if state.slots[out].numel() == 0 and not returned:  # no data: one buffer serves every call
                state.keep(out, state.slots[out])
            else:
                state.steps.append(step)

        return alloc_instruction

    def _launch_instruction(self, op: LaunchOp) -> Instruction:
        """The one place where a launch's argument list is built (see `KernelLaunch`); a
        zero grid launches nothing and leaves no step."""
        name = op.kernel.root_reference.data
        meta = self.metadata[name]
        grid_slots = [self.slots[g] for g in (op.grid_x, op.grid_y, op.grid_z)]
        arg_names = iter(meta.arg_names)
        args: list[tuple[int, str, str, bool]] = []  # slot, kernel argument name, what it is, a descriptor
        for value in op.args:
            arg_name = next(arg_names)
            descriptor = isinstance(value.type, TensorType) and arg_name in meta.tma
            for _ in range(_trailing_args(meta, arg_name, value)):
                next(arg_names)
            args.append((self.slots[value], arg_name, self._describe(value), descriptor))
        cached = op in self.cached_launches
        tensor_slots = [self.slots[a] for a in op.args if isinstance(a.type, TensorType)]

        def launch_instruction(state: Build) -> None:
            slots, static, device = state.slots, state.static, state.device
            grid = tuple(int(slots[g]) for g in grid_slots)
            if 0 in grid and not cached:
                return  # launches nothing for this shape class (a path it does not take)
            template: list[Any] = []
            fill: list[tuple[int, int]] = []
            descriptors: list[tuple[int, int, tuple[int, ...]]] = []
            for index, arg_name, where, descriptor in args:
                arg = slots[index]
                if isinstance(arg, torch.Tensor) and arg.device != device:
                    raise AttnfuseArgumentError(f"{where}: on {arg.device}, but the call runs on {device}")
                if descriptor:
                    block = meta.tma[arg_name]
                    descriptors.append((len(template), index, block))
                    template.append(None)
                    if len(block) == 2:  # the steps of its leading dims (host.tma_ready admitted the view)
                        view = tma_view(arg)
                        assert view is not None, f"{where}: no TMA view"
                        template.extend(view[2])
                    continue
                if isinstance(arg, torch.Tensor):
                    check_int32_layout(arg, where)
                if index not in static:
                    fill.append((len(template), index))
                template.append(arg if index in static else None)
                if isinstance(arg, torch.Tensor):
                    template.extend(0 if size == 1 else stride for size, stride in zip(arg.shape, arg.stride()))
            step = (KernelLaunch(state.kernels[name], meta, grid, template, tuple(fill), device, tuple(descriptors))
                    if 0 not in grid else None)
            if not cached:
                if step is not None:
                    step(slots)
                    state.steps.append(step)
                return
            if step is not None:
                step(slots)  # runs once; its buffers stay with the plan
            for index in tensor_slots:
                if index not in static:
                    state.keep(index, slots[index])
            state.steps = [s for s in state.steps if getattr(s, "out", None) not in state.kept]

        return launch_instruction

    def _describe(self, value: SSAValue) -> str:
        index = self.slots[value]
        if index < self.n_args:
            return f"argument {index} '{self.arg_names[index]}' of @{self.name}"
        return f"buffer '{value.name_hint or index}' of @{self.name}"


def _trailing_args(meta: KernelMetadata, name: str, value: SSAValue) -> int:
    """How many kernel arguments after `name` the runtime fills from `value`: a tensor's
    strides (one per dim), a 2-D descriptor's (rows, columns) steps (two per leading
    dim, see `launch.tma_view`), nothing for a 1-D descriptor or a scalar."""
    if not isinstance(value.type, TensorType):
        return 0
    rank = len(value.type.get_shape())
    if name not in meta.tma:
        return rank
    return 2 * (rank - 2) if len(meta.tma[name]) == 2 else 0


def _launch_buffer(value: SSAValue) -> bool:
    """Whether `value` is an uninitialized (or `zero restored`) `host.alloc` that only
    launches, shape-only ops (`host.dim`, `host.tma_ready`) and the return use."""
    owner = value.owner
    return isinstance(owner, AllocOp) and (owner.zero is None or owner.restored is not None) and all(
        isinstance(use.operation, (LaunchOp, DimOp, TmaReadyOp, func.ReturnOp)) for use in value.uses)
