"""The run-time side of one compiled program: what its custom ops call.

A `Runner` holds the host programs (and so the launch plans) of a program's forward and
backward and the checks of its arguments. `attnfuse.compile` builds one per compiled
program; compiling the same program again while one is alive shares it (see
`attnfuse.runtime.op.define_ops`).

Calls that record no autograd (`infer`) may run another forward host program per shape
class: `versions`, when set, names it at the first such call of the class (the
compile-time side, `attnfuse.placement_versions`, picks the RoPE placement there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnfuse.runtime.checks import ArgumentChecker
from attnfuse.runtime.host import MAX_PLANS, HostProgram, call_signature
from attnfuse.runtime.plan import LaunchPlan

Versions = Callable[[Sequence[Any]], HostProgram | None]
"""The forward host program for the shape class of a call without autograd; None: `Runner.host`."""


class Runner:
    """Forward and backward of one compiled program, on converted arguments."""

    __slots__ = ("__weakref__", "_lock", "backward", "backward_saved", "checker", "grad_of", "host", "inference",
                 "versions")

    def __init__(self, host: HostProgram, backward: HostProgram | None, checker: ArgumentChecker,
                 grad_of: Sequence[int], backward_saved: HostProgram | None = None) -> None:
        self.host = host
        self.backward = backward
        self.backward_saved = backward_saved
        """`@f_backward_saved`: the arguments `OpSignature.saved` names hold what the
        forward returned for them (their pre-kernel's output)."""
        self.checker = checker
        self.grad_of = tuple(grad_of)
        self.versions: Versions | None = None
        self.inference: dict[tuple[Any, ...], LaunchPlan] = {}
        """The plan of each shape class for calls without autograd (`infer`)."""
        self._lock = threading.Lock()

    def forward(self, args: Sequence[Any], lse: bool = True) -> list[Any]:
        """The forward host program's results (out, lse, ...) on arguments whose scalars
        are converted: the plan of the call's shape class, or a new one. `lse=False`:
        the caller drops every result after out (see `LaunchPlan.run`)."""
        signature = call_signature(args)
        plan = self.host.plan(signature)
        return self._run(self.host, plan, args, signature, lse, self.checker.check(args) if plan is None else None)

    def infer(self, args: Sequence[Any], lse: bool = True) -> list[Any]:
        """`forward` for a call that records no autograd and keeps only out and lse (the
        results of every forward host program): the plan of the call's shape class in
        the host program `versions` names for it."""
        signature = call_signature(args)
        plan = self.inference.get(signature) if signature is not None else None
        if plan is not None:
            return self._run(self.host, plan, args, signature, lse, None)
        device = self.checker.check(args)
        host = (self.versions(args) if self.versions is not None else None) or self.host
        results = self._run(host, host.plan(signature), args, signature, lse, device)
        plan = host.plan(signature)
        if plan is not None:
            with self._lock:
                if len(self.inference) >= MAX_PLANS:
                    self.inference.pop(next(iter(self.inference)), None)
                self.inference[signature] = plan  # type: ignore[index]
        return results

    def _run(self, host: HostProgram, plan: LaunchPlan | None, args: Sequence[Any],
             signature: tuple[Any, ...] | None, lse: bool, device: torch.device | None) -> list[Any]:
        """Run `plan` on `args` (after the per-call value checks), or, without one, build
        the plan of `host` for the shape class on the checked `device`."""
        self.checker.segment_values(args)
        self.checker.page_values(args)
        if plan is not None:
            return plan.run(args, lse)
        assert device is not None
        return host.build(args, signature, device)

    def gradients(self, args: Sequence[Any], out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                  d_lse: torch.Tensor | None = None, *, saved: bool = False) -> list[torch.Tensor | None]:
        """Run the compiled backward: one gradient per argument (None where there is none).
        `saved`: `args` hold the forward's saved transforms (`@f_backward_saved`)."""
        results = self.backward_results(args, out, lse, d_out, d_lse, saved=saved)
        grads: list[torch.Tensor | None] = [None] * len(self.checker.parameters)
        for index, grad in zip(self.grad_of, results):
            grads[index] = grad
        return grads

    def backward_results(self, args: Sequence[Any], out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                         d_lse: torch.Tensor | None = None, *, saved: bool = False) -> list[Any]:
        """The backward host program's results: the gradients in `grad_of` order, then
        any debug results (the tile counter of `lower-backward{count-tiles=true}`)."""
        backward = self.backward_saved if saved else self.backward
        assert backward is not None
        if d_lse is None:
            d_lse = torch.zeros_like(lse)
        self.checker.segment_values(args)
        full = [*self.checker.scalars(args), out, lse, d_out, d_lse]
        signature = call_signature(full)
        plan = backward.plan(signature)
        return list(plan.run(full) if plan is not None else backward.build(full, signature, out.device))
