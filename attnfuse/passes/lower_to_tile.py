"""`lower-to-tile`: attention programs -> `tile.kernel`s + host launch code.

Needs the decisions of the passes before it (`rope-fusion`, `online-softmax`,
`mask-tiling`). For each attention function it builds

* a pre-kernel per side whose transforms were placed in a `prekernel`,
* a block-map kernel when the tile plan asks for a runtime block map,
* the schedule kernels of a packed batch (see `attnfuse.lowering.varlen`),
* for a paged KV cache, kernels that gather K/V rows through its block table (see
  `attnfuse.lowering.paged`),
* the fused forward kernel (see `attnfuse.lowering.forward`),
* with a `#attn.split_kv` plan (`split-kv`), the split and combine kernels of decoding
  calls (see `attnfuse.lowering.split_kv`), and host code choosing per call,

and rewrites the function body into host code (`host.dim`, `host.alloc`,
`host.launch`) that the runtime executes. Constant tables (RoPE inverse frequencies,
ALiBi slopes) become `arith.constant` tensors of the host code.

```mlir
func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>, %v: tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xf16> {
  %b = host.dim %q[0] : tensor<?x8x?x64xf16>
  ...
  host.launch @f_fwd[%grid_m, %grid_bh, %one] (%q, %k, %v, %out, %b, %sq, %skv) : ...
  func.return %out : tensor<?x8x?x64xf16>
}
tile.kernel @f_fwd(...) { ... }
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    f32,
    i32,
    i64,
)
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint

from attnfuse.analysis.masks import effective_masks
from attnfuse.analysis.packing import packed_batch
from attnfuse.analysis.paging import cache_lengths, paged_cache
from attnfuse.analysis.rope import rope_inverse_frequencies
from attnfuse.analysis.tile_plan import (
    default_num_warps,
    forward_stores_q,
    in_kernel_transforms,
    prekernel_transforms,
    resolve_f32_dot,
)
from attnfuse.dialects.attn import MaskOp, OnlineSoftmaxOp, RopeOp
from attnfuse.dialects.host import TOP_LEFT_BAND, DimOp, KeepsResultsOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.lowering.host_code import LAYOUT_ORDERS, HostCode
from attnfuse.lowering.block_map import build_block_map
from attnfuse.lowering.forward import BlockMap, ForwardKernel, ForwardSpec
from attnfuse.lowering.hopper_forward import lower_hopper_forward
from attnfuse.lowering.paged import PagedKV
from attnfuse.lowering.prekernel import ROWS_PER_PROGRAM, build_prekernel
from attnfuse.lowering.rope_table import RopeTables
from attnfuse.lowering.simplify import simplify_kernels
from attnfuse.lowering.split_kv import decoding_calls, lower_split_kv
from attnfuse.lowering.tile_fit import SHARED_MEMORY_BUDGET, check_tile_rows, kv_stages
from attnfuse.lowering.varlen import PackedHost
from attnfuse.program import AttentionProgram, ProgramError, analyze, find_functions


def pipeline_stages(
    program: AttentionProgram, online: OnlineSoftmaxOp, *, k_in_kernel: bool = False, f32_dot: str = "ieee"
) -> int:
    """The deepest KV pipeline (`kv_stages`) whose tiles fit the shared-memory budget:
    the Q tile of `block-m` rows plus the K and V tiles of each stage, and two stages more
    for a paged cache's block-table loads. This is what Triton 3.6 allocates for the
    forward kernel (checked for every head dim and dtype by
    tests/lowering/test_shared_memory.py)."""
    q_type = program.scores.q.type
    assert isinstance(q_type, TensorType)
    return kv_stages(q_type, program.v_type, online.plan.block_m.data, online.plan.block_n.data, SHARED_MEMORY_BUDGET,
                     k_in_kernel=k_in_kernel, f32_dot=f32_dot, paged=program.scores.block_table is not None)


@dataclass(frozen=True)
class LowerToTilePass(ModulePass):
    """Build the kernels and the host launch code of every attention function."""

    name = "lower-to-tile"
    requires: ClassVar[tuple[str, ...]] = ("rope-fusion", "online-softmax", "mask-tiling")

    num_warps: int = 0
    """Warps per forward program; 0 picks 8 for 128-row blocks, else 4 (f32: 8 scores of
    the tile per thread, `default_num_warps`)."""
    num_stages: int = 0
    """Software-pipelining depth of the KV loop; 0 picks the deepest (<= 3) that fits
    the shared memory of a Hopper SM (see `pipeline_stages`)."""
    count_tiles: bool = False
    """Debug: count visited KV tiles in a buffer returned as an extra function result."""
    rope_table: bool = True
    """In-kernel RoPE reads cos/sin from a table built once per call (`rope_table.py`)
    instead of evaluating them on every tile; false is the ablation."""
    fold_scale: bool = True
    """Carry the scale through the score chain (masks, biases, softcaps) and apply it
    after the row max, in the exp2 multiply-add; false is the ablation."""
    alibi_vectors: bool = True
    """ALiBi's `slope * (kv - q)` as the difference of a per-key and a per-query vector
    (one subtraction per score); false converts `kv - q` per score (the ablation)."""
    f32_dot: str = ""
    """Precision of the dots of f32 programs: `tf32x3` (tensor cores, three TF32
    products: about fp32 accuracy; the default, `DEFAULT_F32_DOT`), `ieee` (FMA units,
    what flex_attention does with PyTorch's default matmul precision) or `tf32`. Set it
    on `mask-tiling` and `lower-backward` too (or through `PassManager(f32_dot=...)`,
    `attnfuse.compile(f32_dot=...)`, `attnfuse-opt --f32-dot`): their default tiles
    follow it."""
    hopper_forward: bool = True
    """Also build the warp-specialized Gluon forward (`lowering/hopper_forward.py`) for
    programs it serves; calls on compute capability 9.x devices whose shape class it
    serves run it, the others the Triton kernel. False is the ablation."""
    hopper_persistent: bool = True
    """The Hopper forward's grid has at most one CTA per SM, each taking its share of the
    work items (128 query rows of a (batch, head)) in turn, longest walk first, so that
    the next item's K/V loads overlap the current one's tail; false launches one CTA per
    item (the ablation)."""
    out_layout: str = "bhsd"
    """Memory layout of the output `[B, H, S, D]`: `bhsd` (contiguous) or `bshd` (stored
    as `[B, S, H, D]`, so `out.transpose(1, 2)` is contiguous: what Hugging Face models
    reshape into the output projection without a copy)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        f32_dot = resolve_f32_dot(self.name, self.f32_dot)  # an unknown precision fails before any lowering
        functions = find_functions(op)
        if not functions and any(o.name == "tile.kernel" for o in op.ops):
            raise ProgramError(
                f"{self.name} found no attn program: the module is already lowered "
                "(lower-backward must run before lower-to-tile)"
            )
        if self.out_layout not in LAYOUT_ORDERS:
            raise ValueError(f"{self.name}: out-layout must be one of {', '.join(LAYOUT_ORDERS)}, got {self.out_layout!r}")
        for function in functions:
            program = analyze(function)
            if program.online is None:
                raise ProgramError("lower-to-tile runs after online-softmax", program.scores)
            if program.online.tile_plan is None:
                raise ProgramError("lower-to-tile runs after mask-tiling", program.online)
            plan = program.online.tile_plan
            check_tile_rows(program, plan.block_m.data, plan.block_n.data, "mask-tiling{block-m block-n}")
            if plan.get_band()[1] is not None and not plan.is_bottom_right():
                # Top-left causal / window bands: with fewer queries than keys (decoding
                # against a cache) query i sees keys <= i, rarely what is meant; the
                # runtime warns once per shape class (`HostProgram.build`).
                program.func.attributes[TOP_LEFT_BAND] = ArrayAttr(
                    [IntegerAttr(program.q.arg_index, i64), IntegerAttr(program.k.arg_index, i64)])
            kernels = self._lower(program, f32_dot)
            for kernel in kernels:
                op.body.block.add_op(kernel)
            simplify_kernels(k for k in kernels if isinstance(k, KernelOp))

    def _lower(self, program: AttentionProgram, f32_dot: str) -> list[Operation]:
        function = program.func
        fname = function.sym_name.data
        args = function.args
        first = function.body.block.first_op
        assert first is not None
        host = HostCode(InsertPoint.before(first))
        q, k, v = args[program.q.arg_index], args[program.k.arg_index], args[program.v_arg]
        batch = host.emit(DimOp(q, 0), "batch")
        q_len = host.emit(DimOp(q, 2), "q_len")
        paging = paged_cache(program)
        lens = cache_lengths(program)
        paged: PagedKV | None = None
        if paging is None:
            kv_len = host.emit(DimOp(k, 2), "kv_len")
        else:  # the keys a block table row holds: a bound of every sequence's kv_lens
            table = args[program.arg(paging.block_table)]
            kv_len = host.mul(host.emit(DimOp(table, 1), "max_pages"), paging.page_size, "kv_len")
            paged = PagedKV(table, args[program.arg(paging.kv_lens)], host.emit(DimOp(k, 0), "num_pages"),
                            paging.page_size)
        one = host.const(1, "one")
        kernels: list[Operation] = []
        packing = packed_batch(program)
        packed = PackedHost(host, fname, args[program.arg(packing.cu_q)], args[program.arg(packing.cu_k)],
                            q_len, kv_len) if packing is not None else None

        def inv_freq(rope: RopeOp) -> SSAValue:
            return host.table(rope_inverse_frequencies(rope))

        tables = RopeTables(host, fname, (q_len, kv_len), inv_freq) if self.rope_table else None
        q_in, k_in = q, k
        for side, source, seq, tag in ((program.q, q, q_len, "q"), (program.k, k, kv_len, "k")):
            pre = prekernel_transforms(side.transforms)
            if not pre:
                continue
            assert isinstance(source.type, TensorType)
            target = host.alloc(source.type, {0: batch, 2: seq}, f"{tag}_transformed")
            name = f"{fname}_{tag}_prologue"
            rows = packed.rows(tag, ROWS_PER_PROGRAM, **{f"{tag}_rows": (source, target)}) if packed else None
            kernel, operands = build_prekernel(name, source, target, pre, batch, seq, inv_freq, {}, rope_table=tables,
                                               packed=rows)
            heads = source.type.get_shape()[1]
            grid_s = rows.schedule.slots if rows else host.cdiv(seq, ROWS_PER_PROGRAM, f"{tag}_grid_s")
            grid = [grid_s, host.mul(batch, heads, f"{tag}_grid_bh"), one]
            host.launch(name, grid, operands)
            kernels.append(kernel)
            if tag == "q":
                q_in = target
            else:
                k_in = target

        online = program.online
        assert isinstance(online, OnlineSoftmaxOp)
        block_m = online.plan.block_m.data
        hq = program.heads[0]
        out = host.alloc(online.output.type, {0: batch, 2: q_len}, "out", order=LAYOUT_ORDERS[self.out_layout])
        # The lse is always produced: the backward needs it and return_lse exposes it.
        assert isinstance(online.output.type, TensorType)
        out_shape = online.output.type.get_shape()
        lse_type = TensorType(f32, out_shape[:3])
        lse = host.alloc(lse_type, {0: batch, 2: q_len}, "lse")
        planned = set(effective_masks(program.score_ops)) if (
            online.plan.is_exact() or online.plan.has_runtime_block_map()
        ) else set()
        block_map: BlockMap | None = None
        if online.plan.has_runtime_block_map():
            block_map, map_kernel = build_block_map(program, host, q_in, k_in, batch, q_len, kv_len, one, fname)
            kernels.append(map_kernel)
        counter = host.alloc(TensorType(i32, [1]), {}, "tile_count", zero=True) if self.count_tiles else None
        # `attnfuse.saved`: the tensors the forward returns after out and lse for the
        # backward (`@f_backward_saved`), a side's pre-kernel output or, for Q rotated in
        # the forward kernel, a buffer that kernel stores it into.
        saved = function.attributes.get("attnfuse.saved")
        saved_args = [a.value.data for a in saved.data] if isinstance(saved, ArrayAttr) else []  # type: ignore[attr-defined]
        q_saved: tuple[SSAValue, SSAValue] | None = None
        if program.q.arg_index in saved_args and q_in is q:
            assert forward_stores_q(program) and in_kernel_transforms(program.q.transforms)
            assert isinstance(q.type, TensorType)
            # stored only by calls that keep it (not by eager inference, which drops it)
            q_saved = (host.alloc(q.type, {0: batch, 2: q_len}, "q_transformed"),
                       host.emit(KeepsResultsOp(), "keeps_results"))
        split_calls = decoding_calls(host, q_len, online.split_kv) if online.split_kv is not None else None
        spec = ForwardSpec(
            program=program, q=q_in, k=k_in, v=v, out=out, lse=lse, batch=batch, q_len=q_len,
            kv_len=kv_len, q_transforms=in_kernel_transforms(program.q.transforms),
            k_transforms=in_kernel_transforms(program.k.transforms), planned_masks=planned,
            inv_freq=inv_freq, host_table=host.table, block_map=block_map, tile_counter=counter,
            num_warps=self.num_warps or default_num_warps(program, block_m, online.plan.block_n.data, f32_dot),
            num_stages=self.num_stages or pipeline_stages(
                program, online, k_in_kernel=bool(in_kernel_transforms(program.k.transforms)), f32_dot=f32_dot),
            launch={"role": StringAttr("forward")}, rope_table=tables,
            rope_table_unless=None if split_calls is None else split_calls[1], fold_scale=self.fold_scale,
            packed=packed.rows("q", block_m, (q_in, out, lse), (k_in, v)) if packed else None,
            alibi_vectors=self.alibi_vectors, f32_dot=f32_dot, paged=paged,
            kv_lens=None if lens is None else args[program.arg(lens)], q_saved=q_saved,
        )
        hopper = lower_hopper_forward(spec, host, fname, one, persistent=self.hopper_persistent) if self.hopper_forward else None
        forward = ForwardKernel(spec, f"{fname}_fwd")
        kernels.append(forward.build())
        if hopper is not None:
            kernels.extend(hopper[1])
        if packed is not None:
            kernels.extend(packed.kernels)
        grid_m = spec.packed.schedule.slots if spec.packed else host.cdiv(q_len, block_m, "grid_m")
        if online.split_kv is not None:
            # Split-KV runs for Sq * group <= its rows, hopper-forward for Sq % 128 == 0:
            # never both in one shape class (and neither for packed batches).
            assert split_calls is not None
            split = lower_split_kv(host, spec, online.split_kv, fname, one, split_calls)
            kernels.extend(split.kernels)
            grid_m = split.unless_decoding(host, grid_m, "grid_m")
        if tables is not None:
            kernels.extend(tables.kernels)
        grid = [grid_m, host.mul(batch, hq, "grid_bh"), one]
        host.launch(f"{fname}_fwd", grid, forward.sig.host_operands(),
                    when=hopper[0] if hopper is not None else None, unless=hopper is not None)

        ret = function.body.block.last_op
        assert isinstance(ret, func.ReturnOp)
        # Host functions return (out, lse[, saved...][, tile_count]), whatever the program
        # returned: `saved`, the transformed sides that `lower-backward` asks for
        # (`attnfuse.saved`: the autograd formula keeps them for `@f_backward_saved`).
        transformed = {program.q.arg_index: q_saved[0] if q_saved else q_in, program.k.arg_index: k_in}
        kept = [transformed[a] for a in saved_args]
        assert all(t not in (q, k) for t in kept), "attnfuse.saved names a side the forward does not transform"
        results = [out, lse, *kept] + ([counter] if counter is not None else [])
        function.function_type = func.FunctionType.from_lists(
            function.function_type.inputs.data, [r.type for r in results]
        )
        new_ret = func.ReturnOp(*results)
        host.builder.insert(new_ret)
        # Everything after the new return is the attention program: drop it.
        dead: list[Operation] = []
        node = new_ret.next_op
        while node is not None:
            dead.append(node)
            node = node.next_op
        for old in reversed(dead):
            old.detach()
            old.erase(safe_erase=False)
        return kernels


__all__ = ["SHARED_MEMORY_BUDGET", "LowerToTilePass", "MaskOp"]
