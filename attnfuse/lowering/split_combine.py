"""The combine kernel of split-KV decoding: partial results merged by their log-sum-exp.

One program per (query, batch x head), grid `[Sq, B * H, 1]`. The split kernel
(`split_kv.py`) wrote, for each split `s`, the normalised fp32 output `out_s` and the
base-2 log-sum-exp `lse_s` of every query row to a workspace `[splits, slots, Dv]`
(`[splits, slots]` for the lse); this kernel merges them `COMBINE_SPLITS` at a time with
the online-softmax rescaling:

```text
m = max_s lse_s    w_s = 2^(lse_s - m)    out = sum_s w_s out_s / sum_s w_s
lse = (m + log2 sum_s w_s) * ln 2        (and at least every lse_s: +inf stays +inf)
```

Rows no split reached (`lse_s = -inf` everywhere) give 0 and `lse = -inf`.

`merge_in_kernel` is the same merge done inside a split kernel by its last program
(`split-kv{merge=true}`), for all heads of a GQA group at once.

```mlir
tile.kernel @f_split_kv_combine(%Opart: !tile.ptr<f32>, ..., %Sq: i32, %splits: i32) attributes {...} {
  %q = tile.program_id 0 : i32
  ...
  %m_1, %l_1, %top_1, %acc_1 = scf.for %s0 = %3 to %splits step %4 iter_args(...) -> (f32, f32, f32, tensor<128xf32>) : i32 {
```
"""

from __future__ import annotations

from xdsl.dialects.builtin import StringAttr, TensorType, f32
from xdsl.ir import Attribute, SSAValue

from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.lowering.forward import LN2, LOG2E, SINK_START_MAX
from attnfuse.lowering.qk_side import padded
from attnfuse.lowering.signature import KernelSignature, TensorArg

COMBINE_SPLITS = 16
"""Partial results the combine kernel merges per step."""

MERGE_ELEMENTS = 64 * 128
"""fp32 values of partial outputs the split program that finishes last loads to merge
them itself (`merge_in_kernel`): 16 splits of a Llama-3 group (4 heads of 128)."""


def build_combine(name: str, o_part: SSAValue, lse_part: SSAValue, out: SSAValue, lse: SSAValue,
                  q_len: SSAValue, splits: SSAValue, heads: int, v_dim: int) -> tuple[KernelOp, list[SSAValue]]:
    """The combine kernel (grid `[Sq, B * heads, 1]`) and its launch operands."""
    sig = KernelSignature()
    parts, part_lse = sig.tensor("Opart", o_part), sig.tensor("LSEpart", lse_part)
    o_arg, lse_arg = sig.tensor("Out", out), sig.tensor("LSE", lse)
    q_len_arg, splits_arg = sig.scalar("Sq", q_len), sig.scalar("splits", splits)
    b = sig.start(name, num_warps=4, num_stages=2, launch={"role": StringAttr("split_kv_combine")})
    n_q, n_splits = q_len_arg.value, splits_arg.value
    assert n_q is not None and n_splits is not None and parts.ptr is not None and part_lse.ptr is not None
    q = b.program_id(0, name="q")
    pid_bh = b.program_id(1, name="pid_bh")
    slot = b.add(b.mul(pid_bh, n_q), q, name="slot")
    dv_pad = padded(v_dim)
    d = b.arange(0, dv_pad, name="d")
    d_ok = b.lt(d, v_dim)
    state = _merge_start(b, dv_pad)
    with b.for_(0, n_splits, COMBINE_SPLITS, inits=state, iv_name="s0") as loop:
        s = b.add(loop.iv, b.arange(0, COMBINE_SPLITS), name="s")
        lse_s, o_s = _load_partials(b, parts, part_lse, s, b.lt(s, n_splits), slot, d, d_ok)
        loop.yield_(*_merge(b, list(loop.carried), lse_s, o_s))
    acc, l_safe, lse2 = _merge_end(b, list(loop.results))
    batch, head = b.div(pid_bh, heads, name="batch"), b.rem(pid_bh, heads, name="head")
    out_type = out.type
    assert isinstance(out_type, TensorType)
    o_offs = b.add(b.mul(q, o_arg.strides[2]), b.mul(d, o_arg.strides[3]))
    b.store(o_arg.base(b, batch, head), o_offs, b.cast(b.div(acc, l_safe), out_type.element_type), mask=d_ok)
    b.store(lse_arg.base(b, batch, head), b.mul(q, lse_arg.strides[2]), b.mul(lse2, LN2))
    return b.finish(), sig.host_operands()


def merge_slots_limit(group: int, v_dim: int) -> int:
    """The most workspace slots (rows per split) of a call whose splits a program merges
    itself: its tile offsets are i32 (64-bit offsets of the `[S * G, Dv]` tile spilled in
    gpt-oss's wide kernel), so the `merge_rows_limit` splits of the workspace stay below
    2**31 values."""
    return (2**31 - 1) // (merge_rows_limit(group, v_dim) * padded(v_dim))


def merge_rows_limit(group: int, v_dim: int) -> int:
    """The most splits whose partial results the last program of a group merges itself
    (`merge_in_kernel`): it loads them for the group's heads at once, at most
    `MERGE_ELEMENTS` fp32 values; 0 where not even two fit."""
    splits = MERGE_ELEMENTS // (_group_rows(group) * padded(v_dim))
    return splits if splits >= 2 else 0


def _group_rows(group: int) -> int:
    """Rows a GQA group of `group` heads takes in the merge tile: a power of two."""
    return 1 << (group - 1).bit_length()


def merge_in_kernel(b: TileBuilder, parts: TensorArg, part_lse: TensorArg, out: TensorArg, lse: TensorArg,
                    batch: SSAValue, kv_head: SSAValue, q_len: SSAValue, n_splits: SSAValue, *, group: int,
                    heads: int, v_dim: int, out_type: Attribute) -> None:
    """The combine of one (batch, KV head) by the split program that finished last:
    for each query, the partial results of every split (`merge_rows_limit(group,
    v_dim)` of them at most; the host launches the combine kernel instead beyond that)
    for all `group` heads that share the KV head, in one `[S * G, Dv]` tile (row
    `s * G + g`: split `s` of head `g`, `G` = `group` padded to a power of two), merged
    as the combine kernel merges them (reductions over the splits of a `[S, G]` view of
    the weights and a `[S, G * Dv]` view of the weighted outputs) and written to `out`
    and `lse`."""
    dv_pad = padded(v_dim)
    g_pad = _group_rows(group)
    limit = merge_rows_limit(group, v_dim)
    i = b.arange(0, limit * g_pad, name="part")
    s, g = b.div(i, g_pad, name="s"), b.rem(i, g_pad, name="g")
    ok = b.and_(b.lt(s, n_splits), b.lt(g, group), name="part_ok")
    d = b.arange(0, dv_pad, name="d")
    d_ok = b.lt(d, v_dim)
    g_rows = b.arange(0, g_pad, name="g_rows")
    heads_of_group = b.add(b.mul(kv_head, group), g_rows, name="heads_of_group")
    g_ok = b.lt(g_rows, group)
    with b.for_(0, q_len, 1, iv_name="q") as loop:
        slot = b.add(b.mul(b.add(b.mul(batch, heads), b.add(b.mul(kv_head, group), g)), q_len), loop.iv, name="slot")
        lse_s, o_s = _load_partials(b, parts, part_lse, s, ok, slot, d, d_ok, narrow=True)
        x = b.reshape(b.minimum(lse_s, SINK_START_MAX * LOG2E), (limit, g_pad))
        m = b.reduce_max(x, 0, name="m")
        m_safe = b.where(b.eq(m, float("-inf")), 0.0, m)
        w = b.exp2(b.sub(x, b.expand_dims(m_safe, 0)), name="w")
        l = b.reduce_sum(w, 0, name="l")
        weighted = b.mul(o_s, b.expand_dims(b.reshape(w, (limit * g_pad,)), 1))
        acc = b.reshape(b.reduce_sum(b.reshape(weighted, (limit, g_pad * dv_pad)), 0), (g_pad, dv_pad), name="acc")
        top = b.reduce_max(b.reshape(lse_s, (limit, g_pad)), 0)
        acc, l_safe, lse2 = _merge_end(b, [m, l, top, acc])
        o_offs = b.add(b.expand_dims(b.mul(b.to_i64(heads_of_group), b.to_i64(out.strides[1])), 1),
                       b.expand_dims(b.to_i64(b.add(b.mul(loop.iv, out.strides[2]), b.mul(d, out.strides[3]))), 0))
        b.store(out.base(b, batch), o_offs, b.cast(b.div(acc, b.expand_dims(l_safe, 1)), out_type),
                mask=b.and_(b.expand_dims(g_ok, 1), b.expand_dims(d_ok, 0)))
        lse_offs = b.add(b.mul(b.to_i64(heads_of_group), b.to_i64(lse.strides[1])),
                         b.to_i64(b.mul(loop.iv, lse.strides[2])))
        b.store(lse.base(b, batch), lse_offs, b.mul(lse2, LN2), mask=g_ok)


def _load_partials(b: TileBuilder, parts: TensorArg, part_lse: TensorArg, s: SSAValue, s_ok: SSAValue,
                   slot: SSAValue, d: SSAValue, d_ok: SSAValue, *, narrow: bool = False) -> tuple[SSAValue, SSAValue]:
    """The base-2 lse `[S]` and the output `[S, Dv]` of workspace row `slot` in splits `s`
    (`narrow`: i32 offsets, for a workspace of fewer than 2**31 values)."""
    assert parts.ptr is not None and part_lse.ptr is not None
    lse_offs = _split_offsets(b, part_lse, s, slot, narrow)
    lse_s = b.load(part_lse.ptr, lse_offs, mask=s_ok, other=float("-inf"), name="lse_s")
    offs = b.add(b.expand_dims(_split_offsets(b, parts, s, slot, narrow), 1), b.expand_dims(b.mul(d, parts.strides[2]), 0))
    o_s = b.load(parts.ptr, offs, mask=b.and_(b.expand_dims(s_ok, 1), b.expand_dims(d_ok, 0)), other=0.0, name="o_s")
    return lse_s, o_s


def _merge_start(b: TileBuilder, dv_pad: int) -> list[SSAValue]:
    """(m, l, top, acc) before any split."""
    return [b.constant(float("-inf"), f32, name="m"), b.constant(0.0, f32, name="l"),
            b.constant(float("-inf"), f32, name="top"), b.zeros((dv_pad,), f32, name="acc")]


def _merge(b: TileBuilder, state: list[SSAValue], lse_s: SSAValue, o_s: SSAValue) -> list[SSAValue]:
    """(m, l, top, acc) after merging the splits `lse_s` `[S]`, `o_s` `[S, Dv]` in."""
    m, l, top, acc = state
    x = b.minimum(lse_s, SINK_START_MAX * LOG2E)  # a +inf sink's split merges as a huge finite weight
    m_new = b.maximum(m, b.reduce_max(x, 0), name="m_new")
    m_safe = b.where(b.eq(m_new, float("-inf")), 0.0, m_new)
    alpha = b.exp2(b.sub(m, m_safe), name="alpha")
    w = b.exp2(b.sub(x, m_safe), name="w")
    l_new = b.add(b.mul(l, alpha), b.reduce_sum(w, 0), name="l_new")
    acc_new = b.add(b.mul(acc, alpha), b.reduce_sum(b.mul(b.expand_dims(w, 1), o_s), 0), name="acc_new")
    return [m_new, l_new, b.maximum(top, b.reduce_max(lse_s, 0)), acc_new]


def _merge_end(b: TileBuilder, state: list[SSAValue]) -> tuple[SSAValue, SSAValue, SSAValue]:
    """(acc, its divisor, the base-2 lse) of a merged row; 0 and -inf where no split reached it."""
    m, l, top, acc = state
    l_safe = b.where(b.eq(l, 0.0), 1.0, l)
    m_safe = b.where(b.eq(m, float("-inf")), 0.0, m)
    lse2 = b.where(b.eq(l, 0.0), float("-inf"), b.add(m_safe, b.log2(l_safe)))
    return acc, l_safe, b.maximum(lse2, top, name="lse2")  # exactly >= every partial lse; +inf stays +inf


def _split_offsets(b: TileBuilder, arg: TensorArg, splits: SSAValue, slot: SSAValue, narrow: bool) -> SSAValue:
    """Offsets of row `slot` of each split in a [splits, slots, ...] workspace: i64, or
    i32 where `narrow`."""
    if narrow:
        return b.add(b.mul(splits, arg.strides[0]), b.mul(slot, arg.strides[1]))
    return b.add(b.mul(b.to_i64(splits), b.to_i64(arg.strides[0])), b.to_i64(b.mul(slot, arg.strides[1])))


__all__ = ["COMBINE_SPLITS", "MERGE_ELEMENTS", "build_combine", "merge_in_kernel", "merge_rows_limit",
           "merge_slots_limit"]
