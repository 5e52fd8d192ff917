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
pipeline and the versions of AttnFuse, xDSL and Triton.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerType, ModuleOp, TensorType
from xdsl.printer import Printer

from attnfuse.backends.triton.emitter import KernelMetadata, emit_module, kernel_metadata
from attnfuse.backends.triton.loader import default_cache_dir
from attnfuse.backends.triton.runtime import HostProgram, torch_dtype
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.tile import KernelOp
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import DEFAULT_PIPELINE
from attnfuse.program import find_functions

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
            lowered = next(f for f in module.ops if isinstance(f, func.FuncOp) and f.sym_name.data == self.name)
            host_text = _print(lowered)
            metadata = {k.sym_name.data: kernel_metadata(k) for k in kernels}
            self.lowered_ir = str(module)
            _store_cache(key, self.triton_source, host_text, metadata)
        else:
            self.triton_source, host_text, metadata = cached
            self.lowered_ir = host_text
            lowered_module = parse_module_with_locations(ctx, host_text, "<cache>")[0]
            lowered = next(f for f in lowered_module.ops if isinstance(f, func.FuncOp))
        self._host = HostProgram(lowered, self.triton_source, metadata)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any, return_lse: bool = False) -> Any:
        device = self._check(args)
        converted = [_as_scalar(a) if not isinstance(p.type, TensorType) else a for a, p in zip(args, self.parameters)]
        out, lse = self._host.run(converted, device)[:2]
        if return_lse or self.returns_lse:
            return out, lse
        return out

    def count_tiles(self, *args: Any) -> int:
        """Debug helper for programs lowered with `lower-to-tile{count-tiles=true}`."""
        device = self._check(args)
        results = self._host.run(list(args), device)
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
        dims: dict[tuple[str, int], tuple[int, str]] = {}
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
        del dims
        self._check_consistent(args)
        return device

    def _check_consistent(self, args: Sequence[Any]) -> None:
        """q, k, v must agree on batch; k and v on sequence length."""
        q, k, v = args[0], args[1], args[2]
        if not (q.shape[0] == k.shape[0] == v.shape[0]):
            raise AttnfuseArgumentError(
                f"q, k, v batch sizes differ: {q.shape[0]}, {k.shape[0]}, {v.shape[0]}"
            )
        if k.shape[2] != v.shape[2]:
            raise AttnfuseArgumentError(f"k and v sequence lengths differ: {k.shape[2]} vs {v.shape[2]}")


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
