"""Packed batches in the kernels: every program works on one block of one sequence.

The kernels of a packed program (forward, dQ, dK/dV, Q/K pre-kernels) run one program per
(slot, head). A slot is one block of one sequence, listed on every call by a small
*schedule* kernel from cu_seqlens (one program per sequence, plus one for the padding):

```
schedule[t] = (sequence, block)   for t < sum_i cdiv(len_i, BLOCK)
schedule[t] = (-1, 0)             for the rest of the grid (padding slots)
```

The grid's slot count is the bound `(T + N (BLOCK - 1)) // BLOCK` (T tokens, N
sequences): it depends on shapes only, so launch plans stay per shape class and no
length is read back to the host. A program reads its sequence's start and length
(`SequenceView.enter`), offsets every per-token tensor by the sequence's first row
(`TensorArg.row_start`), and then works on local rows: KV loop bounds, masks (causal
and windows per sequence, bottom-right with the sequence's own lengths) and RoPE
positions (the local row) all come out per sequence, and no tile crosses a sequence
boundary. A padding slot has length 0: its loops are empty and its stores masked off.

Query-side schedules list a sequence's blocks last first (the heaviest under a causal
mask, as the unpacked forward numbers its q blocks); key-side schedules first first
(the heaviest dK/dV blocks under a causal mask).

```mlir
%sched = host.alloc %slots : tensor<?x2xi32>
host.launch @f_schedule_q128[%n_cu, %one, %one] (%cu_q, %sched, %slots) : tensor<?xi32>, tensor<?x2xi32>, i32
host.launch @f_fwd[%slots, %grid_bh, %one] (..., %sched, %cu_q, %cu_k, ...) : ...
```
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType, i32
from xdsl.ir import Operation, SSAValue

from attnfuse.dialects.host import DimOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.lowering.host_code import HostCode
from attnfuse.lowering.signature import KernelSignature, TensorArg

SCAN_WIDTH = 1024
"""Sequences a schedule program sums per step when it counts the blocks before its own."""
FILL_WIDTH = 128
"""Slots a schedule program writes per step."""


@dataclass(frozen=True)
class Schedule:
    """Host values of one schedule: the `[slots, 2]` i32 table and its slot count."""

    table: SSAValue
    slots: SSAValue
    side: str
    """"q" or "k": the cu_seqlens whose sequences it cuts into blocks."""


@dataclass(frozen=True)
class PackedRows:
    """What a packed kernel reads besides its own operands: a schedule, the cu_seqlens,
    and which of its tensors hold query tokens and which key tokens (dim 2)."""

    schedule: Schedule
    cu_q: SSAValue
    cu_k: SSAValue
    tokens_q: SSAValue
    tokens_k: SSAValue
    """Token counts of the two sides (dim 2 of their tensors): cu_seqlens are clamped to them."""
    q_rows: tuple[SSAValue, ...] = ()
    k_rows: tuple[SSAValue, ...] = ()


class PackedHost:
    """Host side of a packed program: its cu_seqlens and the schedules built from them."""

    def __init__(self, host: HostCode, prefix: str, cu_q: SSAValue, cu_k: SSAValue,
                 q_len: SSAValue, kv_len: SSAValue) -> None:
        self.host = host
        self.prefix = prefix
        self.cu = {"q": cu_q, "k": cu_k}
        self.tokens = {"q": q_len, "k": kv_len}
        self.kernels: list[Operation] = []
        self._kernels: dict[tuple[int, str], KernelOp] = {}
        self._schedules: dict[tuple[int, str], Schedule] = {}
        self._entries: dict[str, tuple[SSAValue, SSAValue]] = {}

    def schedule(self, side: str, block: int) -> Schedule:
        """The schedule of `side`'s sequences in blocks of `block` rows (built once)."""
        key = (block, side)
        if key not in self._schedules:
            self._schedules[key] = self._build(side, block)
        return self._schedules[key]

    def rows(self, side: str, block: int, q_rows: Sequence[SSAValue] = (),
             k_rows: Sequence[SSAValue] = ()) -> PackedRows:
        """`PackedRows` of a kernel walking `side`'s sequences in blocks of `block`."""
        return PackedRows(self.schedule(side, block), self.cu["q"], self.cu["k"], self.tokens["q"], self.tokens["k"],
                          tuple(q_rows), tuple(k_rows))

    def _build(self, side: str, block: int) -> Schedule:
        host = self.host
        cu = self.cu[side]
        if side not in self._entries:
            entries = host.emit(DimOp(cu, 0), f"cu_{side}_entries")
            self._entries[side] = entries, host.emit(arith.SubiOp(entries, host.const(1)), f"{side}_sequences")
        entries, sequences = self._entries[side]
        spare = host.emit(arith.MuliOp(sequences, host.const(block - 1)))
        bound = host.emit(arith.AddiOp(self.tokens[side], spare))
        slots = host.emit(arith.DivSIOp(bound, host.const(block)), f"{side}_slots{block}")
        table = host.alloc(TensorType(i32, [DYNAMIC_INDEX, 2]), {0: slots}, f"{side}_schedule{block}")
        name = f"{self.prefix}_schedule_{side}{block}"
        if (block, side) not in self._kernels:
            kernel = build_schedule_kernel(name, cu, self.tokens[side], table, slots, block, heavy_first=side == "q")
            self._kernels[(block, side)] = kernel
            self.kernels.append(kernel)
        one = host.const(1, "one")
        host.launch(name, [entries, one, one], [cu, self.tokens[side], table, slots])
        return Schedule(table, slots, side)


def clamped_bounds(b: TileBuilder, start: SSAValue, end: SSAValue, tokens: SSAValue,
                   prefix: str | None = None) -> tuple[SSAValue, SSAValue]:
    """(start, length) of a sequence from two cu_seqlens entries, clamped so that its rows
    stay within `[0, tokens)` whatever the entries hold: with values the host did not
    check (`check_segment_values` off, or a CUDA graph), bad entries give wrong numbers,
    never accesses outside the tensors."""
    start = b.minimum(b.maximum(start, 0), tokens, name=prefix and f"{prefix}_seq_start")
    end = b.minimum(b.maximum(end, start), tokens)
    return start, b.sub(end, start, name=prefix and f"{prefix}_seq_len")


def build_schedule_kernel(name: str, cu: SSAValue, tokens: SSAValue, table: SSAValue, slots: SSAValue, block: int,
                          *, heavy_first: bool) -> KernelOp:
    """The kernel writing `table` from `cu` (grid: N + 1 programs; see the module docstring)."""
    sig = KernelSignature()
    cu_arg = sig.tensor("cu_seqlens", cu)
    tokens_arg = sig.scalar("tokens", tokens)
    out = sig.tensor("schedule", table)
    slots_arg = sig.scalar("slots", slots)
    b = sig.start(name, num_warps=4, num_stages=1, launch={})
    assert cu_arg.ptr is not None and out.ptr is not None and slots_arg.value is not None
    assert tokens_arg.value is not None
    total = tokens_arg.value
    seq = b.program_id(0, name="seq")
    sequences = b.sub(b.num_programs(0), 1, name="sequences")
    with b.for_(0, seq, SCAN_WIDTH, inits=[b.constant(0, i32)], iv_name="j0", names=["first"]) as scan:
        j = b.add(scan.iv, b.arange(0, SCAN_WIDTH), name="j")
        before = b.lt(j, seq)
        _, lengths = clamped_bounds(b, b.load(cu_arg.ptr, b.mul(j, cu_arg.strides[0]), mask=before, other=0),
                                    b.load(cu_arg.ptr, b.mul(b.add(j, 1), cu_arg.strides[0]), mask=before, other=0),
                                    total)
        blocks = b.div(b.add(lengths, block - 1), block)
        scan.yield_(b.add(scan.carried[0], b.reduce_sum(blocks, 0)))
    first = scan.results[0]
    real = b.lt(seq, sequences, name="real")
    start = b.load(cu_arg.ptr, b.mul(seq, cu_arg.strides[0]), mask=real, other=0)
    end = b.load(cu_arg.ptr, b.mul(b.add(seq, 1), cu_arg.strides[0]), mask=real, other=0)
    own = b.div(b.add(clamped_bounds(b, start, end, total)[1], block - 1), block)
    count = b.where(real, own, b.sub(slots_arg.value, first), name="count")
    value = b.where(real, seq, -1, name="value")
    with b.for_(0, count, FILL_WIDTH, iv_name="k0") as fill:
        k = b.add(fill.iv, b.arange(0, FILL_WIDTH), name="k")
        in_range = b.and_(b.lt(k, count), b.lt(b.add(first, k), slots_arg.value))  # bad cu_seqlens: no overflow
        index = b.sub(b.sub(count, 1), k) if heavy_first else k
        row = b.mul(b.add(first, k), out.strides[0])
        b.store(out.ptr, row, value, mask=in_range)
        b.store(out.ptr, b.add(row, out.strides[1]), b.where(real, index, 0), mask=in_range)
    return b.finish()


@dataclass(frozen=True)
class SequenceCoords:
    """Where a program of a packed kernel works (kernel values)."""

    seq: SSAValue
    """The sequence (0 on a padding slot)."""
    block: SSAValue
    """The block of the schedule's side within the sequence."""
    q_len: SSAValue | None
    kv_len: SSAValue | None
    length: SSAValue
    """The length of the schedule's side (0 on a padding slot)."""


class SequenceView:
    """Kernel side of `PackedRows`: declares the schedule and cu_seqlens arguments (before
    `KernelSignature.start`); `enter` places a program on its sequence."""

    def __init__(self, sig: KernelSignature, rows: PackedRows) -> None:
        self.sig = sig
        self.rows = rows
        self.schedule = sig.tensor("schedule", rows.schedule.table)
        sides = {"q": rows.cu_q, "k": rows.cu_k}
        totals = {"q": rows.tokens_q, "k": rows.tokens_k}
        needed = {rows.schedule.side} | ({"q"} if rows.q_rows else set()) | ({"k"} if rows.k_rows else set())
        self.cu = {side: sig.tensor(f"cu_seqlens_{side}", sides[side]) for side in ("q", "k") if side in needed}
        self.tokens = {side: sig.scalar(f"tokens_{side}", totals[side]) for side in self.cu}

    def enter(self, b: TileBuilder, slot: SSAValue) -> SequenceCoords:
        """Read slot `slot` of the schedule and the sequence's start and length per side;
        the per-token tensors start at the sequence's first row from then on."""
        table = self.schedule
        assert table.ptr is not None
        row = b.mul(slot, table.strides[0])
        seq = b.load(table.ptr, row, name="seq")
        block = b.load(table.ptr, b.add(row, table.strides[1]), name="seq_block")
        real = b.ge(seq, 0, name="real")
        lengths: dict[str, SSAValue] = {}
        for side, cu in self.cu.items():
            assert cu.ptr is not None
            total = self.tokens[side].value
            assert total is not None
            start, lengths[side] = clamped_bounds(
                b, b.load(cu.ptr, b.mul(seq, cu.strides[0]), mask=real, other=0),
                b.load(cu.ptr, b.mul(b.add(seq, 1), cu.strides[0]), mask=real, other=0), total, side)
            tensors = self.rows.q_rows if side == "q" else self.rows.k_rows
            for arg in self.sig.args:
                if isinstance(arg, TensorArg) and any(arg.host is t for t in tensors):
                    arg.row_start = start
        seq = b.maximum(seq, 0, name="seq")
        return SequenceCoords(seq, block, lengths.get("q"), lengths.get("k"), lengths[self.rows.schedule.side])

