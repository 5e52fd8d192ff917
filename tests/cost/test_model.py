"""The cost model's algebra: units, limits, monotonicity, crossover consistency."""

from __future__ import annotations

import dataclasses

import pytest

from attnfuse import examples
from attnfuse.analysis.tile_plan import default_block_sizes
from attnfuse.cost import model
from attnfuse.cost.model import AttentionShape, added_work, crossover, crossover_closed_form, predict, visited_kv_rows
from attnfuse.cost.program_shape import shape_of
from attnfuse.cost.target import TARGETS, get_target
from attnfuse.program import analyze, find_functions
from attnfuse.reference import parse_program
from attnfuse.testing import with_dtype

H200 = get_target("h200")
LLAMA = AttentionShape(batch=4, q_heads=32, kv_heads=8, seq_len=4096, head_dim=128)


def at(shape: AttentionShape, **changes: object) -> AttentionShape:
    return dataclasses.replace(shape, **changes)


def test_visited_rows_match_the_tile_plan() -> None:
    full = at(LLAMA, causal=False, seq_len=1024)
    assert visited_kv_rows(full) == 8 * 1024  # 8 q blocks x all keys
    causal = at(LLAMA, seq_len=1024)
    assert visited_kv_rows(causal) == 128 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8)  # halved, plus the diagonal
    window = at(LLAMA, seq_len=1024, window=255)
    assert visited_kv_rows(window) == 128 * (1 + 2 + 3) + 5 * 384  # at most 3 tiles per q block
    assert visited_kv_rows(at(causal, block_n=64)) == visited_kv_rows(causal)


def test_added_work_counts_bytes_and_rotations() -> None:
    n_head = LLAMA.batch * LLAMA.seq_len * LLAMA.head_dim  # elements of one head
    assert added_work(LLAMA, "separate") == model.Work(0, 2 * 2 * n_head * 40, 2)
    assert added_work(LLAMA, "hybrid") == model.Work(32 * n_head, 2 * 2 * n_head * 8, 1)
    fused = added_work(LLAMA, "fused")
    assert fused.prekernel_bytes == 0 and fused.launches == 0
    fused_tiles = at(LLAMA, block_m=LLAMA.fused_block_m, block_n=LLAMA.fused_block_n)
    assert fused.rotated_elements == 32 * n_head + LLAMA.batch * 32 * visited_kv_rows(fused_tiles) * 128
    packed = added_work(at(LLAMA, gqa_pack=4), "fused")
    assert packed.rotated_elements - 32 * n_head == (fused.rotated_elements - 32 * n_head) // 4


def test_qk_norm_moves_with_the_rope() -> None:
    """A QK-norm adds in-kernel work wherever its side's RoPE runs in the kernel (Q once
    in hybrid and fused, K per visit in fused) and nothing in a pre-kernel (the same
    pre-kernel reads and writes the row once)."""
    normed = at(LLAMA, q_norm=True, k_norm=True)
    n_head = LLAMA.batch * LLAMA.seq_len * LLAMA.head_dim
    assert added_work(normed, "separate") == added_work(LLAMA, "separate")
    assert added_work(normed, "hybrid") == model.Work(32 * n_head, 2 * 2 * n_head * 8, 1, 32 * n_head)
    fused = added_work(normed, "fused")
    assert fused.normed_elements == fused.rotated_elements
    assert added_work(at(LLAMA, k_norm=True), "fused").normed_elements == fused.rotated_elements - 32 * n_head
    extra = {p: predict(normed, H200, p).extra - predict(LLAMA, H200, p).extra for p in model.PLACEMENTS}
    assert extra["separate"] == 0 < extra["hybrid"] < extra["fused"]
    norm = model.norm_seconds(H200, 128)
    assert norm == pytest.approx(model.NORM_FLOPS / H200.vector_f32_flops + 1 / (128 * H200.sfu_ops))
    assert extra["hybrid"] == pytest.approx(LLAMA.constants.rotation_exposure * norm * 32 * n_head)


@pytest.mark.parametrize("other", ["hybrid", "separate"])
@pytest.mark.parametrize("norms", [(True, True), (False, True), (True, False)])
def test_crossover_with_qk_norm(other: str, norms: tuple[bool, bool]) -> None:
    """The closed form with QK-norms (c_q, c_k) agrees with the bisection on predict, and
    a K norm pulls the crossover down (fused's K visits cost more)."""
    shape = at(LLAMA, kv_heads=32, q_norm=norms[0], k_norm=norms[1])
    target = get_target("l4")  # a GPU on which fused wins at short S without GQA
    s_star = crossover_closed_form(shape, target, other)
    found = crossover(shape, target, "fused", other)
    assert s_star >= shape.fused_block_m and found is not None and found - shape.fused_block_m < s_star <= found
    if norms[1]:
        assert s_star < crossover_closed_form(at(shape, k_norm=False), target, other)


def test_units_scale_with_work() -> None:
    """Seconds: doubling the batch doubles every added time but the launches."""
    for p in model.PLACEMENTS:
        one, two = predict(LLAMA, H200, p), predict(at(LLAMA, batch=8), H200, p)
        launches = added_work(LLAMA, p).launches * model.LAUNCH_S
        assert two.extra - launches == pytest.approx(2 * (one.extra - launches))
        assert two.attention == pytest.approx(2 * one.attention)
    # the attention floor: causal FLOPs (whole tiles) at the measured 790 TFLOP/s
    flops = 4 * 4 * 32 * 128 * visited_kv_rows(LLAMA) * 128
    assert predict(LLAMA, H200, "hybrid").attention == pytest.approx(flops / 790e12)


def test_limits() -> None:
    """Infinite bandwidth: pre-kernels cost only launches; infinite vector/shared/L2
    rates: in-kernel rotation is free (what is left is the kernel's drag and fused's
    taller tiles, both matmul time), and with an infinite matmul rate too fused wins."""
    fast_mem = dataclasses.replace(H200, measured_hbm_bw=float("inf"))
    assert predict(LLAMA, fast_mem, "separate").prekernels == pytest.approx(2 * model.LAUNCH_S)
    fast_alu = dataclasses.replace(H200, vector_f32_flops=float("inf"), smem_bw=float("inf"), l2_bw=float("inf"))
    fused = predict(LLAMA, fast_alu, "fused")
    assert fused.in_kernel_rotation == pytest.approx(model.TRITON.q_drag * fused.attention)
    assert fused.extra == pytest.approx(fused.in_kernel_rotation + fused.tiles) and fused.tiles > 0
    fast_alu = dataclasses.replace(fast_alu, measured_tensor_flops=float("inf"))
    assert predict(LLAMA, fast_alu, "fused").extra == 0.0
    assert model.choose(LLAMA, fast_alu) == "fused"
    assert model.choose(LLAMA, fast_mem) != "fused"


def test_monotonic_in_s_bandwidth_and_group() -> None:
    seqs = [256, 512, 1024, 2048, 4096, 8192, 16384]
    fused = [predict(at(LLAMA, seq_len=s), H200, "fused").extra for s in seqs]
    assert fused == sorted(fused) and len(set(fused)) == len(fused)
    # fused's gap to hybrid grows with S (tokens fixed), pre-kernels' shrink with bandwidth
    gaps = [model.extra_at_tokens(LLAMA, H200, "fused", s) - model.extra_at_tokens(LLAMA, H200, "hybrid", s) for s in seqs]
    assert gaps == sorted(gaps)
    pre = [predict(LLAMA, dataclasses.replace(H200, measured_hbm_bw=bw), "separate").prekernels for bw in (1e12, 2e12, 4e12)]
    assert pre == sorted(pre, reverse=True)
    # a larger GQA group (fewer KV heads) makes the K pre-kernel cheaper: the crossover falls
    # (to -inf, fused winning nowhere, at groups 4 and 8 on the Triton kernel)
    crossings = [crossover_closed_form(at(LLAMA, kv_heads=32 // g), H200) for g in (1, 2, 4, 8)]
    assert crossings == sorted(crossings, reverse=True) and crossings[0] > 256 > crossings[1]
    # fused's q block: a shorter one re-rotates K more often, a taller one computes more
    # of the causal diagonal (tile_exposure): 256 beats both 128 and 512 without GQA
    g1 = at(LLAMA, kv_heads=32)
    by_block = {bm: crossover_closed_form(at(g1, fused_block_m=bm), H200) for bm in (128, 256, 512)}
    assert by_block[128] < by_block[256] and by_block[512] < by_block[256]


@pytest.mark.parametrize("name", sorted(TARGETS))
@pytest.mark.parametrize("other", ["hybrid", "separate"])
@pytest.mark.parametrize("group", [1, 4])
def test_crossover_consistency(name: str, other: str, group: int) -> None:
    """The closed form and the bisection on `predict` agree: the bisection lands on the
    first multiple of fused's q block at or above S* (None when S* is below one block:
    fused loses at every S), on the Triton kernel and, where the target has it, the
    Gluon one (its pipeline fill and K/V slack)."""
    target = TARGETS[name]
    shapes = [at(LLAMA, kv_heads=32 // group)]
    if target.warp_specialized:
        shapes.append(at(shapes[0], hopper=True, fused_block_m=128, fused_block_n=128))
    for shape in shapes:
        s_star = crossover_closed_form(shape, target, other)
        found, bm = crossover(shape, target, "fused", other), shape.fused_block_m
        if s_star < bm:
            assert found is None
        else:
            assert found is not None and found - bm < s_star <= found
            if found > bm:  # fused still wins one block earlier
                fused_before, other_before = (model.extra_at_tokens(shape, target, p, found - bm)
                                              for p in ("fused", other))
                assert fused_before < other_before


def test_crossover_closed_form_terms() -> None:
    """The closed form at group 1 on the H200 from its terms by hand: the Gluon forward's
    K rotation shows only past the K/V stream's slack, Q's transforms cancel."""
    shape = at(LLAMA, kv_heads=32, hopper=True, fused_block_m=128, fused_block_n=128)
    k, rot, n_d = model.HOPPER, model.rotation_seconds(H200), shape.batch * shape.seq_len * shape.head_dim
    pre = 2 * 32 * 2 / (k.prekernel_efficiency * H200.bandwidth()) + model.LAUNCH_S / n_d
    fill = k.fill_exposure * rot * 32 * 128 / 128
    slack = k.kv_slack * 2 * 32 * 2 / H200.bandwidth()
    x = (pre - fill + k.k_exposure * slack) / (k.k_exposure * rot * 32 / 2)
    assert crossover_closed_form(shape, H200) == pytest.approx(128 * (x - 1), rel=1e-12)
    # measured on the H200 sweep (run 30, S <= 1024 re-timed from CUDA graphs): 893
    assert 0.75 * 893 < crossover_closed_form(shape, H200) < 1.25 * 893


def test_crossover_absent_when_fused_never_loses() -> None:
    """A window bounds the keys each q block visits: fused's cost stops growing."""
    free = dataclasses.replace(H200, vector_f32_flops=float("inf"), smem_bw=float("inf"), l2_bw=float("inf"))
    assert crossover(LLAMA, free) is None
    with pytest.raises(ValueError, match="causal masks without a window"):
        crossover_closed_form(at(LLAMA, window=1024), H200)


def test_shape_checks() -> None:
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        AttentionShape(batch=1, q_heads=32, kv_heads=6, seq_len=128, head_dim=128)
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        at(LLAMA, seq_len=0)
    with pytest.raises(ValueError, match="placement must be one of"):
        predict(LLAMA, H200, "inline")


@pytest.mark.parametrize(("target", "dtype", "hopper"), [("h200", "bf16", True), ("h100", "f16", True),
                                                         ("h200", "f32", False), ("rtx3090", "bf16", False),
                                                         ("b200", "bf16", False)])
def test_shape_of_picks_the_forward_kernel(target: str, dtype: str, hopper: bool) -> None:
    """A warp-specialized target (sm_90) runs a bf16 / f16 program with head dim 128 on
    the Gluon forward: its constants and 128 x 128 fused K visits; others the Triton
    kernel's (the tiles mask-tiling gives a kernel that transforms K)."""
    text = with_dtype(examples.path("llama3").read_text(), dtype)
    program = analyze(find_functions(parse_program(text))[0])
    shape = shape_of(program, 2048, target=get_target(target))
    assert shape.hopper is hopper
    assert shape.constants is (model.HOPPER if hopper else model.TRITON)
    tiles = model.HOPPER_FUSED_TILES if hopper else default_block_sizes(program, k_in_kernel=True)
    assert (shape.fused_block_m, shape.fused_block_n) == tuple(tiles)
    assert shape_of(program, 2048).hopper is False  # no target: the Triton kernel


def test_shape_of_knows_the_gluon_forward_needs_whole_tiles() -> None:
    """The Gluon forward's TMA tiles need S to be a multiple of 128 (`host.tma_ready`):
    at S = 320 and 448 an H200 runs the Triton kernels, with their fused tiles."""
    program = analyze(find_functions(parse_program(examples.path("llama3").read_text()))[0])
    for seq_len, hopper in ((256, True), (320, False), (384, True), (448, False), (65536, True)):
        shape = shape_of(program, seq_len, target=H200)
        assert shape.hopper is hopper, seq_len
        tiles = model.HOPPER_FUSED_TILES if hopper else default_block_sizes(program, k_in_kernel=True)
        assert (shape.fused_block_m, shape.fused_block_n) == tuple(tiles)


def test_shape_of_reads_the_qk_norms() -> None:
    for name, norms in (("qwen3", (True, True)), ("llama3", (False, False))):
        program = analyze(find_functions(parse_program(examples.path(name).read_text()))[0])
        shape = shape_of(program, 4096)
        assert (shape.q_norm, shape.k_norm) == norms


def test_backward_recomputes_the_sides_the_forward_did_not_save() -> None:
    """The backward's transform work per placement: dQ and dK rotated back (every
    placement); `fused` recomputes K (a K pre-kernel and a launch), `hybrid` and `fused`
    have the forward kernel write the rotated Q (one write of Q, a store stream of the
    kernel's, not pre-kernel bytes); a QK-normed side is recomputed whatever the
    placement; without saved sides (before run 23) the three are equal."""
    per_head = 2 * LLAMA.batch * LLAMA.seq_len * LLAMA.head_dim * LLAMA.elem_bytes
    post = per_head * (32 + 8)
    work = {p: model.backward_work(LLAMA, p) for p in model.PLACEMENTS}
    assert (work["separate"].prekernel_bytes, work["separate"].launches) == (post, 2)
    assert (work["hybrid"].prekernel_bytes, work["hybrid"].launches) == (post, 2)
    assert (work["fused"].prekernel_bytes, work["fused"].launches) == (post + per_head * 8, 3)
    q_write = LLAMA.batch * 32 * LLAMA.seq_len * LLAMA.head_dim * LLAMA.elem_bytes
    assert [work[p].kernel_store_bytes for p in model.PLACEMENTS] == [q_write, q_write, 0]
    normed = {p: model.backward_work(at(LLAMA, q_norm=True, k_norm=True), p) for p in model.PLACEMENTS}
    assert len({(w.prekernel_bytes, w.launches) for w in normed.values()}) == 1
    old = {p: model.backward_work(LLAMA, p, saved_sides=False) for p in model.PLACEMENTS}
    assert len({(w.prekernel_bytes, w.launches) for w in old.values()}) == 1
    # the backward's difference is what predict adds on top of the forward's
    for p in model.PLACEMENTS:
        both, fwd = predict(LLAMA, H200, p, backward=True), predict(LLAMA, H200, p)
        bw = LLAMA.constants.prekernel_efficiency * H200.bandwidth()
        stored = model.KERNEL_STORE_EXPOSURE * work[p].kernel_store_bytes / H200.bandwidth()
        assert both.backward_transforms == pytest.approx(
            work[p].prekernel_bytes / bw + work[p].launches * model.LAUNCH_S + stored)
        assert both.extra == pytest.approx(fwd.extra)


def test_k_and_q_exposures_and_the_q_drag() -> None:
    """On the Gluon kernel K's rotation and norm have their own exposures (the producer
    rotates K beside the matmuls), Q keeps `rotation_exposure`; the Triton kernel above
    head dim 128 adds `q_drag` x the attention floor to the placements that transform Q
    in the kernel, and nothing at head dim 128."""
    gluon = at(LLAMA, hopper=True, fused_block_m=128, fused_block_n=128, k_norm=True)
    work = added_work(gluon, "fused")
    q_side, k_rot, k_norm = work.in_kernel_seconds(H200, gluon)
    hopper = model.HOPPER
    slack = hopper.kv_slack * work.kv_stream_bytes / H200.bandwidth()
    fill = hopper.fill_exposure * work.fill_seconds(H200, gluon)
    assert predict(gluon, H200, "fused").in_kernel_rotation == pytest.approx(
        hopper.rotation_exposure * q_side + hopper.k_exposure * (k_rot - slack) + hopper.k_norm * k_norm + fill)
    assert hopper.k_exposure != hopper.rotation_exposure and k_rot > slack > 0 and k_norm > 0 and fill > 0
    # each (batch, head, q block) work item's first K tile: 4 x 32 x 32 items of 128 x 128
    assert work.k_fill_elements == 4 * 32 * 32 * 128 * 128 and work.kv_stream_bytes == 2 * 4 * 8 * 4096 * 128 * 2
    wide = at(LLAMA, head_dim=256)
    assert wide.constants is model.TRITON_WIDE and LLAMA.constants is model.TRITON
    for shape in (wide, LLAMA):
        for p in model.PLACEMENTS:
            dragged = predict(shape, H200, p)
            undragged = model.TRITON.rotation_exposure * sum(added_work(shape, p).in_kernel_seconds(H200, shape))
            drag = shape.constants.q_drag * dragged.attention if p != "separate" else 0.0
            assert dragged.in_kernel_rotation == pytest.approx(undragged + drag)
    assert model.TRITON_WIDE.q_drag > 5 * model.TRITON.q_drag > 0.0 == model.HOPPER.q_drag


def test_tile_exposure_charges_fused_taller_tiles() -> None:
    """`fused` on the Triton kernel has 256-row q blocks against the others' 128: the
    causal diagonal and a ragged last block cost it whole-tile FLOPs the others do not
    compute, at `tile_exposure` x the matmul rate's time (at whole tiles 2 Hq (256 - 128)
    FLOPs per token and head-dim column: constant per token); the Gluon forward has the
    same 128 x 128 tiles in every placement, so nothing."""
    rate = H200.matmul_flops("bf16")
    tokens = LLAMA.batch * LLAMA.seq_len
    assert predict(LLAMA, H200, "fused").tiles == pytest.approx(
        model.TRITON.tile_exposure * 2 * 32 * (256 - 128) * tokens * 128 / rate)
    assert predict(LLAMA, H200, "hybrid").tiles == predict(LLAMA, H200, "separate").tiles == 0.0
    ragged = at(LLAMA, seq_len=320, batch=51)  # 256 + 64 rows: the second q block is 3/4 padding
    whole = at(LLAMA, seq_len=256, batch=64)
    per_token = [predict(s, H200, "fused").tiles / (s.batch * s.seq_len) for s in (ragged, whole)]
    assert per_token[0] > 1.5 * per_token[1]
    gluon = at(LLAMA, hopper=True, fused_block_m=128, fused_block_n=128)
    assert predict(gluon, H200, "fused").tiles == 0.0
