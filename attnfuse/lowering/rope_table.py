"""RoPE tables: cos and sin of every position, computed once per call for in-kernel RoPE.

A kernel that rotates Q or K tiles itself (the `fused` placement, and Q under `hybrid`)
reads `cos` and `sin` from a table instead of evaluating them: the attention kernel
rotates each K tile once per q block that visits it, and evaluating cos/sin there
(libdevice's, measured) cost several times the attention itself. The table kernel
evaluates them once per position (`qk_side.sin_cos`), in fp32 with the yarn factor
folded in, and stores them in the side's element type (as PyTorch RoPE implementations
apply bf16 cos/sin to bf16 inputs):

```
table[b, r, i]        = cos(pos(b, r) * inv_freq[i]) * f     for i < rotary_dim / 2
table[b, r, i + rd/2] = sin(pos(b, r) * inv_freq[i]) * f
```

`pos(b, r)` is `r + offset`, or the rope's `positions` operand (`[S]`, or `[B, S]`,
when the table has one slice per batch element). A table of `r + offset` positions
covers `max(Sq, Skv)` rows so that Q and K ropes with equal parameters share it.

A table that only kernels skipped under a predicate read (the forward kernel, whose
decode calls run the split-KV kernels instead) is built under it too: its grid is
`select(%decoding, 0, grid)`, until a kernel that runs then asks for the same table.

```mlir
host.launch @f_rope_table0[%grid_r, %one, %one] (%table, %inv_freq, %rows) : ...
```
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects import arith
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType
from xdsl.ir import Attribute, Operation, SSAValue

from attnfuse.analysis.rope import RopeParams
from attnfuse.dialects.attn import RopeOp
from attnfuse.dialects.host import DimOp
from attnfuse.lowering.host_code import HostCode
from attnfuse.lowering.qk_side import SideContext, SideTransforms, padded
from attnfuse.lowering.signature import KernelSignature

ROWS_PER_PROGRAM = 16
"""Positions per program. The table is small (S x rotary_dim) and each element costs a
libdevice sin or cos with range reduction, so the kernel is latency-bound: 16 rows give
S / 16 programs (128 at S = 2048) to spread over the SMs."""


class RopeTables:
    """Builds (once per distinct rope) the table kernels of one host function."""

    def __init__(
        self, host: HostCode, prefix: str, lengths: tuple[SSAValue, SSAValue],
        inv_freq: Callable[[RopeOp], SSAValue], remap: dict[SSAValue, SSAValue] | None = None,
    ) -> None:
        self.host = host
        self.prefix = prefix
        self.lengths = lengths
        self.inv_freq = inv_freq
        self.remap = remap or {}
        self.kernels: list[Operation] = []
        self._tables: dict[tuple[object, ...], SSAValue] = {}
        self._skipped: dict[tuple[object, ...], arith.SelectOp] = {}
        """Tables built under a predicate: `select(predicate, 0, grid)`, their grid."""
        self._max_len: SSAValue | None = None

    def __call__(self, op: RopeOp, dtype: Attribute, *, unless: SSAValue | None = None) -> SSAValue:
        """The host value of `op`'s table in `dtype` (launching its kernel on first use;
        `unless`: the reader does not run when it holds, nor need the table)."""
        positions = self.remap.get(op.positions, op.positions) if op.positions is not None else None
        key = (RopeParams.of(op), op.int_option("offset"), id(positions), dtype)
        if key not in self._tables:
            with self.host.unguarded():  # both paths of a guarded backward read it
                self._tables[key] = self._build(key, op, positions, dtype, unless)
        elif key in self._skipped and unless is not self._skipped[key].cond:
            select = self._skipped.pop(key)  # another reader: built whenever it runs
            select.result.replace_all_uses_with(select.rhs)
            select.detach()
            select.erase()
        return self._tables[key]

    def _rows(self, positions: SSAValue | None) -> tuple[SSAValue, SSAValue | None]:
        """(rows, batch slices or None) of a table."""
        host = self.host
        if positions is None:
            if self._max_len is None:
                self._max_len = host.emit(arith.MaxSIOp(*self.lengths), "rope_rows")
            return self._max_len, None
        assert isinstance(positions.type, TensorType)
        if len(positions.type.get_shape()) == 1:
            return host.emit(DimOp(positions, 0), "rope_rows"), None
        return host.emit(DimOp(positions, 1), "rope_rows"), host.emit(DimOp(positions, 0), "rope_batch")

    def _build(self, key: tuple[object, ...], op: RopeOp, positions: SSAValue | None, dtype: Attribute,
               unless: SSAValue | None) -> SSAValue:
        host = self.host
        rows, slices = self._rows(positions)
        rd = op.rotary_width()
        table_type = TensorType(dtype, [1 if slices is None else DYNAMIC_INDEX, DYNAMIC_INDEX, rd])
        table = host.alloc(table_type, {0: slices, 1: rows} if slices is not None else {1: rows}, "rope_table")
        name = f"{self.prefix}_rope_table{len(self.kernels)}"
        kernel, operands = build_table_kernel(name, op, table, rows, self.inv_freq, self.remap)
        self.kernels.append(kernel)
        one = host.const(1, "one")
        grid_r = host.cdiv(rows, ROWS_PER_PROGRAM, "rope_grid")
        if unless is not None:
            select = arith.SelectOp(unless, host.const(0), grid_r)
            self._skipped[key] = select
            grid_r = host.emit(select, "rope_grid_used")
        host.launch(name, [grid_r, one if slices is None else slices, one], operands)
        return table


def build_table_kernel(
    name: str, op: RopeOp, table: SSAValue, rows: SSAValue, inv_freq: Callable[[RopeOp], SSAValue],
    remap: dict[SSAValue, SSAValue],
) -> tuple[Operation, list[SSAValue]]:
    """The kernel filling `table` (grid: cdiv(rows, ROWS_PER_PROGRAM) x slices) and its launch operands."""
    assert isinstance(table.type, TensorType)
    sig = KernelSignature(remap)
    out = sig.tensor("T", table)
    side = SideTransforms([op], SideContext(sig, table.type.get_shape()[2], inv_freq), "x")
    n_rows = sig.scalar("R", rows)
    b = sig.start(name, num_warps=4, num_stages=1, launch={})
    slice_index = b.program_id(1, name="slice")
    r = b.add(b.mul(b.program_id(0), ROWS_PER_PROGRAM), b.arange(0, ROWS_PER_PROGRAM), name="rows")
    assert n_rows.value is not None
    row_ok = b.lt(r, n_rows.value, name="row_ok")
    half = op.rotary_width() // 2
    width = padded(half)
    cos, sin = side.evaluate_cos_sin(b, 0, op, width, r, slice_index, row_ok)
    i = b.arange(0, width)
    base = out.base(b, slice_index)
    offs = b.add(b.expand_dims(b.mul(r, out.strides[1]), 1), b.expand_dims(b.mul(i, out.strides[2]), 0))
    mask = b.and_(b.expand_dims(row_ok, 1), b.expand_dims(b.lt(i, half), 0))
    element = table.type.element_type
    b.store(base, offs, b.cast(cos, element), mask=mask)
    b.store(base, b.add(offs, b.mul(half, out.strides[2])), b.cast(sin, element), mask=mask)
    return b.finish(), sig.host_operands()
