"""Host code of the split-KV path: how many splits a call takes, and which split kernel.

`split_count` emits the split count of a `#attn.split_kv` plan (fixed, or `auto` from
the SM count, the programs per split and the KV blocks visited); `tier_taken` the
condition under which a call takes one of the split kernels `lower_split_kv` builds
(the wide, short and small tiers; the full tile takes the rest).

```mlir
%splits_by_sms = arith.divsi %target_programs, %programs : i32
%small_tile = arith.andi %fits_16_rows, %one_wave : i1
```
"""

from __future__ import annotations

from xdsl.dialects import arith
from xdsl.ir import SSAValue

from attnfuse.analysis.split_kv import WIDE_MIN_BLOCKS
from attnfuse.dialects.attn_split_kv import SplitKVAttr
from attnfuse.lowering.forward import ForwardSpec
from attnfuse.lowering.host_code import HostCode

LONG_SPLIT_BLOCKS = 256
"""KV blocks (16384 keys at 64 per block) a split keeps when `auto` doubles its programs
per SM: the H200 ran B = 16, Skv = 32768 at 0.98x SDPA with two splits and 0.95-0.96x
with one, B = 16, Skv = 131072 at 0.99x with two (run 27) and 0.95x with one (run 30),
while at B = 1 16 splits beat 32 and at B = 16, Skv <= 8192 one split beats two (run 30).
Those were the 64-key kernels; calls the wide kernel can take keep to one wave."""


SHORT_SPLIT_BLOCKS = 8
"""KV blocks an SM walks (waves of split programs x blocks per split) up to which a
paged program's calls take the short split kernel (one masked loop, three stages
instead of five: no pipeline to fill). On the H200 (Sq = 1, 16-row tiles, CUDA graphs)
against the band's loops at five stages with the same splits, one wave: 1 block per
split 11.53 -> 7.78 us, 8 blocks 20.53 -> 18.33, 16 blocks 29.05 -> 37.80, 32 blocks
52.93 -> 72.74 (run 35, call B); 2 blocks 9.98 -> 7.94 (run 36, call E); two waves
(against the 64-row tile): 2 blocks 13.1 -> 11.1, 4 blocks 16.7 -> 15.1, 8 blocks 27.3
-> 29.8 (run 36, call F)."""


PERSISTENT_PROGRAMS_PER_SM = 2
"""Programs per SM of the persistent split kernel (its pipeline one stage short of the
whole SM's): measured at B = 64, Skv = 1024 (H200, Sq = 1, hand-written kernels of its
tiles, CUDA graphs): two programs per SM at two stages 65.2 us, one at three 66.2, three
at two 68.9, against 68.1 for one program per pair at three stages (session 41)."""

PERSISTENT_MIN_PROGRAMS_PER_SM = 2
"""Split programs per SM beyond which a call takes the persistent kernel."""

PERSISTENT_MAX_BLOCKS = 16
"""KV blocks (of the plan's `block_n` keys) a pair may walk in the persistent kernel:
what it saves, a pipeline prologue and epilogue per pair and a partial last wave, counts
for short caches. The hand-written kernels (session 41) gained at Skv = 1024 (B = 64:
65.2 us against 67.6 for the wide kernel, B = 128 125.2 against 127.8), 0.7% at 2048
(B = 64, at four stages one program per SM) and lost at 4096 (B = 64: the wide kernel's
242.2 us was the fastest)."""


def split_count(host: HostCode, spec: ForwardSpec, plan: SplitKVAttr,
                 wide_fits: SSAValue | None) -> tuple[SSAValue, SSAValue]:
    """Host code of the split count: the plan's fixed count, or `auto`: as many splits as
    keep the `B * Hkv` programs of each split within `waves` programs per SM (rounding
    down: a partly filled last wave would take as long as a full one), each split at
    least `min_blocks` KV blocks; or, where that is more, two programs per SM (the split
    kernel's shared memory is sized for two) with every split at least
    `LONG_SPLIT_BLOCKS` blocks (long streams gain from a second program per SM more than
    they lose to the combine), except for calls that the wide kernel can take
    (`wide_fits`: its rows fit; it owns an SM's shared memory, so one wave of it walks
    as many bytes at once as two programs of the 64-key kernel: at B = 16, Sq = 1, one
    split in the wide kernel took 474.6 us at Skv = 32768 against 486.8 in two, 1880.0
    at 131072 against 1910.9; H200, CUDA graphs, run 39 call A); or, where that is
    more, one program per SM with at least
    one block each (`min_blocks` never leaves SMs idle: a paged B = 1, Skv = 1024 call
    took 6.8 us in 16 splits of one block against 7.9 in 8 of two, run 36 call G);
    always at least 1 and at most the KV blocks visited, and rounded so that no split
    is empty. Returns (splits, KV blocks per split)."""
    blocks = host.emit(arith.MaxSIOp(host.cdiv(_visited_keys(host, spec), plan.block_n.data, "kv_blocks_visited"),
                                     host.const(1)), "kv_blocks")
    if plan.is_auto():
        programs = host.emit(arith.MaxSIOp(host.mul(spec.batch, spec.program.heads[1], "programs_per_split"),
                                           host.const(1)), "programs")
        per_sm = host.mul(host.sm_count(), plan.waves.data, "target_programs")
        by_sms = host.emit(arith.DivSIOp(per_sm, programs), "splits_by_sms")
        by_work = host.cdiv(blocks, plan.min_blocks.data, "splits_by_work")
        one_wave = host.emit(arith.MinSIOp(by_sms, by_work), "splits_one_wave")
        two_per_sm = host.mul(host.sm_count(), 2, "two_per_sm")
        by_two_per_sm = host.emit(arith.DivSIOp(two_per_sm, programs), "splits_two_per_sm")
        long_splits = host.emit(arith.DivSIOp(blocks, host.const(LONG_SPLIT_BLOCKS)), "splits_long")
        two_waves = host.emit(arith.MinSIOp(by_two_per_sm, long_splits), "splits_two_waves")
        if wide_fits is not None:
            two_waves = host.emit(arith.SelectOp(wide_fits, host.const(0), two_waves), "splits_two_waves_narrow")
        by_one_per_sm = host.emit(arith.DivSIOp(host.sm_count(), programs), "splits_one_per_sm")
        fill = host.emit(arith.MinSIOp(by_one_per_sm, blocks), "splits_fill")
        wanted = host.emit(arith.MaxSIOp(host.emit(arith.MaxSIOp(one_wave, two_waves)), fill), "splits_most")
        wanted = host.emit(arith.MaxSIOp(wanted, host.const(1)), "splits_wanted")
    else:
        wanted = host.emit(arith.MinSIOp(host.const(plan.splits.data), blocks), "splits_wanted")
    per_split = host.emit(arith.CeilDivSIOp(blocks, wanted), "blocks_per_split")
    return host.emit(arith.CeilDivSIOp(blocks, per_split), "splits"), per_split


def _visited_keys(host: HostCode, spec: ForwardSpec) -> SSAValue:
    """Keys the packed tile's band can reach: `min(Skv, Sq + upper - lower)` for a band
    bounded on both sides (a sliding window) and no prefix, else `Skv`."""
    online = spec.program.online
    assert online is not None
    lower, upper = online.plan.get_band()
    if lower is None or upper is None or online.plan.get_prefix() is not None:
        return spec.kv_len
    reach = host.emit(arith.AddiOp(spec.q_len, host.const(upper - lower)), "band_keys")
    return host.emit(arith.MinSIOp(spec.kv_len, reach), "visited_keys")


def tier_taken(host: HostCode, suffix: str, fits: SSAValue, whole_sm: bool, short: bool,
               waves: tuple[SSAValue, SSAValue], blocks_per_split: SSAValue) -> SSAValue | None:
    """Whether a call takes the split kernel `suffix` (None: the full tile, which has no
    condition of its own). Calls whose packed rows fit the small tile and whose programs
    fit one wave take it (latency-bound); the rest the full one, whose larger
    shared-memory footprint fits two programs per SM in whole waves (run 30: the 16-row
    tile lost 10% at B = 64). Calls whose splits walk at least `WIDE_MIN_BLOCKS` blocks
    take the wide tile in one wave, and also with more programs than two per SM, where
    the full tile runs several waves too (H200, Llama-3-8B, Sq = 1, CUDA graphs, one
    split: B = 40, Skv = 1024 46.5 us against 53.2; B = 48, Skv = 4096 183.3 against
    200.3; B = 64, Skv = 1024 67.5 against 68.6; B = 128, Skv = 1024 127.8 against
    130.2; but B = 24, 1024 30.5 against 28.7 and B = 32, 1024 36.1 against 35.8, whose
    full-tile programs fit one wave; run 40, call E). A paged program's calls whose SMs
    each walk at most `SHORT_SPLIT_BLOCKS` blocks (waves x blocks per split) take the
    short kernel. `fits`: whether the call's packed rows fit the kernel's tile; `waves`:
    (split programs, whether they fit one wave)."""
    if not suffix:
        return None
    programs, one_wave = waves
    if short:
        split_waves = host.emit(arith.CeilDivSIOp(programs, host.sm_count()), "split_waves")
        per_sm = host.emit(arith.MuliOp(split_waves, blocks_per_split), "blocks_per_sm")
        few = host.emit(arith.CmpiOp(per_sm, host.const(SHORT_SPLIT_BLOCKS), "sle"), "few_blocks")
        return host.emit(arith.AndIOp(fits, few), "short_split")
    if not whole_sm:
        return host.emit(arith.AndIOp(fits, one_wave), f"{suffix}_tile")
    pairs = host.mul(host.sm_count(), 2, "programs_two_per_sm")
    many = host.emit(arith.CmpiOp(programs, pairs, "sgt"), "beyond_two_per_sm")
    taken = host.emit(arith.AndIOp(fits, host.emit(arith.OrIOp(one_wave, many), "wide_waves")), f"{suffix}_tile")
    long = host.emit(arith.CmpiOp(blocks_per_split, host.const(WIDE_MIN_BLOCKS), "sge"), "long_splits")
    return host.emit(arith.AndIOp(taken, long), f"{suffix}_split")


def persistent_taken(host: HostCode, fits: SSAValue, splits: SSAValue, programs: SSAValue,
                     blocks_per_split: SSAValue) -> tuple[SSAValue, SSAValue]:
    """(whether a call takes the persistent split kernel, its programs). It takes calls
    of one split whose packed rows fit its tile (`fits`), whose split programs are more
    than `PERSISTENT_MIN_PROGRAMS_PER_SM` per SM and which walk at least
    `WIDE_MIN_BLOCKS` and at most `PERSISTENT_MAX_BLOCKS` blocks; it runs
    `PERSISTENT_PROGRAMS_PER_SM` programs per SM (at most one per (batch, KV head)
    pair), each walking its share of the pairs."""
    one = host.emit(arith.CmpiOp(splits, host.const(1), "eq"), "one_split")
    least = host.mul(host.sm_count(), PERSISTENT_MIN_PROGRAMS_PER_SM, "persistent_min_programs")
    many = host.emit(arith.CmpiOp(programs, least, "sgt"), "many_programs")
    long = host.emit(arith.CmpiOp(blocks_per_split, host.const(WIDE_MIN_BLOCKS), "sge"), "long_pairs")
    short = host.emit(arith.CmpiOp(blocks_per_split, host.const(PERSISTENT_MAX_BLOCKS), "sle"), "short_pairs")
    walk = host.emit(arith.AndIOp(long, short), "persistent_walk")
    many_short = host.emit(arith.AndIOp(many, walk))
    taken = host.emit(arith.AndIOp(host.emit(arith.AndIOp(fits, one)), many_short), "persistent_split")
    resident = host.mul(host.sm_count(), PERSISTENT_PROGRAMS_PER_SM, "persistent_resident")
    return taken, host.emit(arith.MinSIOp(programs, resident), "persistent_programs")


__all__ = ["LONG_SPLIT_BLOCKS", "PERSISTENT_MAX_BLOCKS", "PERSISTENT_MIN_PROGRAMS_PER_SM", "PERSISTENT_PROGRAMS_PER_SM",
           "SHORT_SPLIT_BLOCKS", "persistent_taken", "split_count", "tier_taken"]
