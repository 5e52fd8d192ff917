"""lower-backward{hopper-backward}: which programs get the warp-specialized Gluon backward,
what the lowered host code holds (an f32 dQ buffer, zeroed unless `ordered` stores every
tile first, the Gluon launch guarded by
`host.tma_ready` and the Triton dQ and dK/dV kernels launched otherwise), that the
kernels compile for sm_90a (shared memory under the limit, wgmma, TMA loads and
reduce-adds, setmaxnreg), and that CPU calls run the Triton kernels and stay right.

The Gluon kernels cannot run in Triton's interpreter: tests/gpu/test_hopper_backward_gpu.py
checks their gradients on a GPU.
"""

from __future__ import annotations


import logging

import random


from typing import Any

import pytest
import torch
from hopper_programs import BACKWARD_ELIGIBLE, BACKWARD_INELIGIBLE, backward_pipeline, backward_plans, sm90_resources
from programs import Builder
from test_hopper_forward import Pointer, lower, ops_of, scalar_function

import attnfuse
from attnfuse import reference
from attnfuse.backends.gluon.sm90 import SHARED_MEMORY_LIMIT
from attnfuse.dialects import tile_hopper as th
from attnfuse.dialects.host import AllocOp, LaunchOp, TmaReadyOp
from xdsl.dialects import arith
from xdsl.dialects.builtin import TensorType
from attnfuse.dialects.attn import OnlineSoftmaxOp
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.pass_manager import make_context
from attnfuse.passes import DEFAULT_PIPELINE
from attnfuse.program import find_functions
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.runtime.loader import load_kernels
from attnfuse.testing import assert_grad_close, make_inputs, with_dtype


def backward_launches(module: object) -> list[tuple[str, bool, bool]]:
    """(kernel, guarded, unless) of every launch of the backward host function."""
    (bwd,) = [op for op in module.walk() if getattr(op, "sym_name", None) is not None  # type: ignore[attr-defined]
              and op.sym_name.data.endswith("_backward")]
    return [(op.kernel.root_reference.data, op.cond is not None, op.unless is not None)
            for op in bwd.walk() if isinstance(op, LaunchOp)]


@pytest.mark.parametrize("name", sorted(BACKWARD_ELIGIBLE))
def test_eligible_program_gets_the_hopper_backward(name: str) -> None:
    text = BACKWARD_ELIGIBLE[name]
    module = lower(text, backward_pipeline())
    kernels = [k.sym_name.data for k in ops_of(module, th.KernelOp)]
    assert f"{name}_bwd_ws" in kernels
    launches = backward_launches(module)
    hopper_path = [k for k, g, unless in launches if g and not unless]
    triton_path = [k for k, g, unless in launches if g and unless]
    # the Gluon kernel when the shape class is served (after its block maps, for a plan
    # with a runtime block map), then the transposes of its f32 gradients; the Triton dQ
    # and dK/dV kernels otherwise (after their maps; transposes only for a side whose
    # pre-kernels their epilogues cannot undo)
    (online,) = ops_of(lower(text, "attn-canonicalize,rope-fusion,online-softmax,mask-tiling"), OnlineSoftmaxOp)
    if online.plan.has_runtime_block_map():
        assert hopper_path[:2] == [f"{name}_bwd_ws_block_map", f"{name}_bwd_ws_kv_block_map"], hopper_path
        assert triton_path[:2] == [f"{name}_bwd_block_map", f"{name}_bwd_kv_block_map"], triton_path
        hopper_path, triton_path = hopper_path[2:], triton_path[2:]
    assert hopper_path[0] == f"{name}_bwd_ws"
    assert all(k.endswith("_prologue_transpose") for k in hopper_path[1:]), hopper_path
    assert triton_path[:2] == [f"{name}_bwd_dq", f"{name}_bwd_dkdv"], triton_path
    assert all(k.endswith("_prologue_transpose") for k in triton_path[2:]), triton_path
    # every buffer of one path only is allocated on that path; select joins dQ, dK (and
    # the QK-norm weights' gradients)
    # (in `@f_backward`; `@f_backward_saved`, where built, has the same paths)
    (bwd,) = [op for op in module.walk() if getattr(op, "sym_name", None) is not None  # type: ignore[attr-defined]
              and op.sym_name.data.endswith("_backward")]
    allocs = {op.result.name_hint: op for op in bwd.walk() if isinstance(op, AllocOp)}
    assert allocs["d_v"].cond is None
    selects = [op for op in bwd.walk() if isinstance(op, arith.SelectOp) and isinstance(op.result.type, TensorType)]
    names = sorted(op.result.name_hint for op in selects)
    assert {"d_q", "d_k"} <= set(names) and all(n in ("d_q", "d_k") or n.startswith("d_norm_w") for n in names)
    returned = list(bwd.body.block.last_op.operands)  # type: ignore[attr-defined]
    assert all(op.result in returned for op in selects)
    (ready,) = [op for op in bwd.walk() if isinstance(op, TmaReadyOp) and op.result.name_hint == "use_hopper_bwd"]
    assert ready.rows.value.data == 128
    # dQ is summed into an f32 buffer, zeroed unless every row sees a key (the first
    # adder of each tile stores it) (no band, or a top-left one keeping the diagonal, and
    # no runtime block map, whose predicates may leave a row without keys)
    lower_bound, upper_bound = online.plan.get_band()
    covered = lower_bound is None and (upper_bound is None or (
        not online.plan.is_bottom_right() and upper_bound >= 0)) and not online.plan.has_runtime_block_map()
    bwd_allocs = [op for op in bwd.walk() if isinstance(op, AllocOp)]  # not `_backward_saved`'s
    (d_q,) = [op for op in bwd_allocs if op.result.name_hint in ("d_q_f32", "d_q_rotated")
              and op.cond is not None and op.unless is None]
    assert "f32" in str(d_q.result.type)
    assert (d_q.zero is None) == covered, (name, online.plan.get_band())
    (kernel,) = [k for k in ops_of(module, th.KernelOp) if k.sym_name.data.endswith("_bwd_ws")]
    assert f"{name}_bwd_ws_reduce_add(dq_desc" in kernel.template.data
    assert "tma.async_copy_shared_to_global(dq_desc" in kernel.template.data
    # the adds in key-block order: a zeroed int32 counter per (batch, q head, 64-row
    # tile, column half)
    (turns,) = [op for op in bwd_allocs if op.result.name_hint == "d_q_turns"]
    ordered_lines = ("        tile_turn = dQ_turns + batch * dQ_turns_stride0 + head * dQ_turns_stride1",
                     f"        {name}_bwd_ws_take_turn(tile_turn, turn)", f"        {name}_bwd_ws_pass_turn(tile_turn)")
    assert all(line in kernel.template.data for line in ordered_lines)
    # one dQ writer warp per consumer warpgroup
    assert f"({name}_bwd_ws_dq_writer, (dq_desc, dq_smem, dq_full, dq_empty, " in kernel.template.data
    q_heads = ops_of(module, TmaReadyOp)[-1].tensors[0].type.get_shape()[1]
    assert turns.zero is not None
    assert str(turns.result.type) == f"tensor<?x{q_heads}x?x2xi32>"


@pytest.mark.parametrize("name", sorted(BACKWARD_INELIGIBLE))
def test_ineligible_program_keeps_the_triton_backward(name: str, caplog: pytest.LogCaptureFixture) -> None:
    text, pipe, reason = BACKWARD_INELIGIBLE[name]
    with caplog.at_level(logging.DEBUG, logger="attnfuse.lowering.backward_host"):
        module = lower(text, pipe)
    assert not [k for k in ops_of(module, th.KernelOp) if k.sym_name.data.endswith("_bwd_ws")]
    assert not any(g for _, g, _ in backward_launches(module))
    assert "Hopper backward schedule not used: " in caplog.text and reason in caplog.text


def test_hopper_backward_by_default() -> None:
    """The default pipeline builds the schedule for a program it serves;
    `hopper-backward=false` (the ablation) builds the Triton kernels alone."""
    text = BACKWARD_ELIGIBLE["llama3"]
    module = lower(text, DEFAULT_PIPELINE)
    assert [k.sym_name.data for k in ops_of(module, th.KernelOp) if k.sym_name.data.endswith("_bwd_ws")] == [
        "llama3_bwd_ws"]
    assert [op for op in ops_of(module, AllocOp) if op.result.name_hint == "d_q_turns"]
    module = lower(text, backward_pipeline(hopper=False))
    assert not [k for k in ops_of(module, th.KernelOp) if k.sym_name.data.endswith("_bwd_ws")]
    assert not any(g for _, g, _ in backward_launches(module))


DK_EPILOGUE = ("llama3", "llama3_1", "bottom_right", "alibi_window", "d64_rope", "interleaved", "k_positions",
               "document")
"""Programs whose K pre-kernel transforms are RoPE alone over the whole head dim."""
NO_K_TRANSFORMS = ("alibi", "window", "doc_alibi")


@pytest.mark.parametrize("name", sorted(BACKWARD_ELIGIBLE))
def test_dk_rotated_back_in_the_epilogue(name: str) -> None:
    """Where K's pre-kernel transforms are whole-width RoPE alone, the Gluon kernel's
    epilogue rotates dK back and stores it in K's dtype (`<name>_bwd_ws_dk_store`): no f32
    dK buffer and no K transpose on the Hopper path; `rotate-in-epilogue=false` (and any
    other K side) keeps the f32 buffer and the transpose."""
    for epilogue in (True, False):
        pipe = backward_pipeline().replace("hopper-backward=true", f"hopper-backward=true rotate-in-epilogue={str(epilogue).lower()}")
        module = lower(BACKWARD_ELIGIBLE[name], pipe)
        rotated = epilogue and name in DK_EPILOGUE
        hopper_path = [k for k, g, unless in backward_launches(module) if g and not unless]
        transposed = not rotated and name not in NO_K_TRANSFORMS
        assert (f"{name}_bwd_k_prologue_transpose" in hopper_path) == transposed, (name, epilogue, hopper_path)
        (kernel,) = [k for k in ops_of(module, th.KernelOp) if k.sym_name.data.endswith("_bwd_ws")]
        functions = [f.sym_name.data for f in ops_of(module, th.FuncOp)]
        assert (f"{name}_bwd_ws_dk_store" in functions) == rotated
        assert (f"    {name}_bwd_ws_dk_store(dk * " in kernel.template.data) == rotated
        (d_k,) = [arg for arg in kernel.args if arg.name_hint == "dK"]  # what the kernel writes
        assert ("f32" in str(d_k.type)) == transposed, (name, str(d_k.type))


def test_planned_masks_run_on_masked_tiles_only() -> None:
    module = lower(BACKWARD_ELIGIBLE["window"], backward_pipeline())
    names = [f.sym_name.data for f in ops_of(module, th.FuncOp) if "_bwd_ws" in f.sym_name.data]
    assert names == ["window_bwd_ws_range", "window_bwd_ws_walk", "window_bwd_ws_mask"]
    (kernel,) = [k for k in ops_of(module, th.KernelOp) if k.sym_name.data.endswith("_bwd_ws")]
    assert "        if masked:\n            s_t = window_bwd_ws_mask(s_t, keys" in kernel.template.data


def test_gluon_backward_kernels_compile_for_sm90() -> None:
    """Every eligible program's backward kernel, in a fresh process (one that interprets
    kernels cannot compile them)."""
    resources = sm90_resources([(text, backward_pipeline(forward_hopper=False))
                                for text in BACKWARD_ELIGIBLE.values()], timeout=1200)
    assert sorted(resources) == sorted(f"{name}_bwd_ws" for name in BACKWARD_ELIGIBLE)
    for name, r in resources.items():
        head_dim = find_functions(parse_module_with_locations(make_context(), BACKWARD_ELIGIBLE[name[:-len("_bwd_ws")]],
                                                              name)[0])[0].args[0].type.get_shape()[3]
        # at most a few scalars in local memory (none; 40 bytes with ALiBi and a window,
        # the CTA's coordinates among them); the ordered spin loop and the predicated
        # release are PTX: the same loop in the IR spilled some 200 bytes of tiles, a `red`
        # predicated on %tid.x in the PTX 460; ALiBi from per-key and per-query vectors
        # spilled 372
        if name.startswith("doc"):
            # runtime block maps (hopper-block-map, not yet run on a GPU): the document
            # ids' mask code in the consumers spills 104 bytes and reloads some 20 values
            # per tile (96 bytes with the map loads taken out of the walk: not the walk)
            assert r["spill_bytes"] <= 128 and r["loop_local_loads"] <= 24, (name, r)
        else:
            assert r["spill_bytes"] <= 48 and r["local_loads"] <= 12, (name, r)
        assert 0 < r["shared"] <= SHARED_MEMORY_LIMIT, (name, r)
        # the reduce of each of the two dQ writers (at D = 128 two boxes of 32 f32 columns each)
        assert r["wgmma"] > 0 and r["tma_load"] > 0 and r["tma_reduce"] == (4 if head_dim == 128 else 2), (name, r)
        assert {24, 240} <= set(r["setmaxnreg"]), (name, r)


@pytest.mark.parametrize(("name", "q_len", "kv_len"), [("llama3", 40, 40), ("bottom_right", 24, 56), ("window", 70, 70),
                                                        ("alibi", 50, 50),
                                                        ("alibi_window", 40, 90)])
def test_cpu_calls_run_the_triton_kernels(name: str, q_len: int, kv_len: int) -> None:
    """On the CPU the guard is false: the Triton path runs, with its own buffers and RoPE
    epilogues, the same kernels and the same bits as without the schedule (no f32 dQ
    buffer, no transposes a Triton epilogue can do); the gradients match the float64
    reference (f16: the interpreter truncates bf16)."""
    text = with_dtype(BACKWARD_ELIGIBLE[name], "f16")
    function = find_functions(parse_module_with_locations(make_context(), text, name)[0])[0]
    args = make_inputs(function, 1, q_len, kv_len, seed=3)
    d_out: torch.Tensor | None = None
    grads, kernels = {}, {}
    for mode in (True, False):
        fn = attnfuse.compile(text, pipeline=backward_pipeline(hopper=mode))
        leaves = [t.clone().requires_grad_() for t in args]
        out = fn(*leaves)
        if d_out is None:
            d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(out.dtype)
        out.backward(d_out)
        grads[mode] = [leaf.grad for leaf in leaves]
        kernels[mode] = sorted(step.meta.name for plan in backward_plans(fn).values() for step in plan.steps
                               if isinstance(step, KernelLaunch))
        assert kernels[mode], "no backward kernel ran"
    assert kernels[True] == kernels[False]
    assert all(torch.equal(a, b) for a, b in zip(grads[True], grads[False]))  # type: ignore[arg-type]
    refs = [t.double().requires_grad_() for t in args]
    assert d_out is not None
    reference.run(text, *refs).backward(d_out.double())
    for what, got, ref in zip("qkv", grads[True], refs):
        assert ref.grad is not None
        assert_grad_close(got, ref.grad, torch.float16, f"d{what}")


def _walk(n: int, band: tuple[int | None, int | None], q_len: int, kv_len: int, bottom_right: bool) -> list[int]:
    """The q tiles (first rows) of key block n, as `backward_dkv.q_walk` and the kernel's
    `_range` function compute them (64-row tiles, 128-key blocks)."""
    lower, upper = band
    n_start, diag = n * 128, (kv_len - q_len if bottom_right else 0)
    lo, hi = 0, q_len
    if upper is not None:
        lo = max(n_start - diag - upper, 0) // 64 * 64
    if lower is not None:
        hi = min(q_len, max(n_start + 128 - diag - lower, 0))
    if upper is not None and n_start - diag - upper >= q_len:
        hi = lo
    return list(range(lo, lo + 64 * (-(-max(hi - lo, 0) // 64)), 64))


class _MaxOnly:
    maximum = staticmethod(max)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_ordered_turns_follow_the_walk(align: str) -> None:
    """`ordered`: the key blocks whose walks hold a q tile are consecutive, and the first
    is the template's `first_block` expression (evaluated here in Python, where `//`
    floors: the kernel's truncating division clamps to the same value at 0)."""
    rng = random.Random(0)
    masks: list[dict[str, Any]] = [{"kind": "causal"}, {"kind": "none"}]
    masks += [{"kind": "sliding_window", "left": rng.randint(1, 700)} for _ in range(4)]
    masks += [{"kind": "sliding_window", "left": rng.randint(0, 700), "right": rng.randint(0, 300)} for _ in range(4)]
    for mask in masks:
        b = Builder("turns", hq=4, hkv=2, d=64, dtype="bf16")
        options = {k: v for k, v in mask.items() if k != "kind"}
        if mask["kind"] != "none":
            b.mask(mask["kind"], align=align, **options)
        module = lower(b.build().text, "attn-canonicalize,rope-fusion,online-softmax,mask-tiling,"
                       "lower-backward")
        (online,) = ops_of(module, OnlineSoftmaxOp)
        band = online.plan.get_band()
        bottom_right = online.plan.is_bottom_right()
        (hopper,) = ops_of(module, th.KernelOp)
        expr = hopper.template.data.split("        turn = n - (")[1].split(")\n")[0]
        for _ in range(20):
            q_len, kv_len = 128 * rng.randint(1, 10), 128 * rng.randint(1, 10)
            walks = [set(_walk(n, band, q_len, kv_len, bottom_right)) for n in range(kv_len // 128)]
            for t in range(0, q_len, 64):
                blocks = [n for n, w in enumerate(walks) if t in w]
                if blocks:
                    first = eval(expr, {"gl": _MaxOnly, "t_start": t, "Sq": q_len, "Skv": kv_len})  # noqa: S307
                    assert blocks == list(range(first, first + len(blocks))), (mask, q_len, kv_len, t, blocks, expr)


@pytest.mark.parametrize("batch, kv_len, kv_heads", [(8, 2048, 8), (1, 16384, 8), (3, 384, 8), (2, 8192, 8),
                                                    (5, 1024, 2), (3, 512, 1)])
def test_launch_order_covers_every_block_once(batch: int, kv_len: int, kv_heads: int) -> None:
    """The kernel's `coords`, run as Python over the launch's grid in launch order
    (axis 0 fastest): every (batch, kv head, key block) once; the pairs in chunks of
    gcd(kv heads, `PAIR_CHUNK`), within a chunk block 0 of each pair first; and a pair's
    blocks launched in increasing order (the ordered dQ turns wait on lower blocks, which
    must not be launched after them)."""
    import math

    from attnfuse.lowering.hopper_backward import PAIR_CHUNK

    b = Builder("order", hq=2 * kv_heads, hkv=kv_heads, d=64, dtype="bf16")
    b.mask("causal")
    module = lower(b.build().text, backward_pipeline(forward_hopper=False))
    (kernel,) = [k for k in ops_of(module, th.KernelOp) if k.sym_name.data.endswith("_bwd_ws")]
    (launch,) = [op for op in ops_of(module, LaunchOp) if op.kernel.root_reference.data.endswith("_bwd_ws")]
    assert [v.name_hint for v in launch.operands[:2]] == ["ws_grid_chunk", "ws_chunks"]
    source = kernel.template.data
    start = source.index("def order_bwd_ws_coords(")
    body = source[start:source.index("\n\n\n", start)]
    chunk, blocks = math.gcd(kv_heads, PAIR_CHUNK), kv_len // 128
    grid = (chunk * blocks, batch * kv_heads // chunk)
    pid = [0, 0]

    class FakeGluon:
        @staticmethod
        def program_id(axis: int) -> int:
            return pid[axis]

    scope: dict[str, Any] = {"gl": FakeGluon}
    exec(body, scope)  # noqa: S102 - our own template
    order = []
    for pid[1] in range(grid[1]):
        for pid[0] in range(grid[0]):
            order.append(scope["order_bwd_ws_coords"]())
    assert sorted(order) == [(b, h, n) for b in range(batch) for h in range(kv_heads) for n in range(blocks)]
    pairs = [b * kv_heads + h for b, h, _ in order]
    assert all(n == 0 for _, _, n in order[:chunk]) and len(set(pairs[:chunk])) == chunk
    for pair in set(pairs):
        blocks_of_pair = [n for (_, _, n), p in zip(order, pairs) if p == pair]
        assert blocks_of_pair == sorted(blocks_of_pair)


@pytest.mark.parametrize("name", ["document", "doc_alibi"])
def test_block_map_walk_and_turns(name: str) -> None:
    """`hopper-block-map`: the map kernels of the Hopper path (run in the interpreter on
    document ids) and the range, walk and turn device functions (run as Python over
    their output): each key block walks every 64-row q tile of the 128-row q blocks it
    has a kept element with, masked exactly where its tile
    of 128 x 128 is partial, and its dQ turn on a tile is the number of lower key blocks
    that visit the tile's q block."""
    text = BACKWARD_ELIGIBLE[name]
    fn = attnfuse.compile(text, pipeline=backward_pipeline())
    kernels = load_kernels(fn.triton_source, interpret=True)
    module = lower(text, backward_pipeline())
    walk_range, range_names = scalar_function(module, "bwd_ws_range")
    walk, walk_names = scalar_function(module, "bwd_ws_walk")
    turn, turn_names = scalar_function(module, "bwd_ws_turn")
    batch, length, blocks = 2, 768, 6
    doc = torch.tensor([[0] * 300 + [1] * 200 + [2] * 268, [0] * 130 + [1] * 638], dtype=torch.int32)
    q, kv = torch.arange(length)[:, None], torch.arange(length)[None, :]
    keep = (kv <= q) & (doc[:, :, None] == doc[:, None, :])
    tiles = keep.reshape(batch, blocks, 128, blocks, 128)
    kept, full = tiles.any(dim=(2, 4)), tiles.all(dim=(2, 4))
    maps: dict[str, torch.Tensor] = {}
    for prefix, kernel in (("", f"{name}_bwd_ws_block_map"), ("t_", f"{name}_bwd_ws_kv_block_map")):
        counts = {f"{prefix}{n}": torch.full((batch * blocks,), -1, dtype=torch.int32) for n in ("partial_count",
                                                                                                    "full_count")}
        lists = {f"{prefix}{n}": torch.full((batch * blocks, blocks), -1, dtype=torch.int32)
                 for n in ("partial_index", "full_index")}
        maps.update(counts, **lists)
        args: list[Any] = [doc, *doc.stride()]
        for n in ("partial_count", "partial_index", "full_count", "full_index"):
            args += [maps[prefix + n], *maps[prefix + n].stride()]
        if not prefix:
            maps["rank"] = torch.full((batch * blocks, blocks), -1, dtype=torch.int32)
            args += [maps["rank"], *maps["rank"].stride()]
        kernels[kernel][(blocks, batch, 1)](*args, batch, length, length)
    scalars: dict[str, Any] = {"Sq": length, "Skv": length}
    for arg, tensor in maps.items():
        scalars[arg] = Pointer(tensor)
        scalars.update({f"{arg}_stride{i}": st for i, st in enumerate(tensor.stride())})
    for b in range(batch):
        for n in range(blocks):
            lo, count, partial, full_count = walk_range(n * 128, b, 0, **{k: scalars.get(k) for k in range_names[3:]})
            assert count == 2 * int(kept[b, :, n].sum()) and partial + full_count == count // 2
            visited = [walk(t, lo, count, partial, full_count, **{k: scalars.get(k) for k in walk_names[5:]})
                       for t in reversed(range(count))]
            want = [(m * 128 + half * 64, not bool(full[b, m, n])) for m in range(blocks) if kept[b, m, n]
                    for half in (0, 1)]
            assert sorted(visited) == sorted(want), (b, n)
            assert [start for start, _ in visited] == sorted((s for s, _ in want), key=lambda s: (
                bool(full[b, s // 128, n]), s), reverse=True), "full blocks from the last, then partial ones"
            for start, _ in visited:
                got = turn(start, n, b, **{k: scalars.get(k) for k in turn_names[3:]})
                assert got == int(kept[b, start // 128, :n].sum()), (b, n, start)
