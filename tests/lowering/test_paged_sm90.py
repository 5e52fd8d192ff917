"""The paged kernels compile for Hopper (sm_90) without spills and within shared memory.

The forward and split-KV kernels of paged programs of the default pipeline (Llama-3-8B
with RoPE on the new queries, gpt-oss with a window and sinks, an f32 MQA program;
pages of 16) and the append kernel (with and without RoPE), compiled as the JIT
specializes them (contiguous tensors, 16-aligned sizes), checked with ptxas: no more
spill stores than the same kernel on a contiguous cache (none, but for the f32 forward
kernel at D = 128, whose dots spill on a contiguous cache too: 116 bytes there, 144
paged, within `F32_FORWARD_SPILL_SLACK`), no spills in a loop of
the split-KV kernels (gpt-oss's wide kernel parks one register, 4 bytes, from before its
loops to after them: one store and one load per program) and none at all in the append
kernels, at most the 232448 bytes of shared memory a block may
use on sm_90, and the split kernels within half an SM's (two programs per SM), but for
the wide one (one program per SM).
"""

from __future__ import annotations

import re

import pytest
from test_split_kv_sm90 import program as contiguous_program
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType, bf16

from attnfuse.backends.triton.sm90 import compile_kernel_for_sm90, ptxas_usage, spills_in_loops
from attnfuse.dialects.attn import RopeOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.lowering.append import build_append
from attnfuse.lowering.tile_fit import SHARED_MEMORY_BUDGET
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import DEFAULT_PIPELINE
from attnfuse.reference import parse_program

SM90_SHARED_LIMIT = 232448
F32_FORWARD_SPILL_SLACK = 32
"""Spill bytes an f32 paged forward kernel may have beyond the contiguous one: ptxas
places the spills of the f32 kernel (255 registers either way) differently for each
loop structure (104 paged against 116 with a loop for the empty masked range below a
causal band, 144 against 116 without it)."""


def program(hq: int, hkv: int, d: int, dtype: str, *, window: int | None = None, sinks: bool = False,
            rope: bool = False) -> str:
    q, pool = f"tensor<?x{hq}x?x{d}x{dtype}>", f"tensor<?x{hkv}x16x{d}x{dtype}>"
    s = f"!attn.scores<?x{hq}x?x?xf32>"
    args = f"%q: {q}, %kc: {pool}, %vc: {pool}, %bt: tensor<?x?xi32>, %lens: tensor<?xi32>"
    args += ", %pos: tensor<?x?xi32>" if rope else ""
    args += f", %sinks: tensor<{hq}xf32>" if sinks else ""
    lines = [f"%s = attn.scores {'%qr' if rope else '%q'}, %kc block_table %bt kv_lens %lens : {q}, {pool}, "
             f"tensor<?x?xi32>, tensor<?xi32> -> {s}",
             f'%m = attn.mask causal %s {{align = "bottom_right"}} : {s}']
    if rope:
        lines.insert(0, f"%qr = attn.rope %q positions %pos {{theta = 500000.0}} : {q}, tensor<?x?xi32>")
    if window is not None:
        lines.append(f'%w = attn.mask sliding_window %m {{align = "bottom_right", left = {window}}} : {s}')
    last = "%w" if window is not None else "%m"
    sink = f" sinks %sinks : {s}, tensor<{hq}xf32>" if sinks else f" : {s}"
    lines.append(f"%p = attn.softmax {last}{sink} -> !attn.probs<?x{hq}x?x?xf32>")
    lines.append(f"%o = attn.weighted_sum %p, %vc : !attn.probs<?x{hq}x?x?xf32>, {pool} -> {q}")
    body = "\n  ".join(lines)
    return f"func.func @f({args}) -> {q} {{\n  {body}\n  func.return %o : {q}\n}}"


CASES = {
    "llama3_8b": ((32, 8, 128, "bf16"), {"rope": True}),
    "gpt_oss": ((64, 8, 64, "bf16"), {"window": 127, "sinks": True}),
    "mqa_f32": ((16, 2, 128, "f32"), {}),
}


def _kernels(text: str) -> dict[str, KernelOp]:
    module = parse_program(text)
    PassManager(DEFAULT_PIPELINE).run(module, make_context())
    return {op.sym_name.data: op for op in module.walk() if isinstance(op, KernelOp)}


def _check(kernel: KernelOp, what: str, allowed_spills: int | None = 0) -> int:
    """Shared memory of `kernel`, compiled; no more spill bytes than `allowed_spills`
    (None: no spill inside a loop)."""
    compiled = compile_kernel_for_sm90(kernel, specialize=True)
    usage = ptxas_usage(compiled)
    shared = compiled.metadata.shared
    if allowed_spills is None:
        assert not spills_in_loops(compiled), f"{what}: spills in a loop, {usage}"
    else:
        assert usage["spill_bytes"] <= allowed_spills, f"{what}: {usage}, a contiguous cache: {allowed_spills}"
    assert shared <= SM90_SHARED_LIMIT, f"{what}: {shared} bytes of shared memory"
    return int(shared)


@pytest.mark.parametrize("name", list(CASES))
def test_paged_kernels_compile_for_sm90(name: str) -> None:
    shape, options = CASES[name]
    kernels = _kernels(program(*shape, **options))
    assert not [k for k in kernels if "_bwd" in k], kernels  # lower-backward skipped the paged program
    contiguous = _kernels(contiguous_program(*shape, **options))["f_fwd"]
    allowed = ptxas_usage(compile_kernel_for_sm90(contiguous, specialize=True))["spill_bytes"]
    allowed += F32_FORWARD_SPILL_SLACK if allowed else 0
    _check(kernels["f_fwd"], f"{name} f_fwd", allowed)
    if allowed:  # the split tiers' check finds spills in loops: the f32 forward kernel's are
        assert spills_in_loops(compile_kernel_for_sm90(kernels["f_fwd"], specialize=True))
    for tier in ("f_split_kv", "f_split_kv_i64", "f_split_kv_small", "f_split_kv_short", "f_split_kv_wide",
                 "f_split_kv_persistent"):
        if tier in kernels:
            shared = _check(kernels[tier], f"{name} {tier}", None)
            if tier != "f_split_kv_wide":  # the wide kernel's calls fit one wave, one program per SM
                assert shared <= SHARED_MEMORY_BUDGET // 2, f"{name} {tier}: {shared} bytes, more than half an SM"
            elif name == "llama3_8b":  # three stages of 128-key K and V tiles
                assert shared > SHARED_MEMORY_BUDGET // 2, f"{name} {tier}: {shared} bytes, half an SM or less"
    assert ("f_split_kv_wide" in kernels) == (name != "mqa_f32"), sorted(kernels)  # 16-bit inputs only


def _kv_buffers(kernel: KernelOp) -> int:
    """The deepest ring of K/V tiles (`[n, BN, D]` shared-memory buffers) in the kernel's TTGIR."""
    ttgir = compile_kernel_for_sm90(kernel, specialize=True).asm["ttgir"]
    rings = re.findall(r"ttg\.local_alloc[^\n]*!ttg\.memdesc<(\d+)x\d+x\d+x(?:bf16|f16|f32)", ttgir)
    assert rings, "no pipelined K/V tiles"
    return max(int(n) for n in rings)


@pytest.mark.parametrize("name", list(CASES))
def test_paged_kernels_keep_the_contiguous_pipeline_depth(name: str) -> None:
    """The block-table load takes pipeline stages of its own: paged kernels ask for two
    more (`tile_fit.kv_stages`) so that their K/V tiles are buffered as deep as on a
    contiguous cache (Llama-3-8B: 3), within the shared memory (half an SM for the split
    kernel)."""
    shape, options = CASES[name]
    paged = _kernels(program(*shape, **options))
    contiguous = _kernels(contiguous_program(*shape, **options))
    for kernel in ("f_fwd", "f_split_kv", "f_split_kv_small", "f_split_kv_wide"):
        if kernel in contiguous:
            assert _kv_buffers(paged[kernel]) == _kv_buffers(contiguous[kernel]), kernel
    if name == "llama3_8b":
        assert _kv_buffers(paged["f_split_kv"]) == _kv_buffers(paged["f_fwd"]) == 3


@pytest.mark.parametrize("rope", [False, True])
def test_append_kernel_compiles_for_sm90(rope: bool) -> None:
    pool = TensorType(bf16, [DYNAMIC_INDEX, 8, 16, 128])
    op = None
    if rope:
        ty = "tensor<?x8x?x128xbf16>"
        text = (f"func.func @r(%k: {ty}) -> {ty} {{\n  %r = attn.rope %k {{theta = 500000.0, scaling = \"llama3\", "
                f"factor = 8.0}} : {ty}\n  func.return %r : {ty}\n}}")
        op = next(o for o in parse_program(text).walk() if isinstance(o, RopeOp))
    module = build_append("append_paged_kv", pool, pool, op)
    kernel = next(o for o in module.ops if isinstance(o, KernelOp))
    _check(kernel, f"append (rope={rope})")


@pytest.mark.parametrize("name", ["llama3_8b", "gpt_oss"])
def test_cache_lengths_kernels_compile_for_sm90(name: str) -> None:
    """A contiguous cache with lengths (`kv_lens` without a block table): the forward and
    split kernels compile with the spills and shared memory of the contiguous ones (they
    only read one length per program more)."""
    shape, options = CASES[name]
    text = contiguous_program(*shape, **options)
    q_type = text.split("%q: ")[1].split(",")[0]
    lens_text = text.replace("%v: ", "%lens: tensor<?xi32>, %v: ").replace(
        f"attn.scores {'%qr' if options.get('rope') else '%q'}, %k :",
        f"attn.scores {'%qr' if options.get('rope') else '%q'}, %k kv_lens %lens :").replace(
        f"{q_type}, tensor<?x{shape[1]}x?x{shape[2]}x{shape[3]}> -> !attn.scores",
        f"{q_type}, tensor<?x{shape[1]}x?x{shape[2]}x{shape[3]}>, tensor<?xi32> -> !attn.scores")
    assert "kv_lens %lens" in lens_text and "tensor<?xi32> -> !attn.scores" in lens_text
    lens, plain = _kernels(lens_text), _kernels(text)
    assert not [k for k in lens if "_bwd" in k], lens  # inference only
    for kernel in ("f_fwd", "f_split_kv", "f_split_kv_small", "f_split_kv_persistent"):
        if kernel in plain:
            allowed = ptxas_usage(compile_kernel_for_sm90(plain[kernel], specialize=True))["spill_bytes"]
            shared = _check(lens[kernel], f"{name} {kernel}", allowed)
            if kernel != "f_fwd":
                assert shared <= SHARED_MEMORY_BUDGET // 2, f"{name} {kernel}: {shared} bytes, more than half an SM"
