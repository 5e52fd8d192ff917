"""Device functions of the Gluon template kernels (`tile_hopper.func`s bound to a kernel
signature), shared by the Hopper forward and backward schedules.

A template kernel passes every pointer, stride and scalar argument of its
`KernelSignature` to each device function it calls, after the function's own leading
arguments (tiles and scalars the template computes):

```python
s = llama3_fwd_ws_score(s, rows, cols, batch, head, Sq, Skv)
```

A tensor read or written through a 2-D TMA descriptor is addressed in the descriptor's
2-D view (rows of its dim -2 stride): the descriptor argument is followed by the
(rows, columns) step of each leading dim (`descriptor_steps`, filled by the runtime from
the tensor's strides, see `runtime.launch.tma_view`), and the template finds the first
row and column of a (batch, head) with `${k}_at` (`DESCRIPTOR_AT`).
"""

from __future__ import annotations

from xdsl.dialects.builtin import FunctionType, TensorType, i32
from xdsl.ir import Attribute, SSAValue

from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.dialects.tile_hopper import FuncOp, ReturnOp
from attnfuse.dialects.tile_types import PtrType
from attnfuse.lowering.signature import KernelSignature, TensorArg


DESCRIPTOR_AT = '''\
@gluon.jit
def ${k}_at(batch, head, rows_b, cols_b, rows_h, cols_h):
    """(row, column) of the first row of (batch, head) in a descriptor's 2-D view."""
    return batch * rows_b + head * rows_h, batch * cols_b + head * cols_h

'''
"""Template text of `${k}_at`; its last four arguments are a descriptor's steps."""


def descriptor_steps(name: str, rank: int = 4) -> list[tuple[str, Attribute]]:
    """The kernel arguments after the 2-D descriptor argument `name` over a tensor of
    `rank` dims: (rows, columns) per leading dim, in the runtime's order."""
    return [(f"{name}_stride_{axis}{i}", i32) for i in range(rank - 2) for axis in "rc"]


def steps_text(name: str) -> str:
    """The step arguments of descriptor `name` as the template passes them."""
    return ", ".join(n for n, _ in descriptor_steps(name))


class DeviceFunctions:
    """Builds the device functions of the template kernel `name` with signature `sig`."""

    sig: KernelSignature
    name: str

    def _decls(self) -> list[tuple[str, Attribute]]:
        """(name, type) of the signature's arguments: pointer then strides per tensor."""
        decls: list[tuple[str, Attribute]] = []
        for arg in self.sig.args:
            if isinstance(arg, TensorArg):
                assert isinstance(arg.host.type, TensorType)
                decls.append((arg.name, PtrType(arg.host.type.element_type)))
                decls += [(f"{arg.name}_stride{i}", i32) for i in range(arg.rank)]
            else:
                decls.append((arg.name, arg.type))
        return decls

    def _function(self, suffix: str, leading: list[tuple[str, Attribute]]) -> tuple[FuncOp, TileBuilder]:
        """A device function taking `leading` then every kernel argument, bound to the
        signature (its tensors and scalars now read this function's arguments)."""
        decls = leading + self._decls()
        op = FuncOp(f"{self.name}_{suffix}", [t for _, t in decls], [])
        for arg, (arg_name, _) in zip(op.args, decls):
            arg.name_hint = arg_name
        values = iter(op.args[len(leading):])
        for arg in self.sig.args:
            if isinstance(arg, TensorArg):
                arg.ptr = next(values)
                arg.strides = [next(values) for _ in range(arg.rank)]
            else:
                arg.value = next(values)
        return op, TileBuilder(op)  # type: ignore[arg-type]

    @staticmethod
    def _finish(op: FuncOp, b: TileBuilder, *results: SSAValue) -> FuncOp:
        b.insert(ReturnOp(*results))
        op.properties["function_type"] = FunctionType.from_lists(
            op.function_type.inputs.data, [r.type for r in results])
        op.verify()
        return op


__all__ = ["DESCRIPTOR_AT", "DeviceFunctions", "descriptor_steps", "steps_text"]
