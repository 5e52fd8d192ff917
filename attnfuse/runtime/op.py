"""The `torch.library` custom ops of a compiled program: what PyTorch sees of a call.

`define_ops` registers, once per compiled program, two custom ops in the `attnfuse`
namespace, named after the function and a digest of its compiled form (the Triton source,
the host code and the kernels' metadata), so two compilations of one program share them:

- `attnfuse::<name>_<digest>(<the program's arguments>) -> (Tensor out, Tensor lse, ...)`,
  the forward host program, with a fake implementation (shapes and dtypes only, after the
  signature checks) for meta tensors, `torch.compile` and `torch.export`; after lse come
  the transformed Q / K of the arguments `OpSignature.saved` names (the forward's
  pre-kernel outputs);
- `attnfuse::<name>_<digest>_backward(<arguments>, Tensor fwd_out, Tensor fwd_lse,
  Tensor grad_out, Tensor? grad_lse) -> Tensor[]`, the compiled backward, one gradient
  per differentiable argument (`OpSignature.grad_of`), also with a fake implementation.

The forward op's autograd formula (`register_autograd`) saves the inputs (the transformed
Q / K in place of those `saved` names), out and lse and calls the backward op (then
`attnfuse::<name>_<digest>_backward_saved`, which reads them and recomputes no
pre-kernel), so a compiled graph contains both ops as single nodes: dynamo
never traces into the loader or Triton's interpreter. Tensor arguments become `Tensor`,
integer scalars (dropout seeds) `SymInt`, float scalars (score_mod captures) `float`. A program without a backward gets a formula
that raises its reason.
"""

from __future__ import annotations

import keyword
import logging
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.dialects.builtin import AnyFloat, IntegerType, TensorType

from attnfuse.runtime.checks import Parameter
from attnfuse.runtime.runner import Runner

logger = logging.getLogger(__name__)

NAMESPACE = "attnfuse"
"""The `torch.library` namespace of every AttnFuse op (`torch.ops.attnfuse`)."""

_lock = threading.Lock()
_defined: dict[str, _Entry] = {}
_BACKWARD_NAMES = ("fwd_out", "fwd_lse", "grad_out", "grad_lse")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class OpSignature:
    """What the ops of one compiled program declare, apart from its kernels."""

    name: str
    """The attention function's name (`llama3`)."""
    digest: str
    """A digest of the compiled program; the op name carries its first 16 digits."""
    parameters: tuple[Parameter, ...]
    out_dtype: torch.dtype
    out_heads: int
    out_dim: int
    """The output is `[B, out_heads, Sq, out_dim]` of `out_dtype`, lse `[B, out_heads, Sq]` f32."""
    out_order: tuple[int, ...] | None
    """The output's memory order of dims, outermost first (`host.alloc ... order`); None: contiguous."""
    grad_of: tuple[int, ...]
    """The arguments the backward returns a gradient for, in its result order."""
    no_backward: str | None
    """Why there is no backward; None when there is one."""
    saved: tuple[int, ...] = ()
    """Arguments whose transformed form (a pre-kernel's output) the forward op returns
    after lse, for the autograd formula to save in their place (`attnfuse.saved`)."""
    grad_orders: tuple[tuple[int, ...] | None, ...] = ()
    """The memory order of each gradient the backward returns (as `out_order`; empty:
    all contiguous)."""

    @property
    def op_name(self) -> str:
        return f"{re.sub(r'[^A-Za-z0-9_]', '_', self.name)}_{self.digest[:16]}"

    def schema(self) -> tuple[str, str]:
        """The schemas of the forward and the backward op."""
        names: list[str] = []
        for p in self.parameters:
            name = p.name
            if not _IDENTIFIER.match(name) or keyword.iskeyword(name) or name in names or name in _BACKWARD_NAMES:
                name = f"arg{p.index}"
            names.append(name)
        arguments = ", ".join(f"{_schema_type(p)} {n}" for p, n in zip(self.parameters, names))
        forward = f"({arguments}) -> (Tensor, Tensor{', Tensor' * len(self.saved)})"
        backward = f"({arguments}, Tensor fwd_out, Tensor fwd_lse, Tensor grad_out, Tensor? grad_lse) -> Tensor[]"
        return forward, backward


def _schema_type(param: Parameter) -> str:
    if isinstance(param.type, TensorType):
        return "Tensor"
    if isinstance(param.type, IntegerType):
        return "SymInt"
    if isinstance(param.type, AnyFloat):
        return "float"
    raise TypeError(f"argument {param.index} '{param.name}': no torch.library type for {param.type}")


@dataclass(frozen=True)
class Ops:
    """The custom ops of one compiled program."""

    forward: torch._ops.OpOverload
    backward: torch._ops.OpOverload | None
    backward_saved: torch._ops.OpOverload | None = None
    """The backward on the saved transforms (`OpSignature.saved`), where there are some."""


class _Entry:
    """A registered program: its ops and, weakly, the runner they call."""

    __slots__ = ("ops", "runner")

    def __init__(self, runner: Runner) -> None:
        self.runner = weakref.ref(runner)
        self.ops: Ops

    def live(self, name: str) -> Runner:
        runner = self.runner()
        if runner is None:
            raise RuntimeError(f"@{name}: every compiled function of this program was garbage collected; "
                               "compile it again (attnfuse.compile) before calling its op")
        return runner


def define_ops(signature: OpSignature, runner: Runner) -> tuple[Ops, Runner]:
    """The ops of a compiled program, registered on first use (see the module docstring),
    and the runner they call: `runner`, or the one of a live earlier compilation of the
    same program (whose launch plans are then shared). The ops hold their runner weakly,
    so a program's kernels and plans go when its last compiled function, and the last
    autograd graph through it, does."""
    with _lock:
        entry = _defined.get(signature.op_name)
        if entry is None:
            entry = _Entry(runner)
            entry.ops = _define(signature, runner, entry)
            _defined[signature.op_name] = entry
            logger.debug("registered torch op %s::%s", NAMESPACE, signature.op_name)
        live = entry.runner()
        if live is None:
            entry.runner = weakref.ref(runner)
            live = runner
        return entry.ops, live


def _define(signature: OpSignature, runner: Runner, entry: _Entry) -> Ops:
    forward_schema, backward_schema = signature.schema()
    qualname = f"{NAMESPACE}::{signature.op_name}"
    checker = runner.checker  # the same checks for every compilation of the program
    q_index = checker.qkv[0]

    results = 2 + len(signature.saved)

    def run_forward(*args: Any) -> tuple[torch.Tensor, ...]:
        return tuple(entry.live(signature.name).forward(args)[:results])

    def fake_forward(*args: Any) -> tuple[torch.Tensor, ...]:
        checker.check(args, fake=True)
        q = args[q_index]
        batch, length = q.shape[0], q.shape[2]
        shape = (batch, signature.out_heads, length, signature.out_dim)
        out = _empty(q, shape, signature.out_dtype, signature.out_order)
        lse = q.new_empty((batch, signature.out_heads, length), dtype=torch.float32)
        return (out, lse, *(args[i].new_empty(args[i].shape) for i in signature.saved))

    forward_op = torch.library.custom_op(qualname, run_forward, mutates_args=(), schema=forward_schema)
    forward_op.register_fake(fake_forward)
    if runner.backward is None:
        reason = signature.no_backward or "it was compiled without lower-backward"

        def no_gradient(ctx: Any, *grads: Any) -> Any:
            raise RuntimeError(f"@{signature.name} has no gradient: {reason}")

        forward_op.register_autograd(no_gradient)
        return Ops(forward_op._opoverload, None)  # noqa: SLF001 - the OpOverload torch.ops gives

    def run_backward(*args: Any) -> list[torch.Tensor]:
        *inputs, out, lse, d_out, d_lse = args
        grads = entry.live(signature.name).gradients(inputs, out, lse, d_out, d_lse)
        return [grads[i] for i in signature.grad_of]  # type: ignore[misc]

    def fake_backward(*args: Any) -> list[torch.Tensor]:
        inputs = args[: len(signature.parameters)]
        orders = signature.grad_orders or (None,) * len(signature.grad_of)
        return [_empty(inputs[i], checker.expected_shape(i, inputs), inputs[i].dtype, order)
                for i, order in zip(signature.grad_of, orders)]

    backward_op = torch.library.custom_op(f"{qualname}_backward", run_backward, mutates_args=(),
                                          schema=backward_schema)
    backward_op.register_fake(fake_backward)
    backward_overload = backward_op._opoverload  # noqa: SLF001
    saved_overload = None
    if signature.saved:
        def run_backward_saved(*args: Any) -> list[torch.Tensor]:
            *inputs, out, lse, d_out, d_lse = args
            grads = entry.live(signature.name).gradients(inputs, out, lse, d_out, d_lse, saved=True)
            return [grads[i] for i in signature.grad_of]  # type: ignore[misc]

        saved_op = torch.library.custom_op(f"{qualname}_backward_saved", run_backward_saved, mutates_args=(),
                                           schema=backward_schema)
        saved_op.register_fake(fake_backward)
        saved_overload = saved_op._opoverload  # noqa: SLF001
    _register_autograd(forward_op, saved_overload or backward_overload, signature, entry)
    return Ops(forward_op._opoverload, backward_overload, saved_overload)  # noqa: SLF001


def _register_autograd(forward_op: Any, backward_op: torch._ops.OpOverload, signature: OpSignature,
                       entry: _Entry) -> None:
    """`backward_op` takes the saved transforms in place of their arguments when the
    signature has some (`_backward_saved`)."""
    tensors = tuple(p.index for p in signature.parameters if isinstance(p.type, TensorType))
    scalars = tuple(p.index for p in signature.parameters if not isinstance(p.type, TensorType))
    count = len(signature.parameters)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
        ctx.scalars = tuple(inputs[i] for i in scalars)
        # the graph holds the runner, so `attnfuse.compile(text)(q, k, v).backward(g)` works
        # although the compiled function is gone when backward runs
        ctx.runner = entry.runner()
        out, lse, *transformed = output
        kept = dict(zip(signature.saved, transformed))  # the input itself is not kept
        ctx.save_for_backward(*(kept.get(i, inputs[i]) for i in tensors), out, lse)
        # no gradient flows into the saved transforms, and a result nothing used (lse,
        # mostly) reaches `backward` as None: autograd would otherwise fill a tensor of
        # zeros as large as each (a Q-sized memset per step)
        ctx.mark_non_differentiable(*transformed)
        ctx.set_materialize_grads(False)

    def backward(ctx: Any, d_out: torch.Tensor | None, d_lse: torch.Tensor | None, *_: Any) -> tuple[Any, ...]:
        *saved, out, lse = ctx.saved_tensors
        args: list[Any] = [None] * count
        for i, t in zip(tensors, saved):
            args[i] = t
        for i, value in zip(scalars, ctx.scalars):
            args[i] = value
        needs = ctx.needs_input_grad
        missing = [i for i in tensors if needs[i] and i not in signature.grad_of]
        if missing:
            p = signature.parameters[missing[0]]
            raise RuntimeError(
                f"@{signature.name}: argument {p.index} '{p.name}' requires grad, but AttnFuse derives no "
                "gradient for it (only q, k, v, QK-norm weights, bias tensors, ALiBi slopes and sinks)"
            )
        if d_out is None:
            d_out = torch.zeros_like(out)
        grads: list[Any] = [None] * count
        for i, grad in zip(signature.grad_of, backward_op(*args, out, lse, d_out, d_lse)):
            if needs[i]:
                shape = args[i].shape
                grads[i] = grad if grad.shape == shape else grad.sum_to_size(shape)  # a broadcast operand
        return tuple(grads)

    forward_op.register_autograd(backward, setup_context=setup_context)


def _empty(like: torch.Tensor, shape: Sequence[int], dtype: torch.dtype, order: tuple[int, ...] | None) -> torch.Tensor:
    """An uninitialized tensor with the strides the host code gives a result of memory
    order `order` (None: contiguous)."""
    if order is None:
        return like.new_empty(tuple(shape), dtype=dtype)
    stored = like.new_empty(tuple(shape[d] for d in order), dtype=dtype)
    return stored.permute(tuple(order.index(d) for d in range(len(order))))
