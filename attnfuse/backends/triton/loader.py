"""
Turn emitted Triton source into live kernels, for a GPU or for the interpreter.

`triton.jit` needs a real file (it reads the function source with `inspect`), so
the source is written once to a cache directory under a name derived from its
sha256 (atomically: temp file + `os.replace`) and imported from there.

Triton 3.6 chooses between a compiled `JITFunction` and an `InterpretedFunction`
*when the decorator runs*, from `triton.knobs.runtime.interpret` (the
`TRITON_INTERPRET` environment variable). `load_kernels(source, interpret=...)`
imports the module with that knob set for the duration of the import (and then
restores it), under a module name that includes the mode, so one process can hold
GPU kernels and interpreter kernels of the same source side by side, whatever
TRITON_INTERPRET said when `triton` was imported. That works because emitted code calls
Triton *builtins* only: library `@triton.jit` functions such as `tl.max` or `tl.rand`
are fixed to one mode at import, so the emitter defines its own helpers instead. For
speed, interpreter modules get their reduction combiners rebound to Triton's own
(`tl.standard._elementwise_max`, ...), which the interpreter reduces with numpy.

Interpreter mode also fixes two Triton 3.6 interpreter bugs: `tl.dot` on bf16 operands
multiplies their raw uint16 bit patterns (triton-lang/triton#11584), and a scalar used
as an index (`range(0, n, 64)`) is converted with `int()` on a 1-element array, which
NumPy >= 2.4 rejects (older NumPy warns).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from attnfuse.backends.triton.emitter import HELPERS, emit_module, kernel_metadata
from attnfuse.dialects.tile import KernelOp

_lock = threading.Lock()
_loaded: dict[tuple[str, bool], dict[str, Any]] = {}

_NUMPY_COMBINERS = {
    "_max_combine": "_elementwise_max",
    "_min_combine": "_elementwise_min",
    "_sum_combine": "_sum_combine",
}
"""Emitted combiner -> the `triton.language.standard` one the interpreter special-cases."""

SM90_PTX_TARGET = ".target sm_90"
"""Prefix of the PTX target line for Hopper (Triton emits `sm_90a`)."""


def default_cache_dir() -> Path:
    """`$ATTNFUSE_CACHE_DIR`, else `~/.cache/attnfuse`."""
    configured = os.environ.get("ATTNFUSE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "attnfuse"


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def write_source(source: str, cache_dir: Path | None = None) -> Path:
    """The cached file holding `source` (written atomically if missing)."""
    directory = (cache_dir or default_cache_dir()) / "triton"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"kernels_{source_digest(source)[:32]}.py"
    if path.exists() and path.read_text() == source:
        return path
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kernels_", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _fix_triton_interpreter() -> None:
    """Patch the interpreter bugs listed in the module docstring (idempotent; both
    fixes are no-ops once Triton gets them right)."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_attnfuse_fix", False):
        return
    create_dot = builder.create_dot
    patch_tensor = interpreter._patch_lang_tensor  # pyright: ignore[reportPrivateUsage]

    def create_dot_bf16(self: Any, a: Any, b: Any, *args: Any) -> Any:
        if a.dtype.scalar == tl.bfloat16:
            a = self.cast_impl(a, tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = self.cast_impl(b, tl.float32)
        return create_dot(self, a, b, *args)

    def patch_tensor_index(tensor: Any, scope: Any) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    create_dot_bf16._attnfuse_fix = True  # pyright: ignore[reportFunctionMemberAccess]
    builder.create_dot = create_dot_bf16
    interpreter._patch_lang_tensor = patch_tensor_index  # pyright: ignore


def load_kernels(
    source: str, interpret: bool = False, *, cache_dir: Path | None = None
) -> dict[str, Any]:
    """
    Import `source` and return its `@triton.jit` functions by name: compiled
    `JITFunction`s, or `InterpretedFunction`s (CPU tensors) when `interpret` is
    set. Results are memoized per (source, mode).
    """
    from triton import knobs
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    key = (source_digest(source), interpret)
    if interpret:
        _fix_triton_interpreter()
    with _lock:
        if key in _loaded:
            return _loaded[key]
        path = write_source(source, cache_dir)
        mode = "interp" if interpret else "jit"
        module_name = f"attnfuse_kernels_{key[0][:16]}_{mode}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            with knobs.runtime.scope():
                knobs.runtime.interpret = interpret
                spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        if interpret:
            import triton.language as tl

            for ours, theirs in _NUMPY_COMBINERS.items():
                if hasattr(module, ours):
                    setattr(module, ours, getattr(tl.standard, theirs))
        kinds = (JITFunction, InterpretedFunction)
        kernels = {
            n: f
            for n, f in vars(module).items()
            if isinstance(f, kinds) and n not in HELPERS
        }
        _loaded[key] = kernels
        return kernels


def compile_for_sm90(
    source: str,
    kernel_name: str,
    signature: dict[str, str],
    constexprs: dict[str, Any] | None = None,
    *,
    num_warps: int = 4,
    num_stages: int = 3,
) -> Any:
    """
    Compile one kernel of `source` for Hopper (sm_90) without a GPU:
    `triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda",
    90, 32))`. `signature` maps every argument name to its Triton type (`*bf16`,
    `i32`, `fp32`, ..., or `constexpr`). Returns the `CompiledKernel`; its
    `asm["ptx"]` holds the PTX and `asm["cubin"]` the ptxas output.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = load_kernels(source, interpret=False)[kernel_name]
    ast = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(
        ast,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def compile_kernel_for_sm90(kernel: KernelOp) -> Any:
    """Emit `kernel` and compile it for sm_90 with its own signature and options."""
    meta = kernel_metadata(kernel)
    return compile_for_sm90(
        emit_module(kernel),
        meta.name,
        meta.signature,
        num_warps=meta.num_warps,
        num_stages=meta.num_stages,
    )


def ptx_target(compiled: Any) -> str:
    """The `.target` line of a compiled kernel's PTX (e.g. `.target sm_90a`)."""
    for line in compiled.asm["ptx"].splitlines():
        if line.startswith(".target"):
            return line.strip()
    raise ValueError("no .target line in the PTX")
