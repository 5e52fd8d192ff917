"""
Launch metadata of `tile.kernel`s and the Triton names of their types.

`kernel_metadata(kernel)` is what a runtime needs to launch an emitted kernel: its
Python parameter names, its `triton.compile` signature, `num_warps`, `num_stages`, the
`launch` dictionary as plain Python values, and the scalar arguments Triton must not
specialize on. The `triton` target prints it as a comment above each kernel.

Triton specializes every integer argument on its value (1, divisible by 16, or
neither), so lengths and batch sizes would each create new compiled variants. The
kernel's scalar arguments (every integer that is not a tensor's stride: `B`, `Sq`,
`Skv`, seeds, ...) are therefore emitted as `do_not_specialize`; strides stay
specialized (a contiguous last dim, 16-aligned rows), so a kernel has at most two
variants across lengths (lengths that are, or are not, multiples of 16 give strides
that are or are not).
"""

from __future__ import annotations

import builtins
import keyword
import re
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    DictionaryAttr,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    StringAttr,
)
from xdsl.ir import Attribute, BlockArgument

from attnfuse.dialects import tile
from attnfuse.dialects.tile_types import (
    PtrType,
    bit_width,
    element_type_of,
    is_float_type,
)

HELPER_NAMES = ("_max_combine", "_min_combine", "_sum_combine", "_philox_rand")
"""Module-level helpers the emitter may define (see `emitter.HELPERS`)."""

RESERVED_NAMES = frozenset(
    {*keyword.kwlist, *dir(builtins), "tl", "triton", *HELPER_NAMES}
)
"""Names the emitted code must not shadow."""


def tl_dtype(t: Attribute) -> str:
    """`tl.float32`, `tl.bfloat16`, `tl.int32`, ... for an element type."""
    t = element_type_of(t)
    if isinstance(t, Float32Type):
        return "tl.float32"
    if isinstance(t, BFloat16Type):
        return "tl.bfloat16"
    if isinstance(t, Float16Type):
        return "tl.float16"
    if isinstance(t, Float64Type):
        return "tl.float64"
    if isinstance(t, IndexType):
        return "tl.int64"
    if isinstance(t, IntegerType):
        return f"tl.int{t.width.data}"
    raise NotImplementedError(f"no Triton dtype for {t}")


def signature_type(t: Attribute) -> str:
    """The `triton.compile` signature string of a kernel argument type."""
    if isinstance(t, PtrType):
        return "*" + signature_type(t.pointee)
    if is_float_type(t):
        return {16: "bf16" if isinstance(t, BFloat16Type) else "fp16", 32: "fp32"}.get(
            bit_width(t), "fp64"
        )
    return tl_dtype(t).replace("tl.int", "i")


def attr_to_python(attr: Attribute) -> Any:
    """Plain Python value of a launch-dictionary attribute."""
    if isinstance(attr, DictionaryAttr):
        return {k: attr_to_python(v) for k, v in attr.data.items()}
    if isinstance(attr, ArrayAttr):
        return [attr_to_python(a) for a in attr.data]
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, IntegerAttr):
        value = attr.value.data
        return bool(value) if attr.type == IntegerType(1) else value
    if isinstance(attr, FloatAttr):
        return attr.value.data
    return str(attr)


def identifier(hint: str | None, fallback: str) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in (hint or ""))
    if not name or name[0].isdigit():
        name = fallback + name
    return name


def kernel_arg_names(kernel: tile.KernelOp) -> list[str]:
    """The Python parameter names of the emitted kernel (unique, not reserved)."""
    names: list[str] = []
    for i, arg in enumerate(kernel.args):
        name = identifier(arg.name_hint, f"arg{i}")
        while name in RESERVED_NAMES or name in names or name == kernel.sym_name.data:
            name += "_"
        names.append(name)
    return names


@dataclass(frozen=True)
class KernelMetadata:
    """What a runtime needs to launch an emitted kernel."""

    name: str
    arg_names: tuple[str, ...]
    signature: dict[str, str]
    """Argument name -> Triton signature type (`*bf16`, `i32`, `fp32`, ...)."""
    num_warps: int
    num_stages: int
    launch: dict[str, Any] = field(default_factory=dict[str, Any])
    do_not_specialize: tuple[str, ...] = ()
    """Scalar (non-stride integer) arguments Triton must not specialize on their value."""
    writes: tuple[str, ...] | None = None
    """Pointer arguments the kernel stores to (None: unknown, any may be written)."""
    maxnreg: int | None = None
    """Register cap per thread (Gluon warp-specialized kernels); None: Triton's default."""
    tma: dict[str, tuple[int, ...]] = field(default_factory=dict[str, tuple[int, ...]])
    """TMA descriptor arguments -> block shape: the runtime builds each from the tensor
    operand (a 2-D view over its last dim, the block's default NVMMA shared layout)."""

    def decorator(self) -> str:
        """The kernel's `@triton.jit` line."""
        if not self.do_not_specialize:
            return "@triton.jit"
        return f"@triton.jit(do_not_specialize={list(self.do_not_specialize)!r})"

    def comment(self) -> str:
        args = ", ".join(f"{n}: {t}" for n, t in self.signature.items())
        return "\n".join(
            [
                f"# kernel {self.name}",
                f"#   num_warps={self.num_warps} num_stages={self.num_stages}"
                + (f" maxnreg={self.maxnreg}" if self.maxnreg is not None else ""),
                f"#   launch: {self.launch!r}",
                f"#   signature: {args}",
            ]
        )


def scalar_arg_names(kernel: tile.KernelOp) -> tuple[str, ...]:
    """Integer arguments that are not strides. Strides are named as such: `X_stride0`,
    `X_stride1`, ... after each tensor `X` (see `lowering/signature.py`), or `stride_*`."""
    return tuple(
        name
        for name, ty in zip(kernel_arg_names(kernel), kernel.arg_types)
        if isinstance(ty, (IntegerType, IndexType)) and not re.search(r"(^|_)stride", name)
    )


def written_arg_names(kernel: tile.KernelOp) -> tuple[str, ...] | None:
    """Pointer arguments that a `tile.store` / `tile.atomic_add` / `tile.atomic_fetch_add` writes through, or
    None when a stored-to pointer does not trace back to an argument."""
    names = kernel_arg_names(kernel)
    written: set[int] = set()
    for op in kernel.walk():
        if not isinstance(op, (tile.StoreOp, tile.AtomicAddOp, tile.AtomicFetchAddOp)):
            continue
        ptr = op.ptr
        while isinstance(ptr.owner, tile.PtrAddOp):
            ptr = ptr.owner.ptr
        if not (isinstance(ptr, BlockArgument) and ptr.owner is kernel.body.block):
            return None
        written.add(ptr.index)
    return tuple(names[i] for i in sorted(written))


def kernel_metadata(kernel: tile.KernelOp) -> KernelMetadata:
    names = kernel_arg_names(kernel)
    return KernelMetadata(
        name=kernel.sym_name.data,
        arg_names=tuple(names),
        signature={n: signature_type(t) for n, t in zip(names, kernel.arg_types)},
        num_warps=kernel.num_warps.value.data,
        num_stages=kernel.num_stages.value.data,
        launch=attr_to_python(kernel.launch),
        do_not_specialize=scalar_arg_names(kernel),
        writes=written_arg_names(kernel),
    )
