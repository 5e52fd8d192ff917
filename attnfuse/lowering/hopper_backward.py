"""The Hopper backward schedule: dQ, dK and dV in one warp-specialized Gluon kernel.

For programs it serves (`ineligible_reason` says which and why not), `HopperBackward`
builds a `tile_hopper.kernel` from the template of `hopper_backward_template.py` and
the tile-IR device functions the template calls:

* `<name>_range`: the q walk of a block of 128 keys from the tile plan's band (first
  query row, number of 64-row tiles, and the rows [full_lo, full_hi) whose tiles need
  no mask), the transpose of the forward's KV walk (`backward.q_walk`); or, with a
  runtime block map (`hopper-block-map`), the key block's row of a transposed map of
  128 x 128 tiles (row, number of 64-row tiles, partial and full q block counts);
* `<name>_walk`: the first row of the walk's `tile`-th q tile and whether the planned
  masks apply to it (from the band, or from the map: full blocks, then partial ones,
  each from the last down, two 64-row tiles per block);
* `<name>_turn` (block maps): the key block's rank among those that add into a q tile,
  from the ranks of a map of 128 x 128 tiles (`block_map.py`), its dQ turn;
* `<name>_score`: ALiBi (constant slopes) on every S^T tile (keys along dim 0);
* `<name>_mask`: the planned masks on the S^T tiles at the band's edges.

Q, dO, K, V, LSE, delta and the f32 dQ buffer go through TMA descriptors over their
[rows, D] (or flat) views, so the kernel serves contiguous operands with both lengths
multiples of 128 (`host.tma_ready` decides per shape class). The host code then has two
guarded paths: this kernel, whose dQ is accumulated across CTAs by TMA reduce-adds, in
key-block order (per-tile counters in a zeroed int32 buffer), into an f32 buffer (zeroed
unless the first adder of every tile stores it) that transpose pre-kernels or a cast
follow; and the Triton dQ and dK/dV kernels with their own buffers and RoPE epilogues.
`arith.select` joins the gradients. The schedule is `lower-backward{hopper-backward}`,
on by default.

```mlir
%use_hopper_bwd = host.tma_ready %q, %d_out, %k, %v, %lse, %delta {arch = 9 : i64, rows = 128 : i64} : ...
%d_q_f32 = host.alloc %batch, %q_len when %use_hopper_bwd : tensor<?x32x?x128xf32>
host.launch @llama3_bwd_ws[%ws_grid_chunk, %ws_chunks, %one] (%q, %d_out, ...) when %use_hopper_bwd : ...
%d_q_rotated = host.alloc %batch, %q_len when %use_hopper_bwd unless : tensor<?x32x?x128xbf16>
host.launch @llama3_bwd_dq[%grid_0, %grid_1, %one] (...) when %use_hopper_bwd unless : ...
%d_q = arith.select %use_hopper_bwd, %d_q_hopper, %d_q_rotated : tensor<?x32x?x128xbf16>
```
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from xdsl.dialects.builtin import BFloat16Type, Float16Type, TensorType, f32, i32
from xdsl.ir import Attribute, Operation, SSAValue

from attnfuse.backends.triton.metadata import tl_dtype
from attnfuse.dialects.attn import BiasOp, MaskOp, OnlineSoftmaxOp, RopeOp
from attnfuse.dialects.host import TmaReadyOp
from attnfuse.dialects.tile_hopper import FuncOp, KernelOp, TmaDescType
from attnfuse.lowering.backward import rotate_back
from attnfuse.lowering.backward_dkv import q_walk
from attnfuse.lowering.block_map import map_arguments, map_counts, map_entry, map_per_head
from attnfuse.lowering.forward import LOG2E, BlockMap
from attnfuse.lowering.hopper_backward_template import TEMPLATE
from attnfuse.lowering.hopper_functions import DeviceFunctions, descriptor_steps, steps_text
from attnfuse.lowering.host_code import HostCode
from attnfuse.lowering.qk_side import SideContext, SideTransforms, partition, store_parts
from attnfuse.lowering.rope_table import RopeTables
from attnfuse.lowering.score_chain import ScoreChain, TileCoords
from attnfuse.lowering.signature import KernelSignature, TensorArg
from attnfuse.program import AttentionProgram

BLOCK_N = 128
"""Keys per CTA (64 per consumer warpgroup)."""
BLOCK_M = 64
"""Query rows per step of the walk."""
PAIR_CHUNK = 8
"""At most this many (batch, kv head) pairs per chunk of the launch order (`coords` in the
template; the chunk is gcd(kv heads, 8), so it divides the pair count): with 132 SMs, some
16 CTAs in flight per pair, whose walks add into the same dQ tiles within a few steps, so
the tiles' reduce-adds hit L2. Measured (run 20, Llama-3-8B, with the adds unordered), kernel us at
S = 2048 / 8192: all pairs interleaved (2 / 8 CTAs per pair in flight) 1717 / 4974, chunks
of 16 pairs 1328 / 4908, of 8 pairs 1310 / 4827, one pair at a time 1440 / 5226 (the
longest walks of the last pairs then start late)."""
STAGES = 2
"""Depth of the Q / dO ring (198 KB of shared memory at D = 128; 3 measured no faster, run 18)."""
MAXNREG = 168
"""Register cap of the launch, as the forward's: setmaxnreg then gives 240 registers to
each consumer warpgroup and 24 to the producer and the two dQ writers."""
HEAD_DIMS = (64, 128)

logger = logging.getLogger(__name__)


def ineligible_reason(program: AttentionProgram, *, kernel_transforms: bool, packed: bool,
                      count_tiles: bool, block_maps: bool = False) -> str | None:
    """Why the Hopper backward cannot serve this program, or None if it can.
    `kernel_transforms`: Q or K transforms run inside the backward kernels; `block_maps`:
    walk runtime block maps (`hopper-block-map`)."""
    online = program.online
    assert isinstance(online, OnlineSoftmaxOp)
    args = program.func.args
    q_type, k_type, v_type = args[program.q.arg_index].type, args[program.k.arg_index].type, args[program.v_arg].type
    assert isinstance(q_type, TensorType) and isinstance(k_type, TensorType) and isinstance(v_type, TensorType)
    dtype = q_type.element_type
    plan = online.plan
    if packed:
        return "a packed batch (cu_seqlens): TMA tiles would cross sequences"
    if not isinstance(dtype, (BFloat16Type, Float16Type)) or k_type.element_type != dtype or v_type.element_type != dtype:
        return "inputs are not all bf16 or all f16"
    head_dim, v_dim = q_type.get_shape()[3], v_type.get_shape()[3]
    if head_dim not in HEAD_DIMS or v_dim != head_dim:
        return f"head dims {head_dim}/{v_dim} (needs 64 or 128, equal for K and V)"
    if plan.get_prefix() is not None:
        return "the tile plan has a prefix"
    if plan.has_runtime_block_map() and not block_maps:
        return "the tile plan has a runtime block map (hopper-block-map is off)"
    if plan.has_runtime_block_map() and map_per_head(program):
        return "a runtime block map per head (the heads of a GQA group walk one map)"
    if online.sinks is not None:
        return "attention sinks"
    if online.dropout_seed is not None:
        return "dropout"
    if count_tiles:
        return "count-tiles"
    if kernel_transforms:
        return "Q/K transforms run in the backward kernels (transforms-in-kernel)"
    if program.scores.scale_value() <= 0:
        return "a scale that is not positive"
    for op in program.score_ops:
        if isinstance(op, BiasOp) and (op.kind_name == "tensor" or op.slopes is not None):
            return "a bias with a gradient (a bias tensor or learnable ALiBi slopes)"
        if not isinstance(op, (MaskOp, BiasOp)):
            return f"score op {op.name} (the schedule recomputes P with masks and ALiBi only)"
    return None


class HopperBackward(DeviceFunctions):
    """Builds the `tile_hopper.kernel` and device functions of one program's backward."""

    def __init__(self, program: AttentionProgram, name: str, *, q_len: SSAValue, kv_len: SSAValue,
                 dk: SSAValue, dv: SSAValue, host_table: Callable[[list[float]], SSAValue], planned: set[MaskOp],
                 remap: dict[SSAValue, SSAValue], dq_turns: SSAValue, k_epilogue: list[RopeOp] | None = None,
                 inv_freq: Callable[[RopeOp], SSAValue] | None = None, rope_table: RopeTables | None = None,
                 maps: tuple[BlockMap, BlockMap] | None = None) -> None:
        """`maps` (a runtime block map): the transposed map the CTAs walk and the map
        whose ranks order the dQ adds, both of 128 x 128 tiles."""
        self.program, self.name = program, name
        online = program.online
        assert isinstance(online, OnlineSoftmaxOp)
        self.plan = online.plan
        self.hq, self.hk, _ = program.heads
        self.chunk = math.gcd(self.hk, PAIR_CHUNK)
        q_type = program.func.args[program.q.arg_index].type
        assert isinstance(q_type, TensorType)
        self.dtype: Attribute = q_type.element_type
        self.head_dim = q_type.get_shape()[3]
        self.scale = program.scores.scale_value()
        sig = KernelSignature(remap)
        self.sig = sig
        self.dk_arg, self.dv_arg = sig.tensor("dK", dk), sig.tensor("dV", dv)
        self.turns_arg = sig.tensor("dQ_turns", dq_turns)
        # K's pre-kernel RoPEs undone on dK in the epilogue (`rotate-in-epilogue`): dK is
        # then written once in K's dtype, with no f32 buffer and no transpose pre-kernel
        self.k_epilogue: SideTransforms | None = None
        if k_epilogue:
            assert inv_freq is not None
            context = SideContext(sig, self.head_dim, inv_freq, rope_table, f32)  # type: ignore[arg-type]
            self.k_epilogue = SideTransforms(list(k_epilogue), context, "k_epi")
        # ALiBi on every tile (`_score`), the masks on the tiles at the band's edges (`_mask`):
        # both are additive or -inf, so their order does not matter. ALiBi as slope times the
        # distance tile: its per-key / per-query vector form spilled 372 bytes at D = 128.
        self.biases = ScoreChain([op for op in program.score_ops if isinstance(op, BiasOp)], sig, host_table, set(),
                                 alibi_vectors=False)
        self.masks = ScoreChain([op for op in program.score_ops if isinstance(op, MaskOp)], sig, host_table, planned)
        self.walk_args: list[TensorArg] = []
        self.rank_arg: TensorArg | None = None
        if maps is not None:
            walk, ranked = maps
            assert not walk.per_head and ranked.rank is not None
            self.walk_args = map_arguments(sig, walk, "t_")
            self.rank_arg = sig.tensor("rank", ranked.rank)
        self.q_len_arg = sig.scalar("Sq", q_len)
        self.kv_len_arg = sig.scalar("Skv", kv_len)

    def _range_function(self) -> FuncOp:
        op, b = self._function("range", [("n_start", i32), ("batch", i32), ("kv_head", i32)])
        n_start = op.args[0]
        q_len, kv_len = self.q_len_arg.value, self.kv_len_arg.value
        assert q_len is not None and kv_len is not None
        if self.walk_args:
            # the map row of this key block, its 64-row tiles, partial and full q blocks
            row = b.add(b.mul(op.args[1], b.cdiv(kv_len, BLOCK_N)), b.div(n_start, BLOCK_N), name="map_slot")
            partial, full = map_counts(b, self.walk_args, row)
            tiles = b.mul(b.add(partial, full), BLOCK_N // BLOCK_M, name="n_tiles")
            return self._finish(op, b, row, tiles, partial, full)
        lo, f0, f1, hi = q_walk(b, self.plan, n_start, q_len, kv_len, BLOCK_M, BLOCK_N, split=self.plan.is_exact())
        n_tiles = b.div(b.add(b.maximum(b.sub(hi, lo), 0), BLOCK_M - 1), BLOCK_M, name="n_tiles")
        results = [x if isinstance(x, SSAValue) else b.constant(x, i32) for x in (lo, n_tiles, f0 or 0, f1 or 0)]
        return self._finish(op, b, *results)

    def _walk_function(self) -> FuncOp:
        """(first row, masked) of q tile `tile` of a walk (`_range_function`'s four
        scalars). The CTAs visit tiles from `tiles - 1` down to 0: for a band its rows
        descend; for a map, the full q blocks from the last, then the partial ones, each
        block's two tiles upper first (a block's rank, `_turn_function`, holds for both)."""
        op, b = self._function("walk", [("tile", i32), ("q_lo", i32), ("tiles", i32), ("full_lo", i32),
                                        ("full_hi", i32)])
        tile, q_lo, _, full_lo, full_hi = op.args[:5]
        if not self.walk_args:
            start = b.add(q_lo, b.mul(tile, BLOCK_M), name="t_start")
            return self._finish(op, b, start, b.or_(b.lt(start, full_lo), b.ge(start, full_hi), name="masked"))
        per_block = BLOCK_N // BLOCK_M  # the maps' q blocks are 128 rows
        pair = b.div(tile, per_block, name="pair")
        # q_lo is the map row, full_lo the partial count
        block, masked = map_entry(b, self.walk_args, q_lo, pair, full_lo, "q_block")
        start = b.add(b.mul(block, BLOCK_N), b.mul(b.rem(tile, per_block), BLOCK_M), name="t_start")
        return self._finish(op, b, start, masked)

    def _turn_function(self) -> FuncOp:
        """The dQ turn of key block `n` on the q tile at row `t_start`: its rank among the
        key blocks that visit the tile's 128-row q block (the map's ranks)."""
        op, b = self._function("turn", [("t_start", i32), ("n", i32), ("batch", i32)])
        t_start, n, batch = op.args[:3]
        assert self.rank_arg is not None and self.rank_arg.ptr is not None and self.q_len_arg.value is not None
        row = b.add(b.mul(batch, b.cdiv(self.q_len_arg.value, BLOCK_N)), b.div(t_start, BLOCK_N), name="map_slot")
        base = b.ptr_add(self.rank_arg.ptr, b.mul(b.to_i64(row), b.to_i64(self.rank_arg.strides[0])))
        return self._finish(op, b, b.load(base, b.mul(n, self.rank_arg.strides[1]), name="turn"))

    def _tile_function(self, suffix: str, chain: ScoreChain) -> FuncOp:
        """`chain` on an Sᵀ tile (keys along dim 0) in units of the scale: the output times
        the scale is the chain's output (`ScoreChain.apply_scaled`)."""
        leading: list[tuple[str, Attribute]] = [
            ("s", TensorType(f32, [BLOCK_N // 2, BLOCK_M])), ("keys", TensorType(i32, [BLOCK_N // 2])),
            ("rows", TensorType(i32, [BLOCK_M])), ("batch", i32), ("head", i32), ("key0", i32)]
        op, b = self._function(suffix, leading)
        s, keys, rows, batch, head, key0 = op.args[:6]
        q_len, kv_len = self.q_len_arg.value, self.kv_len_arg.value
        assert q_len is not None and kv_len is not None
        # In bounds by construction: the schedule runs only when both lengths are multiples of 128.
        valid = b.and_(b.expand_dims(b.lt(keys, kv_len), 1), b.expand_dims(b.lt(rows, q_len), 0), name="valid")
        at = TileCoords(batch, head, rows, keys, q_len, kv_len, valid, transposed=True, kv_start=key0)
        t, k = chain.apply_scaled(b, s, self.scale, at, full_tile=False)
        assert k == self.scale  # masks and biases keep the scale symbolic
        return self._finish(op, b, t)

    def _dk_store_function(self) -> FuncOp:
        """Store a consumer warpgroup's dK rows (times the scale), rotated back by K's
        pre-kernel RoPEs (`rotate_back`, as the Triton dK/dV kernel's epilogue)."""
        d = self.head_dim
        leading: list[tuple[str, Attribute]] = [
            ("dk", TensorType(f32, [BLOCK_N // 2, d])), ("key0", i32), ("batch", i32), ("kv_head", i32)]
        op, b = self._function("dk_store", leading)
        dk, key0, batch, kv_head = op.args[:4]
        kv_len = self.kv_len_arg.value
        assert kv_len is not None
        # the key indices from the first key, not from the caller: their layout is then
        # inferred from the split halves' (Gluon converts no layouts by itself)
        keys = b.add(key0, b.arange(0, BLOCK_N // 2), name="keys")
        keys_ok = b.lt(keys, kv_len, name="keys_ok")
        full = partition(None, d)
        grad, layout = rotate_back(self.k_epilogue, b, {full[0].role: dk}, full, d, keys, batch, keys_ok)
        store_parts(b, self.dk_arg, self.dk_arg.base(b, batch, kv_head), keys, keys_ok, layout, grad)
        return self._finish(op, b)

    def _first_block(self) -> str:
        """The first key block whose q walk (`q_walk`) holds the tile at row `t_start`, as a
        template expression: the smallest n with hi(n) > t_start, i.e. (t_start + diag +
        lower) // 128 clamped at 0 (truncating division clamps the same as flooring)."""
        lower = self.plan.get_band()[0]
        if lower is None:
            return "0"
        diag = f"({self.kv_len_arg.name} - {self.q_len_arg.name})" if self.plan.is_bottom_right() else "0"
        return f"gl.maximum((t_start + {diag} + {int(lower)}) // {BLOCK_N}, 0)"

    def build(self) -> list[Operation]:
        """The device functions, then the kernel."""
        functions = [self._range_function(), self._walk_function()]
        turn = f"n - ({self._first_block()})"
        if self.rank_arg is not None:
            functions.append(self._turn_function())
            turn = f"{functions[-1].sym_name.data}(t_start, n, batch, {{}})"
        args = ", ".join(n for n, _ in self._decls())
        turn = turn.format(args)
        steps: list[str] = []
        call = "(s_t, keys, t_start + gl.arange(0, BM, layout=col_layout), batch, head, key0, {})".format(args)
        if self.biases.ops:
            functions.append(self._tile_function("score", self.biases))
            steps.append(f"        s_t = {functions[-1].sym_name.data}{call}")
        if self.masks.ops:
            functions.append(self._tile_function("mask", self.masks))
            steps += ["        if masked:",
                      f"            s_t = {functions[-1].sym_name.data}{call}"]
        mask_step = "\n".join(steps)
        dk, dv = self.dk_arg.name, self.dv_arg.name
        if self.k_epilogue is not None:
            functions.append(self._dk_store_function())
            dk_store = f"    {functions[-1].sym_name.data}(dk * {self.scale!r}, key0, batch, kv_head, {args})"
        else:
            dk_store = (f"    dk_base = batch.to(gl.int64) * {dk}_stride0 + kv_head.to(gl.int64) * {dk}_stride1\n"
                        f"    gl.store({dk} + dk_base + out_keys[:, None] * {dk}_stride2 + out_cols[None, :] * "
                        f"{dk}_stride3, (dk * {self.scale!r}).to({_gl_dtype(self.dk_arg.host.type)}))")
        text = TEMPLATE.substitute(
            k=self.name, hq=self.hq, hk=self.hk, group=self.hq // self.hk, chunk=self.chunk, stages=STAGES,
            scale=repr(self.scale),
            c=repr(self.scale * LOG2E), args=args, range_fn=functions[0].sym_name.data,
            walk_fn=functions[1].sym_name.data, mask_step=mask_step,
            q_len=self.q_len_arg.name, dv=dv, dk_store=dk_store,
            **{f"{t}_steps": steps_text(f"{t}_desc") for t in ("q", "do", "k", "v", "dq")},
            in_steps=", ".join(steps_text(f"{t}_desc") for t in ("q", "do", "k", "v")),
            **{f"dv_s{i}": f"{dv}_stride{i}" for i in range(4)}, dv_dtype=_gl_dtype(self.dv_arg.host.type),
            turns=self.turns_arg.name, turn=turn,
        )
        d = self.head_dim
        descs: list[tuple[str, Attribute]] = [
            ("q_desc", TmaDescType(self.dtype, [BLOCK_M, d])), *descriptor_steps("q_desc"),
            ("do_desc", TmaDescType(self.dtype, [BLOCK_M, d])), *descriptor_steps("do_desc"),
            ("k_desc", TmaDescType(self.dtype, [BLOCK_N, d])), *descriptor_steps("k_desc"),
            ("v_desc", TmaDescType(self.dtype, [BLOCK_N, d])), *descriptor_steps("v_desc"),
            ("lse_desc", TmaDescType(f32, [BLOCK_M])), ("delta_desc", TmaDescType(f32, [BLOCK_M])),
            ("dq_desc", TmaDescType(f32, [BLOCK_M, d // 2])), *descriptor_steps("dq_desc")]
        decls = descs + self._decls()
        kernel = KernelOp(
            self.name, [t for _, t in decls], num_warps=4, maxnreg=MAXNREG, launch={},
            callees=[f.sym_name.data for f in functions], template=text,
            # what it writes: the runtime keeps the buffers of shape-only launches it
            # reads (the RoPE table) with the launch plan
            writes=["dq_desc", self.dk_arg.name, self.dv_arg.name, self.turns_arg.name])
        for arg, (arg_name, _) in zip(kernel.args, decls):
            arg.name_hint = arg_name
        return [*functions, kernel]


def _gl_dtype(ty: Attribute) -> str:
    return "gl." + tl_dtype(ty).removeprefix("tl.")


def hopper_ready(host: HostCode, tensors: list[SSAValue]) -> SSAValue:
    """`host.tma_ready` over the operands the kernel reads through TMA (rotated Q, dO,
    rotated K, V, lse, delta): whether a shape class takes the Hopper path. Its f32 dQ
    buffer is allocated on that path, contiguous."""
    return host.emit(TmaReadyOp(tensors, arch=9, rows=BLOCK_N), "use_hopper_bwd")


def lower_hopper_backward(hopper: HopperBackward, host: HostCode, *, batch: SSAValue, q: SSAValue,
                          d_out: SSAValue, k: SSAValue, v: SSAValue, lse: SSAValue, delta: SSAValue,
                          dq: SSAValue, one: SSAValue) -> list[Operation]:
    """The kernel and device functions of `hopper`, and its launch (on the path of the
    host code's guard)."""
    ops = hopper.build()
    kv_len = hopper.kv_len_arg.host
    blocks = host.cdiv(kv_len, BLOCK_N, "ws_blocks")  # type: ignore[arg-type]
    grid = [host.mul(blocks, hopper.chunk, "ws_grid_chunk"),
            host.mul(batch, hopper.hk // hopper.chunk, "ws_chunks"), one]
    host.launch(hopper.name, grid, [q, d_out, k, v, lse, delta, dq, *hopper.sig.host_operands()])
    return ops


__all__ = ["BLOCK_M", "BLOCK_N", "HopperBackward", "hopper_ready",
           "ineligible_reason", "lower_hopper_backward"]
