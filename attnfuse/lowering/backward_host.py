"""The host function of an attention program's backward, and its kernels (`lower-backward`).

`BackwardHost` builds `@f_backward`: the Q/K pre-kernels recomputed, the preprocess
(`delta`), the dQ and dK/dV kernels (`attnfuse.lowering.backward`) or, where it is built,
the Hopper schedule (`attnfuse.lowering.hopper_backward`) on a guarded path of its own,
the transposes of pre-kernel transforms, and the reductions of learnable operands'
gradients. The pass (`passes/lower_backward.py`) runs it per program.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import replace

from xdsl.dialects import arith, func
from xdsl.dialects.builtin import DYNAMIC_INDEX, ArrayAttr, IntegerAttr, TensorType, f32, i32, i64
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint

from attnfuse.analysis.bands import Band
from attnfuse.analysis.masks import effective_masks
from attnfuse.analysis.packing import packed_batch
from attnfuse.analysis.rope import rope_inverse_frequencies
from attnfuse.analysis.tile_plan import forward_stores_q, in_kernel_transforms, prekernel_transforms
from attnfuse.dialects.attn import BiasOp, OnlineSoftmaxOp, QKNormOp, RopeOp, TilePlanAttr
from attnfuse.dialects.host import DimOp
from attnfuse.lowering.backward import (
    BackwardSpec,
    DkvOptions,
    DqKernel,
    GradBuffers,
)
from attnfuse.lowering.backward_dkv import DkvKernel
from attnfuse.lowering.block_map import build_block_map
from attnfuse.lowering.forward import BlockMap, ForwardSpec
from attnfuse.lowering.hopper_backward import BLOCK_M as HOPPER_BLOCK_M
from attnfuse.lowering.hopper_backward import BLOCK_N as HOPPER_BLOCK_N
from attnfuse.lowering.hopper_backward import (
    HopperBackward,
    hopper_ready,
    lower_hopper_backward,
)
from attnfuse.lowering.hopper_backward import ineligible_reason as hopper_ineligible_reason
from attnfuse.lowering.host_code import HostCode
from attnfuse.lowering.preprocess import build_preprocess
from attnfuse.lowering.prekernel import ROWS_PER_PROGRAM, build_prekernel, build_prekernel_backward
from attnfuse.lowering.qk_side import partition, splittable
from attnfuse.lowering.rope_table import RopeTables
from attnfuse.lowering.varlen import PackedHost, PackedRows
from attnfuse.program import AttentionProgram, ProgramError


logger = logging.getLogger(__name__)


def _lse_type(out_type: Attribute) -> TensorType:
    assert isinstance(out_type, TensorType)
    return TensorType(f32, list(out_type.get_shape())[:3])


def _f32_like(ty: Attribute) -> TensorType:
    assert isinstance(ty, TensorType)
    return TensorType(f32, ty.get_shape())


class BackwardHost:
    """Builds one backward host function and its kernels.

    `given`: sides ("q", "k") whose argument holds the side already transformed, as the
    forward's pre-kernel left it (`saved_sides`): the function, named
    `<name>_backward_saved`, recomputes no pre-kernel for them."""

    def __init__(self, program: AttentionProgram, block_m: int, block_n: int, warps: int, stages: int,
                 rope_table: bool = True, transforms_in_kernel: bool = False,
                 dkdv: DkvOptions = DkvOptions(), rotate_in_epilogue: bool = True,
                 count_tiles: bool = False, fold_scale: bool = True, alibi_vectors: bool = True,
                 f32_dot: str = "ieee", hopper_backward: bool = False, hopper_block_map: bool = False,
                 grad_order: tuple[int, ...] = (0, 1, 2, 3), given: tuple[str, ...] = ()) -> None:
        self.program = program
        self.given = given
        self.grad_order = grad_order
        """The memory order of the dQ, dK and dV it returns (`lower-backward{grad-layout}`)."""
        self.kernels: list[Operation] = []
        online = program.online
        assert isinstance(online, OnlineSoftmaxOp)
        self.online = online
        fwd = program.func
        self.name = fwd.sym_name.data
        out_type = online.output.type
        lse_type = _lse_type(out_type)
        inputs = [a.type for a in fwd.args] + [out_type, lse_type, out_type, lse_type]
        self.block = Block(arg_types=inputs)
        names = [a.name_hint for a in fwd.args] + ["out", "lse", "d_out", "d_lse"]
        for arg, hint in zip(self.block.args, names):
            arg.name_hint = hint
        self.remap: dict[SSAValue, SSAValue] = dict(zip(fwd.args, self.block.args))
        self.host = HostCode(InsertPoint.at_end(self.block))
        self.block_m, self.block_n = block_m, block_n
        self.warps = warps
        self.stages = stages
        self.results: list[SSAValue] = []
        self.grad_of: list[int] = []
        self.rope_table = rope_table
        self.dkdv = dkdv
        self.tables: RopeTables | None = None
        self.rotate_in_epilogue = rotate_in_epilogue
        self.count_tiles = count_tiles
        self.fold_scale, self.alibi_vectors, self.f32_dot = fold_scale, alibi_vectors, f32_dot
        self.any_pre = bool(prekernel_transforms(program.q.transforms) or prekernel_transforms(program.k.transforms)) or (
            not transforms_in_kernel and bool(program.q.transforms or program.k.transforms))
        self.packed: PackedHost | None = None
        self.hopper_block_map = hopper_block_map
        self.hopper = hopper_backward and self._hopper_eligible()

    def _hopper_eligible(self) -> bool:
        p = self.program
        kernel_transforms = bool(self.in_kernel(p.q.transforms) or self.in_kernel(p.k.transforms))
        reason = hopper_ineligible_reason(p, kernel_transforms=kernel_transforms, packed=packed_batch(p) is not None,
                                          count_tiles=self.count_tiles, block_maps=self.hopper_block_map)
        if reason is not None:
            logger.debug("@%s: Hopper backward schedule not used: %s", self.name, reason)
        return reason is None

    def saved_sides(self) -> tuple[str, ...]:
        """Sides that the forward computes exactly as this backward's pre-kernel would
        recompute them, RoPE alone (its transpose needs no input): in a pre-kernel, or,
        for Q, in the forward kernel, which then stores the rotated tile too
        (`forward_stores_q`). The forward returns that tensor, the autograd formula
        saves it instead of the input, and `<name>_backward_saved` reads it. (The
        transpose of a QK-norm reads the input, so such sides are recomputed; K
        transformed in the kernel is transformed once per visiting Q tile, so it is
        recomputed too.)"""
        p = self.program
        sides = {"q": p.q.transforms, "k": p.k.transforms}
        kept = {"q": (prekernel_transforms(p.q.transforms) or (in_kernel_transforms(p.q.transforms)
                                                                if forward_stores_q(p) else [])),
                "k": prekernel_transforms(p.k.transforms)}
        return tuple(tag for tag, tf in sides.items()
                     if (pre := self.pre(tf)) and pre == kept[tag] and pre == list(tf)
                     and all(isinstance(t, RopeOp) for t in pre))

    def pre(self, transforms: list) -> list:
        """Transforms the backward recomputes in pre-kernels.

        All of them, whatever the forward's placement: the dK/dV kernel visits every Q
        tile once per KV block and the dQ kernel every K tile once per Q block, so
        transforming there would redo the work S / BLOCK times (measured 4.4x slower than
        pre-kernels for Llama-3-8B at S = 16384). `transforms-in-kernel=true` keeps the
        forward's in-kernel placements in the backward kernels too (no RoPE kernel runs
        in the backward of a `fused` program).
        """
        return list(transforms) if self.any_pre else prekernel_transforms(transforms)

    def in_kernel(self, transforms: list) -> list:
        return [] if self.any_pre else in_kernel_transforms(transforms)

    def arg(self, value: SSAValue) -> SSAValue:
        return self.remap[value]

    def inv_freq(self, rope: object) -> SSAValue:
        return self.host.table(rope_inverse_frequencies(rope))  # type: ignore[arg-type]

    def build(self) -> func.FuncOp:
        p, host = self.program, self.host
        args = self.block.args
        n = len(p.func.args)
        out, lse, d_out, d_lse = args[n : n + 4]
        q, k, v = args[p.q.arg_index], args[p.k.arg_index], args[p.v_arg]
        batch = host.emit(DimOp(q, 0), "batch")
        q_len, kv_len = host.emit(DimOp(q, 2), "q_len"), host.emit(DimOp(k, 2), "kv_len")
        one = host.const(1, "one")
        hq, hk, hv = p.heads
        if hk != hv:
            raise ProgramError(f"the backward needs K and V with the same number of heads (K {hk}, V {hv})", p.scores)
        tables = RopeTables(host, f"{self.name}_bwd", (q_len, kv_len), self.inv_freq, self.remap) \
            if self.rope_table else None
        self.tables = tables
        packing = packed_batch(p)
        if packing is not None:
            self.packed = PackedHost(host, f"{self.name}_bwd", self.arg(packing.cu_q), self.arg(packing.cu_k),
                                     q_len, kv_len)
        sides = {"q": (p.q, q, q_len), "k": (p.k, k, kv_len)}
        inputs: dict[str, SSAValue] = {}
        for tag, (side, source, seq) in sides.items():
            pre = self.pre(side.transforms)
            inputs[tag] = source
            if pre and tag not in self.given:
                assert isinstance(source.type, TensorType)
                target = host.alloc(source.type, {0: batch, 2: seq}, f"{tag}_transformed")
                name = f"{self.name}_bwd_{tag}_prologue"
                rows = self._rows(tag, ROWS_PER_PROGRAM, **{f"{tag}_rows": (source, target)})
                kernel, operands = build_prekernel(name, source, target, pre, batch, seq, self.inv_freq, {}, self.remap,
                                                   rope_table=tables, packed=rows)
                self._launch(name, kernel, operands, seq, ROWS_PER_PROGRAM, source, batch, rows)
                inputs[tag] = target

        delta = host.alloc(_lse_type(out.type), {0: batch, 2: q_len}, "delta")
        kernel, operands = build_preprocess(f"{self.name}_bwd_preprocess", out, d_out, d_lse, delta,
                                            batch, q_len, hq, self.block_m)
        self._launch(kernel.sym_name.data, kernel, operands, q_len, self.block_m, q, batch)

        # Programs per (batch, head) of the dQ and dK/dV kernels: blocks, or schedule slots.
        n_q = self.packed.schedule("q", self.block_m).slots if self.packed else host.cdiv(
            q_len, self.block_m, "n_q_blocks")
        n_kv = self.packed.schedule("k", self.block_n).slots if self.packed else host.cdiv(
            kv_len, self.block_n, "n_kv_blocks")
        grads = GradBuffers()
        plan = self.online.plan
        # The dQ kernel writes the bias gradient of every tile it visits: zeros are needed
        # only where the plan skips tiles.
        skips = plan.get_band() != (None, None) or plan.get_prefix() is not None or plan.has_runtime_block_map()
        for index, op in enumerate(p.score_ops):
            if isinstance(op, BiasOp) and op.kind_name == "tensor":
                full = TensorType(f32, [-1 if d < 0 else d for d in (-1, hq, -1, -1)])
                grads.bias[index] = host.alloc(_dyn(full), {0: batch, 2: q_len, 3: kv_len}, f"d_bias{index}",
                                               zero=skips)
            elif isinstance(op, BiasOp) and op.slopes is not None:
                grads.slopes[index] = host.alloc(_dyn(TensorType(f32, [-1, hq, -1])), {0: batch, 2: n_q}, f"d_slopes{index}")
        if self.online.sinks is not None:
            grads.sinks = host.alloc(_dyn(TensorType(f32, [-1, hq, -1])), {0: batch, 2: n_q}, "d_sinks")
        q_kernel_tf, k_kernel_tf = self.in_kernel(p.q.transforms), self.in_kernel(p.k.transforms)
        q_slots = host.emit(arith.MuliOp(host.mul(batch, hq, "q_bh"), n_q), "q_slots")
        k_slots = host.emit(arith.MuliOp(host.mul(batch, hk, "k_bh"), n_kv), "k_slots")
        head_dim = _dim(q.type, 3)
        for tf, store, slots in ((q_kernel_tf, grads.q_weights, q_slots), (k_kernel_tf, grads.k_weights, k_slots)):
            for i, op in enumerate(tf):
                if isinstance(op, QKNormOp) and op.weight is not None:
                    store[i] = host.alloc(_dyn(TensorType(f32, [-1, head_dim])), {0: slots}, f"d_norm_w_partial{i}")

        # dV is one buffer that either path writes; without the Hopper path, the Triton path
        # allocates it after its dQ and dK.
        d_v = host.alloc(v.type, {0: batch, 2: kv_len}, "d_v", order=self.grad_order) if self.hopper else None
        counter = host.alloc(TensorType(i32, [1]), {}, "tile_count", zero=True) if self.count_tiles else None
        has_map = self.online.plan.has_runtime_block_map()
        planned = set(effective_masks(p.score_ops)) if (self.online.plan.is_exact() or has_map) else set()

        # Two paths where the Hopper schedule is built, chosen per shape class: the Gluon
        # kernel adds dQ into an f32 buffer (zeroed unless the first adder of every tile
        # stores it) that transposes (or a cast) follow; the Triton dQ and dK/dV kernels keep
        # their own buffers and RoPE epilogues.
        paths: list[tuple[SSAValue, SSAValue, dict[int, SSAValue]]] = []
        use_hopper: SSAValue | None = None
        if self.hopper:
            use_hopper = hopper_ready(host, [inputs["q"], d_out, inputs["k"], v, lse, delta])
            assert d_v is not None
            with host.guarded(use_hopper):
                paths.append(self._hopper_path(inputs, q, k, v, d_out, lse, delta, d_v, batch, q_len, kv_len, one,
                                               planned))
        with host.guarded(use_hopper, unless=True) if use_hopper is not None else nullcontext():
            block_map = kv_block_map = None
            if has_map:  # the Triton kernels' maps, of their tiles
                block_map, kv_block_map = self._block_maps(inputs, batch, q_len, kv_len, one, f"{self.name}_bwd",
                                                           (self.block_m, self.block_n), self.dkdv.block_map)
            fwd_spec = ForwardSpec(
                program=p, q=inputs["q"], k=inputs["k"], v=v, out=out, lse=None, batch=batch, q_len=q_len,
                kv_len=kv_len, q_transforms=q_kernel_tf, k_transforms=k_kernel_tf, planned_masks=planned,
                inv_freq=self.inv_freq, host_table=host.table, block_map=block_map, tile_counter=counter,
                num_warps=self.warps, num_stages=self.stages, remap=self.remap,
                block_m=self.block_m, block_n=self.block_n, rope_table=tables,
                fold_scale=self.fold_scale, alibi_vectors=self.alibi_vectors, f32_dot=self.f32_dot,
            )
            triton_path, d_v = self._triton_path(fwd_spec, grads, kv_block_map, d_out, lse, delta, d_v, q, k, v,
                                                 batch, q_len, kv_len)
            paths.append(triton_path)
        d_q, d_k, side_weight_grads = paths[-1]
        if use_hopper is not None:
            (hq_, hk_, hw), (tq, tk, tw) = paths
            assert hw.keys() == tw.keys()
            d_q = host.select(use_hopper, hq_, tq, "d_q")
            d_k = host.select(use_hopper, hk_, tk, "d_k")
            side_weight_grads = {i: host.select(use_hopper, hw[i], tw[i], f"d_norm_w{i}") for i in hw}
        self._result(d_q, p.q.arg_index)
        self._result(d_k, p.k.arg_index)
        self._result(d_v, p.v_arg)
        self._learnable(grads, q_kernel_tf, k_kernel_tf, side_weight_grads)
        if tables is not None:
            self.kernels.extend(tables.kernels)
        if self.packed is not None:
            self.kernels.extend(self.packed.kernels)
        # The tile counter (`count-tiles`) is an extra result after the gradients.
        self.host.builder.insert(func.ReturnOp(*self.results, *([counter] if counter is not None else [])))
        bwd = func.FuncOp(
            f"{self.name}_backward_saved" if self.given else f"{self.name}_backward",
            func.FunctionType.from_lists(list(self.block.arg_types),
                                         [r.type for r in self.results] + ([counter.type] if counter is not None else [])),
            Region(self.block),
        )
        bwd.attributes["attnfuse.grad_of"] = ArrayAttr([IntegerAttr(i, i64) for i in self.grad_of])
        return bwd

    # ------------------------------------------------------------------ helpers

    def _block_maps(self, inputs: dict[str, SSAValue], batch: SSAValue, q_len: SSAValue, kv_len: SSAValue,
                    one: SSAValue, name: str, blocks: tuple[int, int], transposed: bool,
                    ranks: bool = False) -> tuple[BlockMap, BlockMap | None]:
        """The runtime block map of `blocks` tiles (with `ranks`) and, if `transposed`, its
        transpose, each built by a kernel launched here."""
        maps: list[BlockMap] = []
        for flip in (False, True) if transposed else (False,):
            built, kernel = build_block_map(self.program, self.host, inputs["q"], inputs["k"], batch, q_len, kv_len,
                                            one, name, remap=self.remap, blocks=blocks, transposed=flip,
                                            ranks=ranks and not flip)
            self.kernels.append(kernel)
            maps.append(built)
        return maps[0], maps[1] if transposed else None

    def _hopper_path(self, inputs: dict[str, SSAValue], q: SSAValue, k: SSAValue, v: SSAValue, d_out: SSAValue,
                     lse: SSAValue, delta: SSAValue, d_v: SSAValue, batch: SSAValue, q_len: SSAValue,
                     kv_len: SSAValue, one: SSAValue,
                     planned: set) -> tuple[SSAValue, SSAValue, dict[int, SSAValue]]:
        """(dQ, dK, norm weight gradients) of the Hopper schedule (inside its guard)."""
        p, host = self.program, self.host
        hq = p.heads[0]
        # dQ tiles no key block visits are never stored: zero them (a band that keeps a
        # key in every row has none; a runtime block map may)
        has_map = self.online.plan.has_runtime_block_map()
        d_q = self._grad_buffer("q", p.q.transforms, q, batch, q_len, False, accumulate=True,
                                zero=has_map or not _band(self.online.plan).keeps_a_key_per_row())
        maps: tuple[BlockMap, BlockMap] | None = None
        if has_map:  # the map the CTAs walk (transposed) and the one whose ranks order dQ
            ranked, walk = self._block_maps(inputs, batch, q_len, kv_len, one, f"{self.name}_bwd_ws",
                                            (HOPPER_BLOCK_N, HOPPER_BLOCK_N), True, ranks=True)
            assert walk is not None
            maps = (walk, ranked)
        k_epilogue = self._epilogue_ropes()["k"]
        d_k = self._grad_buffer("k", p.k.transforms, k, batch, kv_len, bool(k_epilogue))
        turns = host.alloc(TensorType(i32, [DYNAMIC_INDEX, hq, DYNAMIC_INDEX, 2]),
                           {0: batch, 2: host.cdiv(q_len, HOPPER_BLOCK_M, "q_tiles")}, "d_q_turns",
                           zero=True)
        hopper = HopperBackward(p, f"{self.name}_bwd_ws", q_len=q_len, kv_len=kv_len, dk=d_k, dv=d_v,
                                host_table=host.table, planned=planned, remap=self.remap, dq_turns=turns,
                                k_epilogue=k_epilogue, inv_freq=self.inv_freq, rope_table=self.tables, maps=maps)
        self.kernels.extend(lower_hopper_backward(hopper, host, batch=batch, q=inputs["q"], d_out=d_out,
                                                  k=inputs["k"], v=v, lse=lse, delta=delta, dq=d_q, one=one))
        weight_grads: dict[int, SSAValue] = {}
        through = self._through_prekernel("q", p.q.transforms, q, d_q, batch, q_len, weight_grads)
        # the f32 buffer the CTAs added into, as the input's dtype in the gradients' layout
        d_q = host.convert(d_q, _dyn(q.type), "d_q_hopper", order=self.grad_order) if through is d_q else through
        if not k_epilogue:
            d_k = self._through_prekernel("k", p.k.transforms, k, d_k, batch, kv_len, weight_grads)
        return d_q, d_k, weight_grads

    def _triton_path(self, fwd_spec: ForwardSpec, grads: GradBuffers, kv_block_map: SSAValue | None,
                     d_out: SSAValue, lse: SSAValue, delta: SSAValue, d_v: SSAValue | None, q: SSAValue, k: SSAValue,
                     v: SSAValue, batch: SSAValue, q_len: SSAValue,
                     kv_len: SSAValue) -> tuple[tuple[SSAValue, SSAValue, dict[int, SSAValue]], SSAValue]:
        """((dQ, dK, norm weight gradients), dV) of the Triton dQ and dK/dV kernels, which
        undo whole-width RoPE pre-kernels in their epilogues (`rotate-in-epilogue`); dV
        is allocated here unless given."""
        p = self.program
        epilogue = self._epilogue_ropes()
        d_q = self._grad_buffer("q", p.q.transforms, q, batch, q_len, bool(epilogue["q"]))
        d_k = self._grad_buffer("k", p.k.transforms, k, batch, kv_len, bool(epilogue["k"]))
        if d_v is None:
            d_v = self.host.alloc(v.type, {0: batch, 2: kv_len}, "d_v", order=self.grad_order)
        q_rows, k_rows = (fwd_spec.q, fwd_spec.out, lse, d_out, delta, d_q), (fwd_spec.k, fwd_spec.v, d_k, d_v)
        dq_rows = self._rows("q", self.block_m, q_rows, k_rows)
        spec = BackwardSpec(replace(fwd_spec, packed=dq_rows), d_out, lse, delta, d_q, d_k, d_v, grads, self.dkdv,
                            q_epilogue=epilogue["q"], k_epilogue=epilogue["k"], kv_block_map=kv_block_map)
        dq_kernel = DqKernel(spec, f"{self.name}_bwd_dq")
        self._launch(dq_kernel.name, dq_kernel.build(), dq_kernel.sig.host_operands(), q_len, self.block_m, q, batch,
                     dq_rows)
        dkv_rows = self._rows("k", self.block_n, q_rows, k_rows)
        dkv_kernel = DkvKernel(replace(spec, forward=replace(fwd_spec, packed=dkv_rows)), f"{self.name}_bwd_dkdv")
        self._launch(dkv_kernel.name, dkv_kernel.build(), dkv_kernel.base.sig.host_operands(), kv_len,
                     self.block_n, k, batch, dkv_rows)
        weight_grads: dict[int, SSAValue] = {}
        if not epilogue["q"]:
            d_q = self._through_prekernel("q", p.q.transforms, q, d_q, batch, q_len, weight_grads)
        if not epilogue["k"]:
            d_k = self._through_prekernel("k", p.k.transforms, k, d_k, batch, kv_len, weight_grads)
        return (d_q, d_k, weight_grads), d_v

    def _launch(self, name: str, kernel: Operation, operands: list[SSAValue], length: SSAValue,
                block: int, heads_of: SSAValue, batch: SSAValue, packed: PackedRows | None = None) -> None:
        """Launch over blocks of `length` (or the slots of `packed`'s schedule) x batch x
        heads (on the path of the host code's guard, if one is on)."""
        if kernel not in self.kernels:
            self.kernels.append(kernel)
        heads = _dim(heads_of.type, 1)
        blocks = packed.schedule.slots if packed is not None else self.host.cdiv(length, block, "grid_0")
        grid = [blocks, self.host.mul(batch, heads, "grid_1"), self.host.const(1, "one")]
        self.host.launch(name, grid, operands)

    def _rows(self, side: str, block: int, q_rows: tuple[SSAValue, ...] = (),
              k_rows: tuple[SSAValue, ...] = ()) -> PackedRows | None:
        """In a packed batch, the `PackedRows` of a kernel walking `side`'s sequences in
        blocks of `block`, reading `q_rows` (query tokens) and `k_rows` (key tokens)."""
        return self.packed.rows(side, block, q_rows, k_rows) if self.packed is not None else None

    def _epilogue_ropes(self) -> dict[str, list[RopeOp]]:
        """Per side, the pre-kernel RoPEs that the dQ / dK/dV kernels undo in their
        epilogue (`rotate-in-epilogue`): sides whose pre-kernel transforms are all RoPE
        over the whole head dim, each half a whole tile width (`splittable`), pairing the same columns
        as any rope the kernels apply themselves (their parts layout)."""
        sides = {"q": self.program.q.transforms, "k": self.program.k.transforms}
        head_dim = _dim(self.program.scores.q.type, 3)
        in_kernel = [t for tf in sides.values() for t in self.in_kernel(tf) if isinstance(t, RopeOp)]
        chosen: dict[str, list[RopeOp]] = {}
        for tag, tf in sides.items():
            ropes = self.pre(tf)
            usable = self.rotate_in_epilogue and ropes and all(
                isinstance(t, RopeOp) and splittable(t, head_dim) for t in ropes
            ) and len({partition(r, head_dim) for r in ropes + in_kernel}) == 1
            chosen[tag] = ropes if usable else []
        return chosen

    def _grad_buffer(self, tag: str, transforms: list, source: SSAValue, batch: SSAValue, seq: SSAValue,
                     final: bool, *, accumulate: bool = False, zero: bool = False) -> SSAValue:
        """The dQ / dK buffer of the main kernels: the gradient itself, or (when a transpose
        pre-kernel follows) an f32 gradient with respect to the transformed rows;
        `accumulate`: an f32 buffer that kernels add into, zeroed with `zero`."""
        rotated = bool(self.pre(transforms)) and not final
        ty = _f32_like(source.type) if rotated or accumulate else source.type
        name = f"d_{tag}_rotated" if rotated else f"d_{tag}_f32" if accumulate else f"d_{tag}"
        order = None if rotated or accumulate else self.grad_order  # f32 buffers are internal
        return self.host.alloc(_dyn(ty), {0: batch, 2: seq}, name, zero=zero, order=order)

    def _through_prekernel(self, tag: str, transforms: list, source: SSAValue, grad: SSAValue, batch: SSAValue,
                           seq: SSAValue, weight_grads: dict[int, SSAValue]) -> SSAValue:
        pre = self.pre(transforms)
        if not pre:
            return grad
        host = self.host
        heads, head_dim = _dim(source.type, 1), _dim(source.type, 3)
        n_blocks = self.packed.schedule(tag, ROWS_PER_PROGRAM).slots if self.packed else host.cdiv(
            seq, ROWS_PER_PROGRAM, f"{tag}_row_blocks")
        slots = host.emit(arith.MuliOp(host.mul(batch, heads, f"{tag}_pre_bh"), n_blocks), f"{tag}_pre_slots")
        partials = {i: host.alloc(_dyn(TensorType(f32, [-1, head_dim])), {0: slots}, f"d_{tag}_norm_w{i}")
                    for i, op in enumerate(pre) if isinstance(op, QKNormOp) and op.weight is not None}
        target = host.alloc(source.type, {0: batch, 2: seq}, f"d_{tag}", order=self.grad_order)
        name = f"{self.name}_bwd_{tag}_prologue_transpose"
        rows = self._rows(tag, ROWS_PER_PROGRAM, **{f"{tag}_rows": (source, grad, target)})
        kernel, operands = build_prekernel_backward(name, source, grad, target, pre, batch, seq, self.inv_freq,
                                                    partials, self.remap, rope_table=self.tables, packed=rows)
        # both guarded paths may need the same transpose: one kernel serves them
        built = next((k for k in self.kernels if getattr(k, "sym_name", None) == kernel.sym_name), None)
        if built is not None:
            assert built.is_structurally_equivalent(kernel), f"two different kernels named {name}"
            kernel = built
        self._launch(name, kernel, operands, seq, ROWS_PER_PROGRAM, source, batch, rows)
        for i, buffer in partials.items():
            weight = pre[i].weight
            assert isinstance(pre[i], QKNormOp) and weight is not None
            weight_grads[self.program.arg(weight)] = self._reduce(buffer, [0], self.arg(weight).type, "d_norm_w")
        return target

    def _reduce(self, buffer: SSAValue, dims: list[int], result: Attribute, name: str, *, keepdim: bool = False) -> SSAValue:
        summed = self.host.reduce_sum(buffer, dims, _f32_like(result), f"{name}_f32", keepdim=keepdim)
        return self.host.convert(summed, result, name)

    def _result(self, value: SSAValue, arg_index: int) -> None:
        if arg_index in self.grad_of:
            raise ProgramError("an operand used in two learnable places is not supported by the backward")
        self.results.append(value)
        self.grad_of.append(arg_index)

    def _learnable(self, grads: GradBuffers, q_tf: list, k_tf: list, side_weight_grads: dict[int, SSAValue]) -> None:
        p = self.program
        for tf, partials in ((q_tf, grads.q_weights), (k_tf, grads.k_weights)):
            for i, buffer in partials.items():
                weight = tf[i].weight
                self._result(self._reduce(buffer, [0], self.arg(weight).type, "d_norm_w"), p.arg(weight))
        for index, value in side_weight_grads.items():
            self._result(value, index)
        for index, buffer in grads.bias.items():
            op = p.score_ops[index]
            assert isinstance(op, BiasOp)
            bias = self.arg(op.bias[0])
            assert isinstance(bias.type, TensorType)
            dims = [i for i, d in enumerate(bias.type.get_shape()) if d == 1]
            summed = self.host.reduce_sum(buffer, dims, _f32_like(bias.type), "d_bias_f32", keepdim=True) if dims else buffer
            self._result(self.host.convert(summed, bias.type, "d_bias"), p.arg(op.bias[0]))
        for index, buffer in grads.slopes.items():
            op = p.score_ops[index]
            assert isinstance(op, BiasOp) and op.slopes is not None
            self._result(self._reduce(buffer, [0, 2], self.arg(op.slopes).type, "d_slopes"), p.arg(op.slopes))
        if grads.sinks is not None and self.online.sinks is not None:
            self._result(self._reduce(grads.sinks, [0, 2], self.arg(self.online.sinks).type, "d_sinks"),
                         p.arg(self.online.sinks))


def _band(plan: TilePlanAttr) -> Band:
    return Band(*plan.get_band(), plan.band_align.data)


def _dim(ty: Attribute, i: int) -> int:
    assert isinstance(ty, TensorType)
    return int(ty.get_shape()[i])


def _dyn(ty: TensorType) -> TensorType:
    """`ty` with -1 dims spelled as xDSL's dynamic marker."""
    return TensorType(ty.element_type, [DYNAMIC_INDEX if d < 0 else d for d in ty.get_shape()])


__all__ = ["BackwardHost"]
