"""`attnfuse.nn.Attention`: a compiled attention program as a `torch.nn.Module`.

```python
import attnfuse, attnfuse.nn, torch

program = attnfuse.attention(heads=8, kv_heads=2, head_dim=64, dtype="f32").qk_norm().causal().sinks()
attn = attnfuse.nn.Attention(program, layout="bshd")      # owns wq, wk and sinks as Parameters
out = attn(q, k, v)                                      # q [B, S, 8, 64], k and v [B, S, 2, 64]
```

The program is compiled once, when the module is made. Its learnable operands (QK-norm
weights, sink logits, ALiBi slopes given as an operand) become `nn.Parameter`s named
after the program's arguments: norm weights start at 1 (`1 - weight_offset`), sinks at
0, slopes at the standard ALiBi slopes. Other operands (position ids, document ids, bias
tensors, captures) are passed to `forward` by name. A dropout seed is drawn from torch's
generator in training mode unless passed; in eval mode the module runs the program
compiled without its `attn.dropout`.

`layout="bshd"` takes and returns `[batch, seq, heads, dim]` tensors: q, k and v reach
the kernels as transposed views (the kernels take strides: no copy), and the program is
compiled with `lower-to-tile{out-layout=bshd}` (`attnfuse.passes.BSHD_PIPELINE`, unless
`pipeline` is given), so the output, the transposed view of the kernels' result, is
contiguous.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import BlockArgument, SSAValue

import attnfuse.api
from attnfuse.builder import Program, ProgramBuilder
from attnfuse.dialects.attn import BiasOp, DropoutOp, QKNormOp, SoftmaxOp
from attnfuse.passes import BSHD_PIPELINE
from attnfuse.program import find_functions
from attnfuse.reference import parse_program
from attnfuse.reference.interpreter import alibi_slopes
from attnfuse.runtime.checks import torch_dtype

__all__ = ["Attention"]

_LAYOUTS = ("bhsd", "bshd")


def _function(fn: attnfuse.api.AttentionFunction) -> tuple[ModuleOp, func.FuncOp]:
    module = parse_program(fn.attn_ir)
    return module, next(f for f in find_functions(module) if f.sym_name.data == fn.name)


def _initial_values(function: func.FuncOp) -> dict[int, torch.Tensor]:
    """The learnable arguments of a program (by index) and their initial values."""

    def index(value: SSAValue | None) -> int | None:
        return value.index if isinstance(value, BlockArgument) and value.owner is function.body.block else None

    values: dict[int, torch.Tensor] = {}
    for op in function.walk():
        if isinstance(op, QKNormOp) and (i := index(op.weight)) is not None:
            values[i] = torch.full(_shape(function, i), 1.0 - op.float_option("weight_offset"))
        elif isinstance(op, SoftmaxOp) and (i := index(op.sinks)) is not None:
            values[i] = torch.zeros(_shape(function, i))
        elif isinstance(op, BiasOp) and (i := index(op.slopes)) is not None:
            values[i] = alibi_slopes(_shape(function, i)[0], op.float_option("max_bias"))
    return values


def _shape(function: func.FuncOp, index: int) -> list[int]:
    ty = function.args[index].type
    assert isinstance(ty, TensorType)
    return list(ty.get_shape())


def _without_dropout(module: ModuleOp, function: func.FuncOp) -> ModuleOp:
    """`module` with the dropout ops of `function` and their seed arguments removed."""
    for op in [o for o in function.walk() if isinstance(o, DropoutOp)]:
        op.output.replace_all_uses_with(op.input)
        seed = op.seed
        op.detach()
        op.erase()
        if isinstance(seed, BlockArgument) and not seed.uses:
            function.body.block.erase_arg(seed)
    function.update_function_type()
    return module


class Attention(torch.nn.Module):
    """A compiled attention program as a module (see the module docstring)."""

    def __init__(self, program: Program | ProgramBuilder | str | os.PathLike[str], *, layout: str = "bhsd",
                 params: Mapping[str, object] | None = None, pipeline: str | None = None, target: str | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if layout not in _LAYOUTS:
            raise ValueError(f"attnfuse.nn.Attention: layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
        if isinstance(program, ProgramBuilder):
            program = program.build()
        self.layout = layout
        if pipeline is None and layout == "bshd":
            pipeline = BSHD_PIPELINE  # the output's transposed view is then contiguous
        self.function = attnfuse.api.compile(program, pipeline=pipeline, target=target, params=params)
        module, function = _function(self.function)
        learnable = _initial_values(function)
        seeds = [op.seed for op in function.walk() if isinstance(op, DropoutOp)]
        self._seed = next((self.function.parameters[a.index].name for a in seeds if isinstance(a, BlockArgument)), None)
        self._eval_function = attnfuse.api.compile(
            _without_dropout(module, function), pipeline=pipeline, target=target, entry=self.function.name
        ) if seeds else None
        self._learnable: dict[str, int] = {}
        for p in self.function.parameters:
            if p.index in learnable:
                value = learnable[p.index].to(device=device, dtype=torch_dtype(p.type.element_type))
                self.register_parameter(p.name, torch.nn.Parameter(value))
                self._learnable[p.name] = p.index
        self._operands = [p for p in self.function.parameters[3:] if p.index not in learnable]

    def extra_repr(self) -> str:
        names = ", ".join(p.name for p in self._operands)
        return f"@{self.function.name}, layout={self.layout!r}" + (f", operands=({names})" if names else "")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **operands: Any) -> Any:
        """Attention of q, k, v in the module's layout; the program's other operands by name."""
        if unknown := sorted(set(operands) - {p.name for p in self._operands}):
            expected = ", ".join(p.name for p in self._operands) or "none"
            raise TypeError(f"attnfuse.nn.Attention(@{self.function.name}): unknown operand(s) "
                            f"{', '.join(unknown)} (it takes: {expected})")
        fn = self.function if self.training or self._eval_function is None else self._eval_function
        if self.layout == "bshd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        args: list[Any] = [q, k, v]
        for p in fn.parameters[3:]:
            if p.name in self._learnable:
                args.append(getattr(self, p.name))
            elif p.name in operands:
                args.append(operands[p.name])
            elif p.name == self._seed:
                args.append(int(torch.randint(0, 2**62, (), device="cpu")))
            else:
                raise TypeError(f"attnfuse.nn.Attention(@{self.function.name}): missing operand "
                                f"{p.name!r} ({p.describe()})")
        result = fn(*args)
        if self.layout == "bhsd":
            return result
        if isinstance(result, tuple):
            out, lse = result
            return out.transpose(1, 2), lse
        return result.transpose(1, 2)
