"""
Turn emitted Triton source into live kernels, for a GPU or for the interpreter.

The source is executed from memory, never imported from a file: `load_kernels` compiles
it under a pseudo file name (`<attnfuse-kernels-…>`) registered in `linecache`, which
is where `inspect.getsource` (and so `triton.jit`) reads it back. Nothing is written to
disk, no bytecode is read or written, and there is no window between checking a file
and importing it.

Triton 3.6 chooses between a compiled `JITFunction` and an `InterpretedFunction`
*when the decorator runs*, from `triton.knobs.runtime.interpret` (the
`TRITON_INTERPRET` environment variable). `load_kernels(source, interpret=...)` runs
the module with that knob set for the duration (and then restores it), under a module
name that includes the mode, so one process holds GPU kernels and interpreter kernels
of the same source side by side, whatever TRITON_INTERPRET says. That works because
emitted code calls Triton *builtins* only: library `@triton.jit` functions such as
`tl.max` or `tl.rand` are fixed to one mode at import, so the emitter defines its own
helpers instead. For speed, interpreter modules get their reduction combiners rebound
to Triton's own (`tl.standard._elementwise_max`, ...), which the interpreter reduces
with numpy (it compares the combiner by identity, whatever mode it was built in).

Interpreter mode also fixes two Triton 3.6 interpreter bugs: `tl.dot` on bf16 operands
multiplies their raw uint16 bit patterns (triton-lang/triton#11584), and a scalar used
as an index (`range(0, n, 64)`) is converted with `int()` on a 1-element array, which
NumPy >= 2.4 rejects (older NumPy warns). The interpreter keeps its state in globals
(the grid position, patched `triton.language` functions), so interpreted launches are
serialized by `INTERPRETER_LOCK`.
"""

from __future__ import annotations

import hashlib
import linecache
import logging
import sys
import threading
import types
from typing import Any

from attnfuse.backends.triton.metadata import HELPER_NAMES

logger = logging.getLogger(__name__)

INTERPRETER_LOCK = threading.RLock()
"""Held around every interpreted kernel launch: Triton's interpreter is not thread-safe."""

_lock = threading.Lock()
_loaded: dict[tuple[str, bool], dict[str, Any]] = {}

_NUMPY_COMBINERS = {
    "_max_combine": "_elementwise_max",
    "_min_combine": "_elementwise_min",
    "_sum_combine": "_sum_combine",
}
"""Emitted combiner -> the `triton.language.standard` one the interpreter special-cases."""


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _fix_triton_interpreter() -> None:
    """Patch the interpreter bugs listed in the module docstring (idempotent; both
    fixes are no-ops once Triton gets them right). Called with `_lock` held."""
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


def _execute(source: str, digest: str, interpret: bool) -> types.ModuleType:
    """Run `source` as a fresh module, from memory (see the module docstring)."""
    from triton import knobs

    mode = "interp" if interpret else "jit"
    module_name = f"attnfuse_kernels_{digest[:16]}_{mode}"
    filename = f"<attnfuse-kernels-{digest[:16]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    code = compile(source, filename, "exec", dont_inherit=True)
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module  # Triton and inspect look the module up by name
    try:
        with knobs.runtime.scope():
            knobs.runtime.interpret = interpret
            exec(code, module.__dict__)  # noqa: S102 - our own emitted source
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_kernels(source: str, interpret: bool = False) -> dict[str, Any]:
    """
    Run `source` and return its `@triton.jit` functions by name: compiled
    `JITFunction`s, or `InterpretedFunction`s (CPU tensors) when `interpret` is
    set. Results are memoized per (source, mode).
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    key = (source_digest(source), interpret)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        if interpret:
            _fix_triton_interpreter()
        module = _execute(source, key[0], interpret)
        if interpret:
            import triton.language as tl

            for ours, theirs in _NUMPY_COMBINERS.items():
                if hasattr(module, ours):
                    setattr(module, ours, getattr(tl.standard, theirs))
        kinds = (JITFunction, InterpretedFunction)
        kernels = {
            n: f for n, f in vars(module).items() if isinstance(f, kinds) and n not in HELPER_NAMES
        }
        _loaded[key] = kernels
        logger.debug("loaded %d %s kernels from source %s", len(kernels),
                     "interpreter" if interpret else "GPU", key[0][:16])
        return kernels
