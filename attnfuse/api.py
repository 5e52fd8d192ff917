"""The Python API: compile an attn program once, call it on torch tensors.

```python
import attnfuse
attention = attnfuse.compile("examples/llama3.attn")
out = attention(q, k, v)                     # [B, 32, S, 128] bf16, CUDA or CPU
out, lse = attention(q, k, v, return_lse=True)
```

Arguments follow the program's function signature (q, k, v, then its extra operands).
On CUDA tensors the kernels run compiled; on CPU tensors through the Triton
interpreter. Compiled programs are cached on disk, keyed by the program text, the
pipeline, the `device` option, the versions of xDSL and Triton and a hash of the
compiler's own source.
"""

from __future__ import annotations

import os
import sys

if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
    import torch as _torch

    if not _torch.cuda.is_available():  # CPU only: kernels run through Triton's interpreter
        os.environ["TRITON_INTERPRET"] = "1"

import functools  # noqa: E402
import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, IntegerType, ModuleOp, StringAttr, TensorType
from xdsl.printer import Printer

from attnfuse.backends.triton.emitter import KernelMetadata, emit_module, kernel_metadata
from attnfuse.backends.triton.loader import default_cache_dir
from attnfuse.backends.triton.runtime import HostProgram, torch_dtype
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.tile import KernelOp
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import DEFAULT_PIPELINE
from attnfuse.program import analyze, find_functions, shared_length_operand, symbolic_shapes

_VERSION = "0.1.0"


class AttnfuseArgumentError(ValueError):
    """A call whose arguments do not match the program's signature."""


@dataclass(frozen=True)
class Parameter:
    """One argument of an attention program, as declared in its signature."""

    index: int
    name: str
    type: Any

    def describe(self) -> str:
        if isinstance(self.type, TensorType):
            dims = ", ".join("?" if d < 0 else str(d) for d in self.type.get_shape())
            return f"[{dims}] {torch_dtype(self.type.element_type)}"
        return str(self.type)


@functools.cache
def _versions() -> str:
    """Versions of everything that shapes a compiled program, the compiler's own code included."""
    import triton
    import xdsl

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return (
        f"attnfuse={_VERSION}:{digest.hexdigest()[:16]} "
        f"xdsl={getattr(xdsl, '__version__', '?')} triton={triton.__version__}"
    )


def _read_program(program: str | os.PathLike[str]) -> tuple[str, str]:
    """(text, filename) of a program given as text or as a path."""
    if isinstance(program, os.PathLike) or (
        isinstance(program, str) and "\n" not in program and program.endswith((".attn", ".mlir"))
    ):
        path = Path(program)
        return path.read_text(), str(path)
    return str(program), "<program>"


class AttentionFunction:
    """A compiled attention program; call it like the function it declares."""

    def __init__(self, text: str, filename: str, pipeline: str, device: str | None, entry: str | None) -> None:
        ctx = make_context()
        module, locations = parse_module_with_locations(ctx, text, filename)
        functions = find_functions(module)
        if entry is not None:
            functions = [f for f in functions if f.sym_name.data == entry]
        if not functions:
            raise ValueError(f"{filename}: no attention function{f' named @{entry}' if entry else ''}")
        function = functions[0]
        self.name = function.sym_name.data
        analyzed = analyze(function)
        self._symbolic = symbolic_shapes(analyzed)
        self._shared_length = shared_length_operand(analyzed)
        self._qkv = (analyzed.q.arg_index, analyzed.k.arg_index, analyzed.v_arg)
        self.parameters = [
            Parameter(i, a.name_hint or f"arg{i}", a.type) for i, a in enumerate(function.args)
        ]
        self.returns_lse = len(function.function_type.outputs.data) == 2
        self.attn_ir = str(module)
        self.pipeline = pipeline
        key = hashlib.sha256("\n".join([text, pipeline, device or "", _versions()]).encode()).hexdigest()
        cached = _load_cache(key)
        if cached is None:
            PassManager(pipeline, device=device).run(module, ctx, locations=locations)
            kernels = [op for op in module.walk() if isinstance(op, KernelOp)]
            self.triton_source = emit_module(kernels)
            host_funcs = [f for f in module.ops if isinstance(f, func.FuncOp)]
            host_text = "\n".join(_print(f) for f in host_funcs)
            metadata = {k.sym_name.data: kernel_metadata(k) for k in kernels}
            self.lowered_ir = str(module)
            _store_cache(key, self.triton_source, host_text, metadata)
        else:
            self.triton_source, host_text, metadata = cached
            self.lowered_ir = host_text
            host_funcs = [f for f in parse_module_with_locations(ctx, host_text, "<cache>")[0].ops
                          if isinstance(f, func.FuncOp)]
        by_name = {f.sym_name.data: f for f in host_funcs}
        self._host = HostProgram(by_name[self.name], self.triton_source, metadata)
        reason = by_name[self.name].attributes.get("attnfuse.no_backward")
        self._no_backward = reason.data if isinstance(reason, StringAttr) else None
        backward = by_name.get(f"{self.name}_backward")
        self._backward: HostProgram | None = None
        self._grad_of: list[int] = []
        if backward is not None:
            self._backward = HostProgram(backward, self.triton_source, metadata)
            grad_of = backward.attributes["attnfuse.grad_of"]
            assert isinstance(grad_of, ArrayAttr)
            self._grad_of = [int(a.value.data) for a in grad_of.data]  # type: ignore[attr-defined]
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any, return_lse: bool = False) -> Any:
        """Run the program; differentiable when any tensor argument requires grad."""
        device = self._check(args)
        converted = [_as_scalar(a) if not isinstance(p.type, TensorType) else a for a, p in zip(args, self.parameters)]
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in converted
        )
        if needs_grad:
            if self._backward is None:
                why = self._no_backward or "it was compiled without lower-backward"
                raise RuntimeError(f"@{self.name} has no gradient: {why}")
            out, lse = _Differentiable.apply(self, device, *converted)
        else:
            out, lse = self._host.run(converted, device)[:2]
        if return_lse or self.returns_lse:
            return out, lse
        return out

    def gradients(self, args: Sequence[Any], out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                  d_lse: torch.Tensor | None = None) -> list[torch.Tensor | None]:
        """Run the compiled backward: one gradient per argument (None where there is none)."""
        assert self._backward is not None
        if d_lse is None:
            d_lse = torch.zeros_like(lse)
        device = out.device
        results = self._backward.run([*args, out, lse, d_out, d_lse], device)
        grads: list[torch.Tensor | None] = [None] * len(self.parameters)
        for index, grad in zip(self._grad_of, results):
            grads[index] = grad
        return grads

    def count_tiles(self, *args: Any) -> int:
        """Debug helper for programs lowered with `lower-to-tile{count-tiles=true}`."""
        device = self._check(args)
        converted = [_as_scalar(a) if not isinstance(p.type, TensorType) else a for a, p in zip(args, self.parameters)]
        results = self._host.run(converted, device)
        if len(results) < 3:
            raise ValueError("compile with lower-to-tile{count-tiles=true} to count tiles")
        return int(results[2].item())

    def _check(self, args: Sequence[Any]) -> torch.device:
        if len(args) != len(self.parameters):
            names = ", ".join(p.name for p in self.parameters)
            raise AttnfuseArgumentError(
                f"@{self.name} takes {len(self.parameters)} arguments ({names}), got {len(args)}"
            )
        device: torch.device | None = None
        for param, arg in zip(self.parameters, args):
            where = f"argument {param.index} '{param.name}'"
            if not isinstance(param.type, TensorType):
                if isinstance(arg, torch.Tensor) and arg.numel() != 1:
                    raise AttnfuseArgumentError(f"{where}: expected a scalar {param.type}, got a tensor of shape {tuple(arg.shape)}")
                if not isinstance(arg, (int, torch.Tensor)) and isinstance(param.type, IntegerType):
                    raise AttnfuseArgumentError(f"{where}: expected an integer, got {type(arg).__name__}")
                continue
            if not isinstance(arg, torch.Tensor):
                raise AttnfuseArgumentError(f"{where}: expected a tensor {param.describe()}, got {type(arg).__name__}")
            shape = param.type.get_shape()
            if arg.dim() != len(shape) or any(d >= 0 and d != s for d, s in zip(shape, arg.shape)):
                raise AttnfuseArgumentError(
                    f"{where}: expected shape {param.describe()}, got {tuple(arg.shape)} {arg.dtype}"
                )
            expected = torch_dtype(param.type.element_type)
            if arg.dtype != expected:
                raise AttnfuseArgumentError(f"{where}: expected dtype {expected}, got {arg.dtype}")
            if device is None:
                device = arg.device
            elif arg.device != device:
                raise AttnfuseArgumentError(f"{where}: on {arg.device}, but earlier arguments are on {device}")
        if device is None:
            raise AttnfuseArgumentError("no tensor arguments")
        self._check_consistent(args)
        return device

    def _check_consistent(self, args: Sequence[Any]) -> None:
        """Dynamic dims must agree: batch `B` and lengths `Sq` / `Skv` are read off q and
        k, then every tensor argument is checked against its expected shape."""
        q_index, k_index, _ = self._qkv
        q, k = args[q_index], args[k_index]
        sizes = {"B": int(q.shape[0]), "Sq": int(q.shape[2]), "Skv": int(k.shape[2])}
        if self._shared_length is not None and sizes["Sq"] != sizes["Skv"]:
            param = self.parameters[self._shared_length]
            raise AttnfuseArgumentError(
                f"argument {param.index} '{param.name}' serves both queries and keys, so q and k "
                f"must have the same length, got {sizes['Sq']} and {sizes['Skv']}"
            )
        for index, symbols in sorted(self._symbolic.items()):
            arg = args[index]
            want = [sizes[s] if isinstance(s, str) else s for s in symbols]
            got = list(arg.shape)
            if index not in self._qkv and len(got) == len(want) and symbols and symbols[0] == "B" and got[0] == 1:
                want[0] = 1  # an extra operand may broadcast over the batch (read with stride 0)
            if got != want:
                shown = ", ".join(f"{s}={sizes[s]}" if isinstance(s, str) else str(s) for s in symbols)
                param = self.parameters[index]
                raise AttnfuseArgumentError(
                    f"argument {index} '{param.name}': expected shape [{shown}], got {tuple(arg.shape)}"
                )


class _Differentiable(torch.autograd.Function):
    """Forward saves the inputs, O and lse; backward runs the compiled backward kernels."""

    @staticmethod
    def forward(ctx: Any, fn: AttentionFunction, device: torch.device, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = fn._host.run(list(args), device)[:2]  # noqa: SLF001
        ctx.fn = fn
        ctx.tensor_index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.scalars = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
        ctx.needs = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_index), out, lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor | None, d_lse: torch.Tensor | None) -> tuple[Any, ...]:
        fn: AttentionFunction = ctx.fn
        saved = ctx.saved_tensors
        *tensors, out, lse = saved
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
        return (None, None, *(g if needed else None for g, needed in zip(grads, ctx.needs)))


def _as_scalar(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def _print(op: Any) -> str:
    import io

    buf = io.StringIO()
    Printer(stream=buf).print_op(op)
    return buf.getvalue()


def _cache_file(key: str) -> Path:
    return default_cache_dir() / "programs" / f"{key}.json"


def _load_cache(key: str) -> tuple[str, str, dict[str, KernelMetadata]] | None:
    path = _cache_file(key)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    metadata = {name: KernelMetadata(**meta) for name, meta in data["kernels"].items()}
    return data["source"], data["host"], metadata


def _store_cache(key: str, source: str, host: str, metadata: dict[str, KernelMetadata]) -> None:
    path = _cache_file(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "source": source,
        "host": host,
        "kernels": {
            name: {"name": m.name, "arg_names": list(m.arg_names), "signature": m.signature,
                   "num_warps": m.num_warps, "num_stages": m.num_stages, "launch": m.launch}
            for name, m in metadata.items()
        },
    }
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def compile(  # noqa: A001 - the natural name, as torch.compile
    program: str | os.PathLike[str] | ModuleOp,
    pipeline: str | None = None,
    device: str | None = None,
    entry: str | None = None,
) -> AttentionFunction:
    """Compile an attn program (text, a path to a .attn file, or a module)."""
    if isinstance(program, ModuleOp):
        text, filename = str(program), "<module>"
    else:
        text, filename = _read_program(program)
    return AttentionFunction(text, filename, pipeline or DEFAULT_PIPELINE, device, entry)
