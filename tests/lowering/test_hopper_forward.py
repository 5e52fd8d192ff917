"""lower-to-tile{hopper-forward}: which programs get the warp-specialized Gluon forward,
what the lowered IR holds, that the Gluon kernels compile for sm_90a (no spills,
shared memory under the limit, wgmma / TMA / setmaxnreg in the PTX), and that CPU calls
and shape classes the kernel does not serve keep running the Triton kernel.

The Gluon kernels cannot run in Triton's interpreter: tests/gpu/test_hopper_forward_gpu.py
checks their results on a GPU.
"""

from __future__ import annotations


import logging
from typing import Any, Callable




import pytest
import torch
from hopper_programs import ELIGIBLE, INELIGIBLE, pipeline, sm90_resources
from programs import Builder


import attnfuse
from attnfuse.backends.gluon.emitter import emit_function
from attnfuse.backends.gluon.sm90 import SHARED_MEMORY_LIMIT
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects import tile_hopper as th
from attnfuse.dialects.host import LaunchOp, TmaReadyOp
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.dialects.tile_compute import ConvertOp
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.runtime.build import NOT_DENSE, tma_unready_reason
from attnfuse.runtime.launch import tma_view
from xdsl.dialects.builtin import ModuleOp, TensorType, f32
from xdsl.utils.exceptions import VerifyException


def lower(text: str, pipe: str) -> ModuleOp:
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, text, "<test>")
    PassManager(pipe).run(module, ctx, locations=locations)
    return module


def ops_of(module: ModuleOp, kind: type) -> list:
    return [op for op in module.walk() if isinstance(op, kind)]


@pytest.mark.parametrize("name", sorted(ELIGIBLE))
def test_eligible_program_gets_the_hopper_kernel(name: str) -> None:
    text, pipe = ELIGIBLE[name]
    module = lower(text, pipe)
    (kernel,) = ops_of(module, th.KernelOp)
    functions = {f.sym_name.data for f in ops_of(module, th.FuncOp)}
    assert {c.root_reference.data for c in kernel.callees.data} == functions
    # K, V, O (and the saved Q) first, each followed by its (rows, columns) step per leading dim
    descs = [i for i, t in enumerate(kernel.arg_types) if isinstance(t, th.TmaDescType)]
    assert descs[:3] == [0, 5, 10] and descs == list(range(0, 5 * len(descs), 5))
    names = [a.name_hint for a in kernel.args]
    for i in descs:
        assert names[i + 1:i + 5] == [f"{names[i]}_stride_{axis}{n}" for n in range(2) for axis in "rc"]
    (ready,) = ops_of(module, TmaReadyOp)
    forward = [op for op in ops_of(module, LaunchOp) if op.cond is not None]
    # the Gluon launch when the shape class is served, the Triton kernel otherwise
    assert [(op.kernel.root_reference.data, op.unless is not None) for op in forward] == [
        (kernel.sym_name.data, False), (kernel.sym_name.data.removesuffix("_ws"), True)]
    assert all(op.cond is ready.result for op in forward)


@pytest.mark.parametrize("name", sorted(INELIGIBLE))
def test_ineligible_program_keeps_the_triton_kernel(name: str, caplog: pytest.LogCaptureFixture) -> None:
    text, pipe, reason = INELIGIBLE[name]
    with caplog.at_level(logging.DEBUG, logger="attnfuse.lowering.hopper_forward"):
        module = lower(text, pipe)
    assert not ops_of(module, th.KernelOp) and not ops_of(module, TmaReadyOp)
    assert all(op.cond is None for op in ops_of(module, LaunchOp))
    assert "Hopper forward schedule not used: " in caplog.text and reason in caplog.text


def test_ablation_builds_no_hopper_kernel() -> None:
    text, _ = ELIGIBLE["llama3"]
    module = lower(text, pipeline(hopper=False))
    assert not ops_of(module, th.KernelOp) and not ops_of(module, th.FuncOp)
    assert all(op.cond is None and op.unless is None for op in ops_of(module, LaunchOp))


def test_planned_masks_run_on_masked_tiles_only() -> None:
    """Softcap then planned masks (causal, window): every tile runs the softcap, the
    tiles at the band's edges also the masks."""
    module = lower(*ELIGIBLE["gemma2_like"])
    names = [f.sym_name.data for f in ops_of(module, th.FuncOp)]
    assert names == ["gemma2_like_fwd_ws_range", "gemma2_like_fwd_ws_q", "gemma2_like_fwd_ws_tile",
                     "gemma2_like_fwd_ws_score", "gemma2_like_fwd_ws_score_masks", "gemma2_like_fwd_ws_steps",
                     "gemma2_like_fwd_ws_work"]
    (kernel,) = ops_of(module, th.KernelOp)
    assert "    s = gemma2_like_fwd_ws_score(s, rows" in kernel.template.data
    assert "    if masked:\n        s = gemma2_like_fwd_ws_score_masks(" in kernel.template.data


def test_planned_mask_inside_the_chain_gives_two_versions() -> None:
    """ALiBi after the causal mask: masked and full tiles run different chains."""
    b = Builder("mask_first", hq=4, hkv=2, d=64, dtype="bf16")
    b.mask("causal").alibi()
    module = lower(b.build().text, pipeline("fused"))
    names = [f.sym_name.data for f in ops_of(module, th.FuncOp)]
    assert names[3:5] == ["mask_first_fwd_ws_score_masked", "mask_first_fwd_ws_score_full"]
    (kernel,) = ops_of(module, th.KernelOp)
    assert "    else:\n        s = mask_first_fwd_ws_score_full(" in kernel.template.data


@pytest.mark.parametrize("fold", [True, False])
def test_alibi_scale_folds_and_converts_vectors_only(fold: bool) -> None:
    """ALiBi (f16, D = 64, scale 1/8): with `fold-scale` and `alibi-vectors` the score
    function adds the distance vectors (int-to-float conversions of [BM] and [BN]
    vectors only, no multiply of the tile by the scale) and the exp2 multiply-add takes
    scale * log2(e); the ablation scales the tile and converts the [BM, BN] distances."""
    text, pipe = ELIGIBLE["alibi"]
    if not fold:
        pipe = pipe.replace("lower-to-tile", "lower-to-tile{fold-scale=false alibi-vectors=false}")
    module = lower(text, pipe)
    (score,) = [f for f in ops_of(module, th.FuncOp) if f.sym_name.data == "alibi_fwd_ws_score"]
    converted = [op.results[0].type for op in score.walk() if isinstance(op, ConvertOp)]
    ranks = {len(t.get_shape()) for t in converted if isinstance(t, TensorType)}
    (kernel,) = ops_of(module, th.KernelOp)
    scaled_tile = " = s * 0.125\n" in emit_function(score)
    if fold:
        assert ranks == {1} and not scaled_tile
        assert f"* {0.125 * 1.4426950408889634!r})" in kernel.template.data
    else:
        assert 2 in ranks and scaled_tile
        assert f"* {1.4426950408889634!r})" in kernel.template.data


def test_gluon_kernels_compile_for_sm90() -> None:
    """Every eligible program's kernel, in a fresh process (one that interprets kernels
    cannot compile them): no spill reloads in the tensor-core loop, shared memory under
    the sm_90 limit, async wgmma, TMA loads and stores, and setmaxnreg budgets for the
    partitions."""
    resources = sm90_resources([program for _, program in sorted(ELIGIBLE.items())], timeout=900)
    assert sorted(resources) == sorted(f"{name}_fwd_ws" for name in ELIGIBLE)
    for name, r in resources.items():
        assert 0 < r["shared"] <= SHARED_MEMORY_LIMIT, (name, r)
        assert r["wgmma"] > 0 and r["tma_load"] > 0 and r["tma_store"] > 0, (name, r)
        assert r["num_warps"] == 12, (name, r)
        if name.removesuffix("_fwd_ws").endswith("_fused"):
            # the K-transforming producer warpgroup gets 40 registers, the consumers 232;
            # ptxas spills a few values (the consumers at 232 and the producer's
            # rotation; measured harmless on an H200 for the consumers) and libdevice's
            # sin/cos reduction of large angles uses a local array (the local loads)
            assert {40, 232} <= set(r["setmaxnreg"]), (name, r)
            assert r["spill_bytes"] <= 192 and r["loop_local_loads"] <= 12, (name, r)
            if name.startswith(("llama3_fused", "qwen3_fused")):
                # split K tiles: two warpgroup barriers per 8-row chunk (32 per tile) and
                # the consumers' 40-odd; one K allocation had three per chunk (95 in all)
                assert r["barriers"] <= 80, (name, r)
        else:
            # the item loop's scalars (step, ring position, the arguments the next
            # item's prologue reads) may be spilled across setmaxnreg and reloaded once
            # per item; inside the KV loop only score_mod reloads two (per tile, against
            # a tile's thousands of instructions; none before the item loop). A runtime
            # block map's four buffers (pointers and strides) add to those scalars: 156
            # bytes for head_mask, whose custom predicate reads the head; with the
            # descriptors' step arguments its first consumer also reloads 5 values per
            # tile (0 before them), the only program where they cost a reload
            loads = 5 if name == "head_mask_fwd_ws" else 2
            assert r["loop_local_loads"] <= loads and r["spill_bytes"] <= 160, (name, r)
            assert {24, 240} <= set(r["setmaxnreg"]), (name, r)


@pytest.mark.parametrize("name", ["llama3_fused", "qwen3_fused"])
def test_fused_producer_transforms_k_in_place(name: str) -> None:
    """rope-fusion fused: a 4-warp producer transforms each K tile in shared memory
    before handing it over, walking chunks downwards with cos/sin stepped by a rotation
    (no sin/cos per tile); a rope alone rotates in bf16, QK-norm + rope in fp32."""
    module = lower(*ELIGIBLE[name])
    [kernel] = ops_of(module, th.KernelOp)
    template = kernel.template.data
    assert "k_raw" in template and "], [4, 4], [232, 40])" in template
    assert "for c in gl.static_range(BN - CH, -1, -CH):" in template
    assert "cos, sin = cos * step_cos - sin * step_sin, sin * step_cos + cos * step_sin" in template
    functions = {f.sym_name.data: f for f in ops_of(module, th.FuncOp)}
    k_body = emit_function(functions[f"{name}_fwd_ws_k"]).split("\n", 2)[2]
    assert ("gl.cast(k_a, gl.float32)" in k_body) == (name == "qwen3_fused"), k_body
    assert "gl.cos(" in emit_function(functions[f"{name}_fwd_ws_k_angles"])
    assert "gl.cos(" not in k_body and "_rope" not in k_body  # no sin/cos, no table reads


def test_forward_kernel_declares_what_it_writes() -> None:
    """The Gluon forward writes only Out and LSE, so the host program runs the cos/sin
    table launches (read by both forward kernels) once per shape class."""
    text, pipe = ELIGIBLE["llama3"]
    [kernel] = ops_of(lower(text, pipe), th.KernelOp)
    assert kernel.writes is not None and [w.data for w in kernel.writes.data] == ["o_desc", "LSE"]
    fn = attnfuse.compile(text, pipeline=pipe)
    q = torch.randn(1, 32, 128, 128, dtype=torch.bfloat16)
    k, v = torch.randn(1, 8, 128, 128, dtype=torch.bfloat16), torch.randn(1, 8, 128, 128, dtype=torch.bfloat16)
    fn(q, k, v)
    cached = sorted(op.kernel.root_reference.data for op in fn._host.cached_launches)
    assert cached == ["llama3_rope_table0", "llama3_rope_table1"], cached


def test_kernel_writes_round_trips_and_is_checked() -> None:
    """`writes` prints, parses back, and must name the kernel's arguments."""
    text, pipe = ELIGIBLE["bottom_right"]
    printed = str(lower(text, pipe))
    assert 'writes = ["o_desc", "LSE"]' in printed
    module, _ = parse_module_with_locations(make_context(), printed, "<printed>")
    [kernel] = ops_of(module, th.KernelOp)
    assert [w.data for w in kernel.writes.data] == ["o_desc", "LSE"]
    bad = th.KernelOp("k", [f32], num_warps=4, maxnreg=168, launch={}, callees=[],
                      template="def __kernel__():\n    pass\n", writes=["nope"])
    bad.args[0].name_hint = "x"
    with pytest.raises(VerifyException, match="writes 'nope', which is not an argument"):
        bad.verify()


def test_cpu_calls_run_the_triton_kernel() -> None:
    """On the CPU the guard is false: hopper-forward on and off give the same bits."""
    text, _ = ELIGIBLE["bottom_right"]
    on = attnfuse.compile(text, pipeline=pipeline())
    off = attnfuse.compile(text, pipeline=pipeline(hopper=False))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 128, 128, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 2, 256, 128, generator=g).to(torch.bfloat16)
    v = torch.randn(1, 2, 256, 128, generator=g).to(torch.bfloat16)
    out_on, lse_on = on(q, k, v, return_lse=True)
    out_off, lse_off = off(q, k, v, return_lse=True)
    assert torch.equal(out_on, out_off) and torch.equal(lse_on, lse_off)


def test_tma_ready_per_shape_class(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    ok = [torch.empty(2, 4, 256, 64), torch.empty(2, 1, 128, 64)]
    assert tma_unready_reason(ok, cuda, 9, 128) is None
    assert tma_unready_reason(ok, torch.device("cpu"), 9, 128) == "device cpu"
    assert "not a multiple of 128" in tma_unready_reason([torch.empty(1, 4, 200, 64)], cuda, 9, 128)
    bshd = torch.empty(2, 256, 4, 64).transpose(1, 2)  # what Hugging Face models pass
    assert tma_unready_reason([bshd], cuda, 9, 128) is None
    strided = torch.empty(2, 4, 64, 256).transpose(2, 3)  # the head dim not contiguous
    assert NOT_DENSE in tma_unready_reason([strided], cuda, 9, 128)
    named = tma_unready_reason([ok[0], strided], cuda, 9, 128, ["argument 0 'q' of @f", "argument 1 'k' of @f"])
    assert named == f"argument 1 'k' of @f (shape (2, 4, 256, 64), strides (65536, 16384, 1, 256)) {NOT_DENSE}"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert tma_unready_reason(ok, cuda, 9, 128) == "compute capability 8.0"


def test_gluon_emitter_rejects_dots() -> None:
    tile_type = TensorType(f32, [16, 16])
    function = th.FuncOp("f", [tile_type], [])
    b = TileBuilder(function)  # type: ignore[arg-type]
    b.insert(th.ReturnOp(b.dot(function.args[0], function.args[0])))
    function.properties["function_type"] = type(function.function_type).from_lists([tile_type], [tile_type])
    with pytest.raises(NotImplementedError, match="tile.dot"):
        emit_function(function)




def test_tma_view_of_layouts() -> None:
    """The 2-D view a descriptor reads: rows of the dim -2 stride, and per leading dim
    the (rows, columns) its index moves a tile by; None where no view holds every tile."""
    assert tma_view(torch.empty(2, 4, 256, 64)) == (2048, 64, (1024, 0, 256, 0))
    # [B, S, H, D] memory seen as [B, H, S, D]: B*S rows of H*D, a head is D columns on
    assert tma_view(torch.empty(2, 256, 4, 64).transpose(1, 2)) == (512, 256, (256, 0, 0, 64))
    # K of a fused QKV projection: [B, S, Hq + 2 Hk, D] sliced on the head dim
    qkv = torch.empty(2, 256, 8 + 2 * 2, 64, dtype=torch.bfloat16)
    k = qkv[:, :, 8:10].transpose(1, 2)
    assert tma_view(k) == (512, 768, (256, 0, 0, 64)) and k.data_ptr() % 16 == 0
    # a broadcast head (stride 0) reads the same rows for every head
    assert tma_view(torch.empty(2, 1, 256, 64).expand(2, 4, 256, 64)) == (512, 64, (256, 0, 0, 0))
    assert tma_view(torch.empty(2, 4, 64, 256).transpose(2, 3)) is None  # the last dim strided
    assert tma_view(torch.empty(2, 4, 256, 66, dtype=torch.bfloat16)[..., :64]) is None  # 132-byte rows
    assert tma_view(torch.empty(2 * 4 * 256 * 64 + 1)[1:].view(2, 4, 256, 64)) is None  # a misaligned base
    # heads that overlap the next row: [B, S, H*D] with one more head than fits
    assert tma_view(torch.empty(3 * 65536).as_strided((2, 5, 256, 64), (65536, 64, 256, 1))) is None


def test_descriptor_arguments_are_2d_views() -> None:
    """A TMA argument is built per call over the 2-D view of its tensor slot (`tma_view`)."""
    from attnfuse.backends.triton.metadata import KernelMetadata
    from attnfuse.runtime.launch import KernelLaunch

    meta = KernelMetadata("k", ("k_desc", "n"), {"k_desc": "tensordesc<bf16[128, 64]>", "n": "i32"}, 4, 1,
                          maxnreg=168, tma={"k_desc": (128, 64)})
    launch = KernelLaunch(None, meta, (1, 1, 1), [None, 7], (), torch.device("cpu"), ((0, 1, (128, 64)),))
    assert launch.options == {"num_warps": 4, "num_stages": 1, "maxnreg": 168}
    for _ in range(2):
        k = torch.empty(2, 4, 256, 64, dtype=torch.bfloat16)
        args: list = [None, 7]
        launch._descriptors(args, [None, k])
        desc = args[0]
        assert desc.base is k and desc.shape == [2048, 64] and desc.strides == [64, 1]
        assert desc.block_shape == [128, 64] and desc.layout.swizzle_byte_width == 128
    bshd = torch.empty(2, 256, 4, 64, dtype=torch.bfloat16).transpose(1, 2)
    launch = KernelLaunch(None, meta, (1, 1, 1), [None, 7], (), torch.device("cpu"), ((0, 1, (128, 64)),))
    args = [None, 7]
    launch._descriptors(args, [None, bshd])
    assert args[0].base is bshd and args[0].shape == [512, 256] and args[0].strides == [256, 1]


class Pointer:
    """A pointer into a flat tensor, for `_ScalarGluon.load`."""

    def __init__(self, tensor: torch.Tensor, offset: int = 0) -> None:
        self.tensor, self.offset = tensor, offset

    def __add__(self, offset: int) -> Pointer:
        return Pointer(self.tensor, self.offset + int(offset))


class _ScalarGluon:
    """Just enough of `gl` to run an emitted scalar device function as Python."""

    int32, int64 = "int32", "int64"
    maximum, minimum = staticmethod(max), staticmethod(min)

    @staticmethod
    def load(pointer: Pointer) -> int:
        return int(pointer.tensor.flatten()[pointer.offset])

    @staticmethod
    def cast(x: int, dtype: str) -> int:
        return int(x)

    @staticmethod
    def where(c: bool, a: int, b: int) -> int:
        return a if c else b

    @staticmethod
    def full(shape: tuple, value: int, dtype: str, layout: object = None) -> int:
        return value

    @staticmethod
    def AutoLayout() -> None:  # noqa: N802 - Gluon's name
        return None


def _keep(name: str, q: torch.Tensor, kv: torch.Tensor, q_len: int, kv_len: int) -> torch.Tensor:
    """The band masks of the catalogue's programs, from their definitions."""
    diag = kv_len - q_len
    if name == "window":
        return (kv >= q - 200) & (kv <= q + 100)
    if name == "gemma2_like":
        return (kv <= q) & (kv >= q - 300)
    if name == "bottom_right":
        return kv <= q + diag
    raise KeyError(name)


@pytest.mark.parametrize("name", ["window", "gemma2_like", "bottom_right"])
def test_kv_walk_covers_the_band(name: str) -> None:
    """The range device function, run as Python: every kept key of a CTA's 128 rows lies
    in its walk, and every tile it calls full is kept entirely."""
    module = lower(*ELIGIBLE[name])
    (function,) = [f for f in ops_of(module, th.FuncOp) if f.sym_name.data.endswith("_range")]
    scope: dict = {"gl": _ScalarGluon}
    exec(emit_function(function).replace("@gluon.jit\n", ""), scope)  # noqa: S102 - our own emitted source
    walk = scope[function.sym_name.data]
    names = [a.name_hint for a in function.args]
    for q_len, kv_len in ((128, 128), (512, 512), (256, 1024), (1024, 256), (640, 384)):
        q = torch.arange(q_len)[:, None]
        kv = torch.arange(kv_len)[None, :]
        keep = _keep(name, q, kv, q_len, kv_len)
        for m in range(q_len // 128):
            lo, n, full_lo, full_hi = walk(m * 128, 0, 0, **{
                **dict.fromkeys(names[3:]), "Sq": q_len, "Skv": kv_len, "B": 1})
            rows = keep[m * 128:(m + 1) * 128]
            kept = rows.any(dim=0).nonzero().flatten()
            if len(kept):
                assert lo <= int(kept.min()) and int(kept.max()) < lo + n * 128, (q_len, kv_len, m)
            assert lo % 128 == 0 and (n == 0 or lo + n * 128 <= kv_len) and full_lo <= full_hi
            for start in range(full_lo, full_hi, 128):
                assert lo <= start < lo + n * 128 and bool(rows[:, start:start + 128].all()), (q_len, kv_len, m, start)


def _map_keep(name: str, batch: int, heads: int, q_len: int, kv_len: int, doc: torch.Tensor | None) -> torch.Tensor:
    """[B, H, Sq, Skv] kept elements of the block-map programs, from their definitions."""
    q, kv = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
    if name == "head_mask":
        return torch.stack([kv <= q - 64 * h for h in range(heads)])[None].expand(batch, -1, -1, -1)
    assert doc is not None
    return ((kv <= q) & (doc[:, :, None] == doc[:, None, :]))[:, None]


@pytest.mark.parametrize("name", ["document", "head_mask"])
def test_block_map_walk_visits_the_kept_tiles(name: str) -> None:
    """The range and tile device functions of a runtime block map, run as Python over a
    map laid out as `block_map.py` writes it (per (batch[, head], q block) row: partial,
    then full kv blocks): every item walks each tile with a kept element once, masked
    exactly where the tile is partial, and its rows' map row (per head for head_mask)."""
    module = lower(*ELIGIBLE[name])
    walk, walk_names = scalar_function(module, "range")
    tile, tile_names = scalar_function(module, "tile")
    batch, heads, q_len, kv_len = 2, 8 if name == "head_mask" else 32, 768, 768
    doc = torch.tensor([0] * 300 + [1] * 200 + [2] * 268).repeat(batch, 1) if name == "document" else None
    if doc is not None:
        doc[1] = torch.tensor([0] * 130 + [1] * 638)
    keep = _map_keep(name, batch, heads, q_len, kv_len, doc)
    n_q, n_kv = q_len // 128, kv_len // 128
    tiles = keep.reshape(*keep.shape[:2], n_q, 128, n_kv, 128)
    kept, full = tiles.any(dim=(3, 5)), tiles.all(dim=(3, 5))
    slots = batch * keep.shape[1] * n_q
    partial_count, full_count = torch.zeros(slots, dtype=torch.int32), torch.zeros(slots, dtype=torch.int32)
    partial_index = torch.full((slots, n_kv), -1, dtype=torch.int32)
    full_index = torch.full((slots, n_kv), -1, dtype=torch.int32)
    for slot, (b, h, m) in enumerate((b, h, m) for b in range(batch) for h in range(keep.shape[1]) for m in range(n_q)):
        for counts, index, blocks in ((partial_count, partial_index, (kept & ~full)[b, h, m]),
                                      (full_count, full_index, full[b, h, m])):
            found = blocks.nonzero().flatten()
            counts[slot] = len(found)
            index[slot, :len(found)] = found.to(torch.int32)
    maps = {"partial_count": partial_count, "partial_index": partial_index, "full_count": full_count,
            "full_index": full_index}
    scalars: dict[str, Any] = {"Sq": q_len, "Skv": kv_len, "B": batch}
    for arg, tensor in maps.items():
        scalars[arg] = Pointer(tensor)
        scalars.update({f"{arg}_stride{i}": st for i, st in enumerate(tensor.stride())})
    for b in range(batch):
        for h in range(heads):
            for m in range(n_q):
                lo, n, full_lo, full_hi = walk(m * 128, b, h, **{k: scalars.get(k) for k in walk_names[3:]})
                visited = [tile(j, lo, n, full_lo, full_hi, **{k: scalars.get(k) for k in tile_names[5:]})
                           for j in range(n)]
                map_h = h if keep.shape[1] > 1 else 0
                want = sorted((int(c) * 128, not bool(full[b, map_h, m, c])) for c in kept[b, map_h, m].nonzero())
                assert sorted(visited) == want, (b, h, m)


def scalar_function(module: ModuleOp, suffix: str) -> tuple[Callable[..., Any], list[str]]:
    """The device function `*_<suffix>` of `module`, emitted and run as Python, and its
    argument names."""
    (function,) = [f for f in ops_of(module, th.FuncOp) if f.sym_name.data.endswith(f"_{suffix}")]
    scope: dict = {"gl": _ScalarGluon}
    exec(emit_function(function).replace("@gluon.jit\n", ""), scope)  # noqa: S102 - our own emitted source
    return scope[function.sym_name.data], [a.name_hint or "" for a in function.args]


@pytest.mark.parametrize("batch, q_len, ctas", [(8, 2048, 132), (4, 4096, 132), (2, 8192, 132), (1, 16384, 132),
                                                (16, 1024, 132), (3, 384, 132), (2, 1024, 5), (1, 128, 132),
                                                (4, 8192, 64)])
def test_persistent_items_cover_every_block_once(batch: int, q_len: int, ctas: int) -> None:
    """The steps and work device functions, run as Python: the CTAs of a persistent grid
    (`ctas` of them; a grid of one CTA per item when there are fewer items) take every
    (batch, head, q block) exactly once, and with a causal walk (q block m visits m + 1
    tiles) no CTA's total is more than two tiles above the mean."""
    module = lower(*ELIGIBLE["llama3"])
    steps_fn, steps_names = scalar_function(module, "steps")
    work_fn, work_names = scalar_function(module, "work")
    hq, n_m = 32, q_len // 128
    ctas = min(ctas, batch * hq * n_m)
    scalars = {"Sq": q_len, "Skv": q_len, "B": batch}
    seen: list[tuple[int, int, int]] = []
    totals = []
    for cta in range(ctas):
        total = 0
        for step in range(steps_fn(ctas, **{n: scalars.get(n) for n in steps_names[1:]})):
            b, h, m, valid = work_fn(step, cta, ctas, **{n: scalars.get(n) for n in work_names[3:]})
            if valid:
                assert 0 <= b < batch and 0 <= h < hq and 0 <= m < n_m, (b, h, m)
                seen.append((b, h, m))
                total += m + 1
        totals.append(total)
    assert sorted(seen) == [(b, h, m) for b in range(batch) for h in range(hq) for m in range(n_m)]
    assert max(totals) <= sum(totals) / ctas + 2, (max(totals), sum(totals) / ctas)
