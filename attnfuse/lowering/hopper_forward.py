"""The Hopper forward schedule: a warp-specialized Gluon kernel (FA3 ping-pong).

For programs it serves (`ineligible_reason` says which and why not), `HopperForward`
builds a `tile_hopper.kernel` from the template of `hopper_template.py` and the tile-IR
device functions the template calls:

* `<name>_range`: the KV walk of a 128-row CTA from the tile plan's band (first tile
  start, tile count, and the tiles [full_lo, full_hi) that need no mask);
* `<name>_q`: loads 64 Q rows (pointer loads) as the column parts of the RoPE layout
  and applies the in-kernel Q transforms (`SideTransforms`: RoPE from the table of
  `rope_table.py`, QK-norm); the template stores the parts into shared memory;
* `<name>_score_masked` / `<name>_score_full`: the score chain (`ScoreChain`) on a
  [64, 128] S tile, with and without the masks the plan covers.

K, V and O go through TMA descriptors over 2-D views (rows of the dim -2 stride,
addressed per (batch, head) from each descriptor's steps), so the kernel serves
contiguous [B, H, S, D] tensors and [B, H, S, D] views of [B, S, H, D] memory alike,
with both sequence lengths multiples of 128 (`host.tma_ready` decides per shape class;
the Triton kernel runs otherwise).
"""

from __future__ import annotations

import logging

from xdsl.dialects import arith
from xdsl.dialects.builtin import BFloat16Type, Float16Type, TensorType, f32, i32
from xdsl.ir import Attribute, Operation, SSAValue

from attnfuse.dialects.host import TmaReadyOp
from attnfuse.dialects.attn import BiasOp, MaskOp, OnlineSoftmaxOp, RopeOp, ScoreModOp, SoftcapOp
from attnfuse.dialects.tile_builder import TileBuilder, Value
from attnfuse.dialects.tile_hopper import FuncOp, KernelOp, TmaDescType
from attnfuse.analysis.rope import RopeParams, yarn_attention_factor
from attnfuse.lowering.block_map import map_arguments, map_counts, map_entry
from attnfuse.lowering.forward import LOG2E, ForwardSpec
from attnfuse.lowering.hopper_template import PRODUCER, TEMPLATE, TRANSFORMING_PRODUCER
from attnfuse.lowering.host_code import HostCode
from attnfuse.lowering.hopper_functions import DeviceFunctions, descriptor_steps, steps_text
from attnfuse.lowering.qk_side import SideContext, SideTransforms, load_parts, partition
from attnfuse.lowering.score_chain import ScoreChain, TileCoords
from attnfuse.lowering.signature import KernelSignature

BLOCK_M = 128
"""Query rows per CTA (two consumer warpgroups of 64)."""
BLOCK_N = 128
"""Keys per K/V tile."""
ROWS = BLOCK_M // 2
STAGES = 3
"""K/V ring depth: Q (2 x 64 x D) + 3 x (K + V) tiles fit 227 KiB at D = 128."""
MAXNREG = 168
"""Register cap of the launch: 12 warps x 32 x 168 <= 65536. Triton's setmaxnreg then
splits the 12 x 168 warp-registers between the partitions: 240 to each consumer
warpgroup and 24 to the producer (padded to a warpgroup), or, when the producer
transforms K, `TRANSFORMING_REGS`."""
TRANSFORMING_REGS = (232, 40)
"""(each consumer, the producer) registers when the producer warpgroup transforms K:
2 x 232 + 40 = 504 = 3 x 168."""
PRODUCER_WARPS = 4
"""Warps of the producer partition when it transforms K."""
K_VEC = 4
"""Elements per thread and row of a K chunk the transforming producer loads (8 for a
128-wide part, so that a chunk still has 8 rows: a shared-memory slice must not split
the 128-byte swizzle pattern)."""
HEAD_DIMS = (64, 128)
KV_STEPS = f"{steps_text('k_desc')}, {steps_text('v_desc')}"
"""The step arguments of the K and V descriptors, as the producer passes them on."""

logger = logging.getLogger(__name__)


def ineligible_reason(spec: ForwardSpec) -> str | None:
    """Why the Hopper schedule cannot serve this forward kernel, or None if it can."""
    program, online = spec.program, spec.program.online
    assert isinstance(online, OnlineSoftmaxOp)
    q_type, k_type, v_type = spec.q.type, spec.k.type, spec.v.type
    assert isinstance(q_type, TensorType) and isinstance(k_type, TensorType) and isinstance(v_type, TensorType)
    dtype = q_type.element_type
    if spec.packed is not None:
        return "a packed batch (cu_seqlens): TMA tiles would cross sequences"
    if spec.paged is not None:
        return "a paged KV cache: K/V rows are gathered through the block table, not TMA tiles"
    if spec.kv_lens is not None:
        return "a KV cache with kv_lens: the kernel walks every sequence to its full capacity"
    if not isinstance(dtype, (BFloat16Type, Float16Type)) or k_type.element_type != dtype or v_type.element_type != dtype:
        return "inputs are not all bf16 or all f16"
    head_dim, v_dim = q_type.get_shape()[3], v_type.get_shape()[3]
    if head_dim not in HEAD_DIMS or v_dim != head_dim:
        return f"head dims {head_dim}/{v_dim} (needs 64 or 128, equal for K and V)"
    if spec.block_map is not None and spec.k_transforms:
        return "a runtime block map with K transformed in the kernel (the producer steps cos/sin along a band)"
    if spec.block_map is not None and (online.plan.block_m.data, online.plan.block_n.data) != (BLOCK_M, BLOCK_N):
        return f"a runtime block map of {online.plan.block_m.data} x {online.plan.block_n.data} tiles (needs 128 x 128)"
    if spec.block_map is None and online.plan.has_runtime_block_map():
        return "a runtime block map the spec does not provide"
    if online.sinks is not None:
        return "attention sinks"
    if online.dropout_seed is not None:
        return "dropout"
    if online.plan.get_prefix() is not None:
        return "a prefix mask"
    if spec.tile_counter is not None:
        return "count-tiles"
    if spec.remap:
        return "not a forward program"
    for op in program.score_ops:
        if isinstance(op, MaskOp) and op.kind_name == "prefix_lm":
            return f"a {op.kind_name} mask"
        if not isinstance(op, (MaskOp, BiasOp, SoftcapOp, ScoreModOp)):
            return f"score op {op.name}"
    for side, transforms in (("Q", spec.q_transforms), ("K", spec.k_transforms)):
        ropes = [t for t in transforms if isinstance(t, RopeOp)]
        if len(ropes) > 1:
            return f"more than one {side} rope"
        if ropes and (ropes[0].str_option("style") != "half" or ropes[0].rotary_width() != head_dim):
            return f"a {side} rope that is not half-style over the whole head dim"
        if side == "K" and ropes and ropes[0].positions is not None:
            return "a K rope with a positions operand (the producer steps cos/sin from row to row)"
        if ropes and ropes[0].bottom_right():
            return "a bottom-right rope (its table rows would depend on the keys' length)"
    return None


class HopperForward(DeviceFunctions):
    """Builds the `tile_hopper.kernel` and device functions of a forward spec."""

    def __init__(self, spec: ForwardSpec, name: str) -> None:
        assert ineligible_reason(spec) is None
        self.spec = spec
        self.name = name
        program = spec.program
        online = program.online
        assert isinstance(online, OnlineSoftmaxOp)
        self.online = online
        self.hq, self.hk, self.hv = program.heads
        q_type = spec.q.type
        assert isinstance(q_type, TensorType)
        self.dtype: Attribute = q_type.element_type
        self.head_dim = q_type.get_shape()[3]
        scale = program.scores.scale_value()
        self.scale = scale
        rope = next((t for t in spec.q_transforms if isinstance(t, RopeOp)), None)
        self.layout = partition(rope, self.head_dim)
        self.k_rope = next((t for t in spec.k_transforms if isinstance(t, RopeOp)), None)
        self.k_layout = partition(self.k_rope, self.head_dim)
        # K transformed in the kernel as two 64-column parts (a half-style rope at D = 128):
        # the K ring is two allocations of [BN, 64] tiles, so that Triton's shared-memory
        # hazard analysis (per allocation) puts no barrier between the two parts' accesses
        self.k_split = bool(spec.k_transforms) and [(p.start, p.width) for p in self.k_layout] == [(0, 64), (64, 64)]

        sig = KernelSignature()
        self.sig = sig
        self.q_arg = sig.tensor("Q", spec.q)
        assert spec.lse is not None
        self.lse_arg = sig.tensor("LSE", spec.lse)
        self.save_q_arg = sig.scalar("save_q", spec.q_saved[1]) if spec.q_saved is not None else None
        side = SideContext(sig, self.head_dim, spec.inv_freq, spec.table_reader())  # type: ignore[arg-type]
        self.q_side = SideTransforms(spec.q_transforms, side, "q")
        # The producer evaluates K's cos/sin once per tile and steps them from chunk to
        # chunk (fp32); a K rope alone rotates in the input dtype (packed two-lane
        # arithmetic, as PyTorch's RoPE in that dtype), QK-norm in fp32.
        self.k_packed = [type(t) for t in spec.k_transforms] == [RopeOp]
        self.k_side = SideTransforms(spec.k_transforms, SideContext(sig, self.head_dim, spec.inv_freq), "k")  # type: ignore[arg-type]
        self.chain = ScoreChain(program.score_ops, sig, spec.host_table, spec.planned_masks,  # type: ignore[arg-type]
                                spec.alibi_vectors)
        # The scale folds through the score chain into the exp2 multiply-add (`fold_scale`;
        # masks commute with it, so a chain of masks alone always folds): the chain runs
        # on the raw scores and leaves a constant factor on its output.
        self.fold = scale > 0 and (spec.fold_scale or all(isinstance(op, MaskOp) for op in program.score_ops))
        self.qk_scale = (self.chain.scaled_factor(scale) if self.fold else 1.0) * LOG2E
        self.map_args = map_arguments(sig, spec.block_map) if spec.block_map is not None else []
        self.q_len_arg = sig.scalar("Sq", spec.q_len)
        self.kv_len_arg = sig.scalar("Skv", spec.kv_len)
        self.batch_arg = sig.scalar("B", spec.batch)

    def host_operands(self) -> list[SSAValue]:
        """Operands of the kernel's `host.launch`: K, V, Out (and the saved Q) as
        descriptors, then the rest."""
        saved = [self.spec.q_saved[0]] if self.spec.q_saved is not None else []
        return [self.spec.k, self.spec.v, self.spec.out, *saved, *self.sig.host_operands()]

    # ------------------------------------------------------------------ device functions

    def _items(self, b: TileBuilder) -> tuple[SSAValue, SSAValue, SSAValue]:
        """(batch x head count, q blocks per (batch, head), work items): one item per 128
        query rows of a (batch, head)."""
        assert self.batch_arg.value is not None and self.q_len_arg.value is not None
        bh = b.mul(self.batch_arg.value, self.hq, name="bh_count")
        q_blocks = b.cdiv(self.q_len_arg.value, BLOCK_M, name="q_blocks")
        return bh, q_blocks, b.mul(bh, q_blocks, name="items")

    def _steps_function(self) -> FuncOp:
        """Steps of a CTA's item loop: the items divided among `ctas` CTAs, rounded up."""
        op, b = self._function("steps", [("ctas", i32)])
        return self._finish(op, b, b.cdiv(self._items(b)[2], op.args[0], name="steps"))

    def _work_function(self) -> FuncOp:
        """(batch, head, q block, valid) of a CTA's `step`-th item. Items are numbered
        longest causal walk first (the last q block of every (batch, head), then the one
        before, ...) and cut into rounds of `ctas`; even steps take the rounds from the
        front, odd steps from the back in reverse CTA order, so a CTA's long items pair
        with short ones and every CTA's walks add up to about the same (within two tiles
        of the mean for the Llama-3 shapes; `test_persistent_items_cover_every_block_once`).
        `valid` is false past the last item."""
        op, b = self._function("work", [("step", i32), ("cta", i32), ("ctas", i32)])
        step, cta, ctas = op.args[:3]
        bh_count, q_blocks, items = self._items(b)
        odd = b.eq(b.rem(step, 2), 1, name="odd")
        half = b.div(step, 2)
        back = b.sub(b.sub(b.cdiv(items, ctas), 1), half)
        rank = b.where(odd, b.sub(b.sub(ctas, 1), cta), cta, name="rank")
        index = b.add(b.mul(b.where(odd, back, half), ctas), rank, name="item")
        bh = b.rem(index, bh_count, name="bh")
        m = b.sub(b.sub(q_blocks, 1), b.div(index, bh_count), name="m")
        return self._finish(op, b, b.div(bh, self.hq, name="batch"), b.rem(bh, self.hq, name="head"), m,
                            b.lt(index, items, name="valid"))

    def _range_function(self) -> FuncOp:
        """The KV walk of the item at `q_start`: for a band (first tile start, tile count,
        [full_lo, full_hi) the keys of tiles that need no mask); for a runtime block map
        (the item's row of the map, tile count, count of partial tiles, 0)."""
        op, b = self._function("range", [("q_start", i32), ("batch", i32), ("head", i32)])
        q_start = op.args[0]
        if self.spec.block_map is not None:
            assert self.q_len_arg.value is not None
            map_head: Value = op.args[2] if self.spec.block_map.per_head else 0
            map_heads = self.hq if self.spec.block_map.per_head else 1
            q_blocks = b.cdiv(self.q_len_arg.value, BLOCK_M, name="q_blocks")
            row = b.add(b.mul(b.add(b.mul(op.args[1], map_heads), map_head), q_blocks), b.div(q_start, BLOCK_M),
                        name="map_slot")
            partial, full = map_counts(b, self.map_args, row)
            return self._finish(op, b, row, b.add(partial, full, name="n_tiles"), partial, b.constant(0, i32))
        q_len, kv_len = self.q_len_arg.value, self.kv_len_arg.value
        assert q_len is not None and kv_len is not None
        plan, bn = self.online.plan, BLOCK_N
        lower, upper = plan.get_band()
        diag: Value = b.sub(kv_len, q_len, name="diag") if plan.is_bottom_right() else 0
        q_last = b.add(q_start, BLOCK_M - 1, name="q_last")
        lo: Value = 0
        full_lo: Value = 0
        hi: Value = kv_len
        full_hi: Value = kv_len
        if lower is not None:
            first = b.add(b.add(q_start, diag), int(lower), name="first_key")
            lo = b.mul(b.div(b.maximum(first, 0), bn), bn, name="kv_lo")
            last_first = b.maximum(b.add(b.add(q_last, diag), int(lower)), 0)
            full_lo = b.mul(b.div(b.add(last_first, bn - 1), bn), bn)
        if upper is not None:
            hi = b.minimum(kv_len, b.maximum(b.add(b.add(q_last, diag), int(upper) + 1), 0))
            full_hi = b.mul(b.div(b.maximum(b.add(b.add(q_start, diag), int(upper) + 1), 0), bn), bn)
        if lower is not None:
            hi = b.where(b.ge(first, kv_len), lo, hi, name="kv_hi")
        if not plan.is_exact():
            full_lo, full_hi = 0, 0
        hi_tiles = b.mul(b.div(b.add(hi, bn - 1), bn), bn, name="kv_hi_tiles")
        f0 = b.minimum(b.maximum(full_lo, lo), hi_tiles, name="full_lo")
        f1 = b.minimum(b.maximum(full_hi, f0), hi_tiles, name="full_hi")
        n_tiles = b.div(b.maximum(b.sub(hi_tiles, lo), 0), bn, name="n_tiles")
        lo_value = lo if isinstance(lo, SSAValue) else b.constant(lo, i32)
        return self._finish(op, b, lo_value, n_tiles, f0, f1)

    def _tile_function(self) -> FuncOp:
        """The `j`-th tile of a walk (`_range_function`'s four scalars): its first key and
        whether the plan's masks apply. A band goes from its last tile down to its
        first; a block map's row lists partial tiles, then full ones."""
        op, b = self._function("tile", [("j", i32), ("kv_lo", i32), ("n_tiles", i32), ("full_lo", i32),
                                        ("full_hi", i32)])
        j, kv_lo, n_tiles, full_lo, full_hi = op.args[:5]
        if self.spec.block_map is None:
            start = b.add(kv_lo, b.mul(b.sub(b.sub(n_tiles, 1), j), BLOCK_N), name="start")
            return self._finish(op, b, start, b.or_(b.lt(start, full_lo), b.ge(start, full_hi), name="masked"))
        # kv_lo is the map row, full_lo the count of its partial tiles
        block, masked = map_entry(b, self.map_args, kv_lo, j, full_lo, "kv_block")
        return self._finish(op, b, b.mul(block, BLOCK_N, name="start"), masked)

    def _q_function(self) -> FuncOp:
        op, b = self._function("q", [("rows", TensorType(i32, [ROWS])), ("batch", i32), ("head", i32)])
        rows, batch, head = op.args[:3]
        base = self.q_arg.base(b, batch, head)
        parts = load_parts(b, self.q_arg, base, rows, None, self.layout)
        if self.spec.q_transforms:
            q32 = {r: b.cast(t, f32) for r, t in parts.items()}
            row_ok = b.lt(rows, self.q_len_arg.value)  # type: ignore[arg-type]
            q32 = self.q_side.apply(b, q32, self.layout, rows, batch, row_ok)
            parts = {r: b.cast(t, self.dtype, name=f"q_{r}") for r, t in q32.items()}
        return self._finish(op, b, *(parts[p.role] for p in self.layout))

    def _k_function(self, chunk: int) -> FuncOp:
        """The K transforms on a chunk of `chunk` rows of a K tile, given and returned as
        the column parts of the K layout (in the input dtype); the rope's cos and sin
        (fp32) come from the caller, without the yarn factor, applied here."""
        leading: list[tuple[str, Attribute]] = [
            (f"k_{p.role}", TensorType(self.dtype, [chunk, p.width])) for p in self.k_layout]
        if self.k_rope is not None:
            width = self.k_layout[0].width
            leading += [("cos", TensorType(f32, [chunk, width])), ("sin", TensorType(f32, [chunk, width]))]
        leading += [("rows", TensorType(i32, [chunk])), ("batch", i32)]
        op, b = self._function("k", leading)
        n = len(self.k_layout)
        cos_sin: tuple[SSAValue, SSAValue] | None = None
        if self.k_rope is not None:
            cos, sin = op.args[n], op.args[n + 1]
            if self.k_rope.str_option("scaling") == "yarn":
                factor = yarn_attention_factor(RopeParams.of(self.k_rope))
                cos, sin = b.mul(cos, factor), b.mul(sin, factor)
            cos_sin = (cos, sin)
        if self.k_packed:
            assert cos_sin is not None
            a, bb = op.args[0], op.args[1]
            cos, sin = b.cast(cos_sin[0], self.dtype), b.cast(cos_sin[1], self.dtype)
            rot_a = b.sub(b.mul(a, cos), b.mul(bb, sin), name="rot_a")
            rot_b = b.add(b.mul(bb, cos), b.mul(a, sin), name="rot_b")
            return self._finish(op, b, rot_a, rot_b)
        parts = {p.role: b.cast(t, f32) for p, t in zip(self.k_layout, op.args)}
        rows, batch = op.args[len(leading) - 2], op.args[len(leading) - 1]
        parts = self.k_side.apply(b, parts, self.k_layout, rows, batch, None, cos_sin)
        return self._finish(op, b, *(b.cast(parts[p.role], self.dtype, name=f"k_{p.role}") for p in self.k_layout))

    def _k_angles_function(self, chunk: int) -> FuncOp:
        """cos and sin ([chunk, rotary_dim / 2] f32) of `pos * inv_freq` for positions
        `pos` ([chunk] i32) of the K rope."""
        op, b = self._function("k_angles", [("pos", TensorType(i32, [chunk]))])
        assert self.k_rope is not None
        freq_arg = self.k_side.freqs[self.spec.k_transforms.index(self.k_rope)]
        assert freq_arg.ptr is not None
        width = self.k_layout[0].width
        freq = b.load(freq_arg.ptr, b.mul(b.arange(0, width), freq_arg.strides[0]))
        angle = b.mul(b.expand_dims(b.cast(op.args[0], f32), 1), b.expand_dims(freq, 0), name="angle")
        return self._finish(op, b, b.cos(angle, name="cos"), b.sin(angle, name="sin"))

    def _producer(self, args: str) -> tuple[list[FuncOp], dict[str, object]]:
        """The producer partition: its device functions and template substitutions."""
        common = dict(k=self.name, group_k=self.hq // self.hk, group_v=self.hq // self.hv, stages=STAGES, args=args,
                      k_steps=steps_text("k_desc"), v_steps=steps_text("v_desc"), kv_steps=KV_STEPS)
        split = self.k_split
        plain_qk = "    return warpgroup_mma(q, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)"
        if not self.spec.k_transforms:
            return [], dict(producer=PRODUCER.substitute(common, range_fn=f"{self.name}_range", tile_fn=f"{self.name}_tile"),
                            producer_extra="", k_raw_init="", producer_warps=1,
                            consumer_regs=240, producer_regs=24, qk_body=plain_qk, k2_alloc="    k2_smem = k_smem")
        width = min(p.width for p in self.k_layout)
        tpw_col = min(width // K_VEC, 16)
        vec, tpw_row = width // tpw_col, 32 // tpw_col
        chunk = tpw_row * PRODUCER_WARPS
        functions = [self._k_function(chunk)]
        names = [f"k_{p.role}" for p in self.k_layout]
        pad = " " * 16
        rotation = setup = ""
        step: list[str] = []
        if self.k_rope is not None:
            functions.append(self._k_angles_function(chunk))
            angles = functions[-1].sym_name.data
            last_chunk = f"kv_lo + n_tiles * BN - CH + {self.k_rope.int_option('offset')} + chunk_rows"
            setup = (f"    step_cos, step_sin = {angles}(chunk_rows * 0 - CH, {args})\n"
                     f"    cos, sin = {angles}({last_chunk}, {args})")
            rotation = "cos, sin, "
            step = [f"{pad}cos, sin = cos * step_cos - sin * step_sin, sin * step_cos + cos * step_sin"]
        # a split K tile: part i is the whole of chunk / chunk2 (two allocations)
        views = (["chunk", "chunk2"] if split else
                 [f"chunk.slice({p.start}, {p.width}, dim=1)" for p in self.k_layout])
        lines = [f"{pad}{n} = {view}.load(k_layout)" for n, view in zip(names, views)]
        lines.append(f"{pad}{', '.join(names)} = {functions[0].sym_name.data}({', '.join(names)}, {rotation}rows, "
                     f"batch, {args})")
        lines += [f"{pad}{view}.store({n})" for n, view in zip(names, views)]
        lines += step
        text = TRANSFORMING_PRODUCER.substitute(
            common, range_fn=f"{self.name}_range", tile_fn=f"{self.name}_tile", k_vec=vec, k_tpw_row=tpw_row, k_tpw_col=tpw_col,
            k_setup=setup, k_transform="\n".join(lines), k_parts=2 if split else 1,
            k2_load=("            tma.async_copy_global_to_shared(k_desc, [k_row + start, k_col + k_desc.block_type.shape[1]], "
                     "k_raw.index(st), k2_smem.index(st))\n") if split else "")
        consumer_regs, producer_regs = TRANSFORMING_REGS
        init = (f"    k_raw = gl.allocate_shared_memory(gl.int64, [{STAGES}, 1], mbarrier.MBarrierLayout())\n"
                f"    for i in gl.static_range({STAGES}):\n        mbarrier.init(k_raw.index(i), count=1)")
        qk = plain_qk
        k2_alloc = "    k2_smem = k_smem"
        if split:
            qk = ("    HALF: gl.constexpr = k_smem.shape[2]\n"
                  "    tok = warpgroup_mma(q.slice(0, HALF, dim=1), k_smem.index(st).permute((1, 0)), zero_s, use_acc=False,\n"
                  "                        is_async=True)\n"
                  "    return warpgroup_mma(q.slice(HALF, HALF, dim=1), k2_smem.index(st).permute((1, 0)), tok, is_async=True)")
            k2_alloc = f"    k2_smem = gl.allocate_shared_memory(dtype, [{STAGES}, BN, D], k_desc.layout)"
        return functions, dict(producer=text, producer_extra="k_raw, k2_smem, ", k_raw_init=init,
                               producer_warps=PRODUCER_WARPS, consumer_regs=consumer_regs,
                               producer_regs=producer_regs, qk_body=qk, k2_alloc=k2_alloc)

    def _score_function(self, suffix: str, chain: ScoreChain, *, full_tile: bool, scaled: bool) -> FuncOp:
        """`chain` (with its planned masks unless `full_tile`) on a raw S tile when
        `scaled` (folding the scale through it, or multiplying by it first), else on the
        chain's own input units (the masks at the end of a chain)."""
        leading: list[tuple[str, Attribute]] = [
            ("s", TensorType(f32, [ROWS, BLOCK_N])), ("rows", TensorType(i32, [ROWS])),
            ("cols", TensorType(i32, [BLOCK_N])), ("start", i32), ("batch", i32), ("head", i32)]
        op, b = self._function(suffix, leading)
        s, rows, cols, start, batch, head = op.args[:6]
        q_len, kv_len = self.q_len_arg.value, self.kv_len_arg.value
        assert q_len is not None and kv_len is not None
        valid = b.and_(b.expand_dims(b.lt(rows, q_len), 1), b.expand_dims(b.lt(cols, kv_len), 0), name="valid")
        at = TileCoords(batch, head, rows, cols, q_len, kv_len, valid, kv_start=start)
        if scaled and self.fold:
            s, factor = chain.apply_scaled(b, s, self.scale, at, full_tile=full_tile)
            assert factor * LOG2E == self.qk_scale
            return self._finish(op, b, s)
        if scaled:
            s = b.mul(s, self.scale, name="s")
        return self._finish(op, b, chain.apply(b, s, at, full_tile=full_tile))

    def _score_step(self, call_args: str) -> tuple[list[FuncOp], list[str]]:
        """The score functions and the lines of the template's softmax step that call them.

        Planned masks that end the chain run only on the tiles that need them
        (`if masked: s = masks(s)`, after the rest of the chain on every tile); otherwise
        the chain runs in one of two versions, with or without the planned masks."""
        ops, planned = self.spec.program.score_ops, self.spec.planned_masks
        head = len(ops)
        while head > 0 and ops[head - 1] in planned:
            head -= 1
        functions: list[FuncOp] = []
        lines: list[str] = []
        masked = "    if masked:"
        if not any(op in planned for op in ops[:head]):
            if head > 0 or not self.fold:
                functions.append(self._score_function("score", self.chain, full_tile=True, scaled=True))
                lines.append(f"    s = {functions[-1].sym_name.data}({call_args})")
            if head < len(ops):
                tail = ScoreChain(ops[head:], self.sig, self.spec.host_table, planned)  # type: ignore[arg-type]
                functions.append(self._score_function("score_masks", tail, full_tile=False, scaled=False))
                lines += [masked, f"        s = {functions[-1].sym_name.data}({call_args})"]
            return functions, lines
        functions.append(self._score_function("score_masked", self.chain, full_tile=False, scaled=True))
        functions.append(self._score_function("score_full", self.chain, full_tile=True, scaled=True))
        lines += [masked, f"        s = {functions[0].sym_name.data}({call_args})",
                  "    else:", f"        s = {functions[1].sym_name.data}({call_args})"]
        return functions, lines

    # ------------------------------------------------------------------ kernel

    def build(self) -> list[Operation]:
        """The device functions, then the kernel."""
        functions = [self._range_function(), self._q_function(), self._tile_function()]
        arg_names = [n for n, _ in self._decls()]
        args = ", ".join(arg_names)
        cols = "start + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))"
        call_args = f"s, rows, {cols}, start, batch, head, {args}"
        score_functions, lines = self._score_step(call_args)
        functions += score_functions
        q_fn = functions[1].sym_name.data
        parts = [f"q_{p.role}" for p in self.layout]
        q_lines = [f"    {', '.join(parts)} = {q_fn}(q_rows, batch, head, {args})"]
        for part, var in zip(self.layout, parts):
            target = "q" if len(self.layout) == 1 else f"q.slice({part.start}, {part.width}, dim=1)"
            q_lines.append(f"    {target}.store(gl.convert_layout({var}, q_layout))")
        producer_functions, producer = self._producer(args)
        functions += producer_functions
        functions += [self._steps_function(), self._work_function()]
        lse = self.lse_arg.name
        # Q as the consumers transformed it, for the backward (`ForwardSpec.q_saved`), in
        # calls that keep it: a TMA store of the warpgroup's Q tile once it is in shared
        # memory, waited for before the epilogue writes O into that tile
        saved = self.save_q_arg is not None
        q_save = (f"    if {self.save_q_arg.name} != 0:\n"
                  f"        qs_row, qs_col = {self.name}_at(batch, head, {steps_text('qs_desc')})\n"
                  "        tma.async_copy_shared_to_global(qs_desc, [qs_row + q_start, qs_col], q)"
                  ) if self.save_q_arg is not None else ""
        text = TEMPLATE.substitute(
            producer,
            k=self.name, group_k=self.hq // self.hk, group_v=self.hq // self.hv, stages=STAGES,
            qk_scale=repr(self.qk_scale), args=args, kv_steps=KV_STEPS, o_steps=steps_text("o_desc"),
            range_fn=functions[0].sym_name.data, tile_fn=functions[2].sym_name.data, q_store="\n".join(q_lines),
            steps_fn=f"{self.name}_steps", work_fn=f"{self.name}_work",
            score_step="\n".join(lines) or "    pass",
            lse=lse, lse_s0=f"{lse}_stride0", lse_s1=f"{lse}_stride1", lse_s2=f"{lse}_stride2",
            consumer_extra=f"qs_desc, {steps_text('qs_desc')}, " if saved else "", q_save=q_save,
            q_save_wait="    tma.store_wait(pendings=0)" if saved else "",
        )
        d = self.head_dim
        descs: list[tuple[str, Attribute]] = [
            ("k_desc", TmaDescType(self.dtype, [BLOCK_N, d // 2 if self.k_split else d])), *descriptor_steps("k_desc"),
            ("v_desc", TmaDescType(self.dtype, [BLOCK_N, d])), *descriptor_steps("v_desc"),
            ("o_desc", TmaDescType(self.dtype, [ROWS, d])), *descriptor_steps("o_desc"),
            *([("qs_desc", TmaDescType(self.dtype, [ROWS, d])), *descriptor_steps("qs_desc")] if saved else [])]
        decls = descs + self._decls()
        kernel = KernelOp(
            self.name, [t for _, t in decls], num_warps=4, maxnreg=MAXNREG, launch=dict(self.spec.launch),
            callees=[f.sym_name.data for f in functions], template=text,
            writes=["o_desc", lse, *(["qs_desc"] if saved else [])])
        for arg, (arg_name, _) in zip(kernel.args, decls):
            arg.name_hint = arg_name
        return [*functions, kernel]


def lower_hopper_forward(spec: ForwardSpec, host: HostCode, name: str, one: SSAValue, *,
                         persistent: bool = True) -> tuple[SSAValue, list[Operation]] | None:
    """Build the Hopper kernel of `spec` and its guarded launch (`host.tma_ready` over
    Q, K, V, Out); returns (the guard, the ops), or None (with a debug log saying why)
    when the schedule cannot serve the program. `persistent`: a grid of at most one CTA
    per SM, each taking its share of the items in turn; else one CTA per item."""
    reason = ineligible_reason(spec)
    if reason is not None:
        logger.debug("@%s: Hopper forward schedule not used: %s", name, reason)
        return None
    hopper = HopperForward(spec, f"{name}_fwd_ws")
    ops = hopper.build()
    saved = [spec.q_saved[0]] if spec.q_saved is not None else []
    ok = host.emit(TmaReadyOp([spec.q, spec.k, spec.v, spec.out, *saved], arch=9, rows=BLOCK_M), "use_hopper")
    items = host.emit(arith.MuliOp(host.mul(spec.batch, hopper.hq, "ws_bh"), host.cdiv(spec.q_len, BLOCK_M, "ws_m")),
                      "ws_items")
    if persistent:
        # one CTA per SM: the kernel's shared memory (Q + the K/V ring) fills one
        items = host.emit(arith.MinSIOp(items, host.sm_count()), "ws_ctas")
    host.launch(hopper.name, [items, one, one], hopper.host_operands(), when=ok)
    return ok, ops


__all__ = ["BLOCK_M", "BLOCK_N", "HopperForward", "ineligible_reason", "lower_hopper_forward"]
