"""RoPE / QK-norm placement per shape class, for calls that need no gradient.

`rope-fusion{strategy=auto}` fixes one placement per program at compile time, the cost
model's choice at the sequence length it plans for (`seq-len`, else 4096). The choice
moves with the shape: on an H200, Llama-3-8B attention at B = 1, S = 128 is predicted
faster `fused` (one launch) than `hybrid` (a K pre-kernel, then the kernel), and at
S = 4096 the other way round (`attnfuse-opt --cost-report --seq-len N --batch B`).

A call that records no autograd returns out (and lse), which every placement computes
(the same mathematics; the roundings of the rotated K differ: in the `fused` kernel it
is rotated in f32 registers, in the `hybrid` pre-kernel it is stored in the input's
dtype). So `PlacementVersions` asks the cost model, at the first such call of each shape
class, for the placement at the call's (B, S) on the call's GPU (the compile's `target`,
else the table's entry for the device's name) and, where it differs from the compiled
one, lowers the program again with that placement (once per placement, through the
disk cache as any compile; without `lower-backward`, as only forward calls run it) and
gives the runner its forward host program
(`Runner.infer`). Calls that record autograd and calls under torch.compile go through
the program's custom op and keep the compiled placement, which the op's saved tensors
and the backward follow.

Programs whose placement is not the model's to choose keep theirs: a pipeline without
`rope-fusion{strategy=auto}`, a program with no unpinned RoPE or QK-norm, packed
(cu_seqlens), programs reading a KV cache through kv_lens, and calls with Sq != Skv (the model has one S).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.passes import ModulePass

from attnfuse.cost import model
from attnfuse.cost.program_shape import shape_of
from attnfuse.cost.target import Target, get_target, target_for_device
from attnfuse.passes.rope_fusion import RopeFusionPass, choose_strategy
from attnfuse.program import AttentionProgram
from attnfuse.runtime.host import HostProgram

Lower = Callable[[Sequence[ModulePass]], HostProgram]
"""Compile the program with a pipeline: its forward host program."""


class PlacementVersions:
    """The forward host program per shape class for calls without autograd (see the
    module docstring); call it with a call's arguments: another placement's host
    program, or None to keep the compiled one."""

    def __init__(self, program: AttentionProgram, reparse: Callable[[], AttentionProgram], passes: Sequence[ModulePass],
                 rope: RopeFusionPass, lower: Lower) -> None:
        """`program`: the analyzed program before the pipeline runs (read here only);
        `reparse`: the same program parsed anew, for the model's later questions."""
        self._program_of = reparse
        self._program: AttentionProgram | None = None
        """The program, parsed anew at the first call the model is asked about."""
        self.qk = (program.q.arg_index, program.k.arg_index)
        """The argument indices of q and k."""
        self.passes = tuple(passes)
        self.target = get_target(rope.target) if rope.target is not None else None
        """The compile's target; None: the device's (`target_for_device`)."""
        self.compiled = choose_strategy(rope.strategy, self.target, program, rope.seq_len)
        """The placement the program was compiled with (what `rope` gives it)."""
        self._lower = lower
        self._lock = threading.Lock()
        self._devices: dict[int, Target | None] = {}
        self.lowered: dict[str, HostProgram] = {}
        """The forward host program of each placement lowered so far."""
        self.failed: set[str] = set()
        """Placements whose lowering failed (not tried again)."""

    @staticmethod
    def applies(program: AttentionProgram, passes: Sequence[ModulePass]) -> RopeFusionPass | None:
        """The pipeline's `rope-fusion{strategy=auto}` when `program` has a placement
        for it to choose per shape class, else None."""
        rope = next((p for p in passes if isinstance(p, RopeFusionPass)), None)
        if rope is None or rope.strategy != "auto":
            return None
        unpinned = [t for t in program.q.transforms + program.k.transforms if t.str_option("placement") == "auto"]
        if not unpinned or program.scores.cu_seqlens_q is not None or program.scores.kv_lens is not None:
            return None
        return rope

    def placement(self, target: Target, batch: int, seq_len: int) -> str:
        """The cost model's placement at (batch, seq_len) on `target`."""
        if self._program is None:
            self._program = self._program_of()
        return model.choose(shape_of(self._program, seq_len, batch, target=target), target)

    def __call__(self, args: Sequence[Any]) -> HostProgram | None:
        q, k = args[self.qk[0]], args[self.qk[1]]
        if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.dim() != 4 or k.dim() != 4:
            return None
        if q.shape[2] != k.shape[2] or q.shape[0] < 1 or q.shape[2] < 1:
            return None
        target = self.target if self.target is not None else self._device_target(q.device)
        if target is None:
            return None
        choice = self.placement(target, q.shape[0], q.shape[2])
        return None if choice == self.compiled else self.version(choice)

    def version(self, placement: str) -> HostProgram | None:
        """The forward host program of the program lowered with `placement`; None (and a
        warning, once) when that lowering fails: the calls keep the compiled placement."""
        with self._lock:
            if placement in self.failed:
                return None
            found = self.lowered.get(placement)
            if found is None:
                passes = [dataclasses.replace(p, strategy=placement) if isinstance(p, RopeFusionPass) else p
                          for p in self.passes if p.name != "lower-backward"]  # forward calls only
                try:
                    found = self.lowered[placement] = self._lower(passes)
                except Exception as e:  # noqa: BLE001 - an optional version: the compiled one still runs
                    self.failed.add(placement)
                    warnings.warn(f"attnfuse: lowering the '{placement}' placement for short calls failed "
                                  f"({type(e).__name__}: {e}); calls keep the compiled '{self.compiled}'",
                                  RuntimeWarning, stacklevel=2)
                    return None
            return found

    def _device_target(self, device: torch.device) -> Target | None:
        if device.type != "cuda":
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._devices:
            self._devices[index] = target_for_device(torch.cuda.get_device_name(index))
        return self._devices[index]
