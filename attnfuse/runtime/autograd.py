"""The autograd function of a compiled program: compiled forward, compiled backward."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from attnfuse.api import AttentionFunction


class Differentiable(torch.autograd.Function):
    """Forward saves the inputs, O and lse; backward runs the compiled backward kernels."""

    @staticmethod
    def forward(ctx: Any, fn: AttentionFunction, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = fn._forward(args)[:2]  # noqa: SLF001
        ctx.fn = fn
        ctx.tensor_index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.scalars = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
        ctx.needs = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_index), out, lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor | None, d_lse: torch.Tensor | None) -> tuple[Any, ...]:
        fn: AttentionFunction = ctx.fn
        *tensors, out, lse = ctx.saved_tensors
        args: list[Any] = [None] * (len(tensors) + len(ctx.scalars))
        for i, t in zip(ctx.tensor_index, tensors):
            args[i] = t
        for i, value in ctx.scalars.items():
            args[i] = value
        if d_out is None:
            d_out = torch.zeros_like(out)
        grads = fn.gradients(args, out, lse, d_out, d_lse)
        for i, (needed, grad) in enumerate(zip(ctx.needs, grads)):
            if needed and grad is None:
                name = fn.parameters[i].name
                raise RuntimeError(
                    f"@{fn.name}: argument {i} '{name}' requires grad, but AttnFuse derives no gradient "
                    "for it (only q, k, v, QK-norm weights, bias tensors, ALiBi slopes and sinks)"
                )
        return (None, *(g if needed else None for g, needed in zip(grads, ctx.needs)))
