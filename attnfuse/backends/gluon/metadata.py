"""Launch metadata of `tile_hopper.kernel`s (the runtime's `KernelMetadata`)."""

from __future__ import annotations

from xdsl.dialects.builtin import IntegerType

from attnfuse.backends.triton.metadata import KernelMetadata, attr_to_python, identifier, signature_type
from attnfuse.dialects import tile_hopper as th


def gluon_arg_names(kernel: th.KernelOp) -> list[str]:
    return [identifier(a.name_hint, f"arg{i}") for i, a in enumerate(kernel.args)]


def gluon_kernel_metadata(kernel: th.KernelOp) -> KernelMetadata:
    """Metadata of a Gluon kernel. Descriptor arguments have signature
    `tensordesc<bf16[128, 128]>` (the JIT derives the full type from the descriptor)
    and are listed in `tma`; integer scalars that are not strides are not specialized;
    `writes` is the kernel's own list (None: any tensor argument may be written)."""
    names = gluon_arg_names(kernel)
    signature: dict[str, str] = {}
    tma: dict[str, tuple[int, ...]] = {}
    for name, t in zip(names, kernel.arg_types):
        if isinstance(t, th.TmaDescType):
            tma[name] = t.shape
            signature[name] = f"tensordesc<{signature_type(t.element)}[{', '.join(map(str, t.shape))}]>"
        else:
            signature[name] = signature_type(t)
    scalars = tuple(n for n, t in zip(names, kernel.arg_types)
                    if isinstance(t, IntegerType) and "stride" not in n)
    return KernelMetadata(
        name=kernel.sym_name.data, arg_names=tuple(names), signature=signature,
        num_warps=kernel.num_warps.value.data, num_stages=1, launch=attr_to_python(kernel.launch),
        do_not_specialize=scalars, maxnreg=kernel.maxnreg.value.data, tma=tma,
        writes=None if kernel.writes is None else tuple(w.data for w in kernel.writes.data),
    )


__all__ = ["gluon_arg_names", "gluon_kernel_metadata"]
