"""Pointer arithmetic, loads, stores and atomic adds for `TileBuilder` (Triton's
`ptr + offsets` addressing; offsets, masks and values broadcast together).

```python
x = b.load(x_ptr, offs, mask=offs < n, other=0.0)
b.store(y_ptr, offs, x, mask=offs < n)
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects.builtin import i32, i64
from xdsl.ir import SSAValue

from attnfuse.dialects.tile import AtomicAddOp, AtomicFetchAddOp, BarrierOp, LoadOp, PtrAddOp, StoreOp
from attnfuse.dialects.tile_types import PtrType, broadcast_shapes, element_type_of, literal_type, shape_of, tile_type

if TYPE_CHECKING:
    from attnfuse.dialects.tile_builder import TileBuilder, Value


class MemoryOps:
    """The memory methods of `TileBuilder`."""

    def ptr_add(
        self: TileBuilder, ptr: SSAValue, offset: Value, *, name: str | None = None
    ) -> SSAValue:
        """`ptr + offset` elements (scalar offset; i32 or i64)."""
        off = (
            offset
            if isinstance(offset, SSAValue)
            else self.constant(offset, literal_type(offset))
        )
        if element_type_of(off.type) not in (i32, i64):
            off = self.cast(off, i64)
        return self._emit(PtrAddOp(ptr, off), name)

    def _address(
        self: TileBuilder, ptr: SSAValue, offsets: Value, mask: SSAValue | None, *extra: Value
    ) -> tuple[SSAValue, SSAValue | None, tuple[int, ...]]:
        if not isinstance(ptr.type, PtrType):
            raise TypeError(f"expected a !tile.ptr, got {ptr.type}")
        offs = offsets if isinstance(offsets, SSAValue) else self.constant(offsets, i32)
        shapes = [shape_of(offs.type)]
        shapes += [shape_of(v.type) for v in (mask, *extra) if isinstance(v, SSAValue)]
        shape = broadcast_shapes(*shapes)
        offs = self.broadcast_to(offs, shape)
        if mask is not None:
            mask = self.broadcast_to(mask, shape)
        return offs, mask, shape

    def load(
        self: TileBuilder,
        ptr: SSAValue,
        offsets: Value,
        *,
        mask: SSAValue | None = None,
        other: Value | None = None,
        name: str | None = None,
    ) -> SSAValue:
        """`tl.load(ptr + offsets, mask=mask, other=other)`; shapes broadcast."""
        offs, mask, shape = self._address(ptr, offsets, mask)
        other_v = None
        if other is not None:
            if mask is None:
                raise ValueError("load: `other` needs a `mask`")
            assert isinstance(ptr.type, PtrType)
            other_v = self.coerce(other, tile_type(shape, ptr.type.pointee))
        return self._emit(LoadOp(ptr, offs, mask, other_v), name)

    def store(
        self: TileBuilder,
        ptr: SSAValue,
        offsets: Value,
        value: Value,
        *,
        mask: SSAValue | None = None,
    ) -> StoreOp:
        """`tl.store(ptr + offsets, value, mask=mask)`; `value` must already have
        the pointee element type (use `cast`)."""
        op = StoreOp(*self._store_operands(ptr, offsets, value, mask))
        self.insert(op)
        return op

    def atomic_add(
        self: TileBuilder,
        ptr: SSAValue,
        offsets: Value,
        value: Value,
        *,
        mask: SSAValue | None = None,
    ) -> AtomicAddOp:
        """`tl.atomic_add(ptr + offsets, value, mask=mask)`."""
        op = AtomicAddOp(*self._store_operands(ptr, offsets, value, mask))
        self.insert(op)
        return op

    def atomic_fetch_add(
        self: TileBuilder, ptr: SSAValue, offset: Value, value: Value, *, name: str | None = None
    ) -> SSAValue:
        """The i32 at `ptr[offset]` before adding the scalar `value` to it (acquire-release,
        `tile.atomic_fetch_add`)."""
        off = self.coerce(offset, i32)
        return self._emit(AtomicFetchAddOp(ptr, off, self.coerce(value, i32)), name)

    def barrier(self: TileBuilder) -> BarrierOp:
        """`tile.barrier`: every thread of the program waits for the others here."""
        op = BarrierOp()
        self.insert(op)
        return op

    def _store_operands(
        self: TileBuilder, ptr: SSAValue, offsets: Value, value: Value, mask: SSAValue | None
    ) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue | None]:
        offs, mask, shape = self._address(ptr, offsets, mask, value)
        assert isinstance(ptr.type, PtrType)
        return ptr, offs, self.coerce(value, tile_type(shape, ptr.type.pointee)), mask


__all__ = ["MemoryOps"]
