"""Every kernel of every example, under each rope-fusion strategy, compiles for sm_90.

The default pipeline's block sizes (what a Hopper GPU runs) with each strategy; the
kernels are collected with a PassManager and compiled by
`attnfuse.backends.triton.sm90.compile_all`, one subprocess per strategy (a process
that interprets kernels cannot compile them), the three subprocesses side by side.
A kernel whose Triton source is the same as one already compiled, for another strategy
(programs without Q/K transforms, block-map kernels) or for another program but for the
kernel's name (llama3 and llama3_1 differ in host-side tables only), is compiled once:
83 distinct sources of 111 kernels, 60 once renamed. Besides the
examples: a custom per-head mask (runtime block map per head, captured table, scalar
capture, score_mod with a gather) and a program with every score op and dropout.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from programs import STRATEGIES, Builder

from attnfuse import examples
from attnfuse.backends.triton.sm90 import compile_all, source_named_kernel
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.tile import KernelOp
from attnfuse.pass_manager import PassManager, make_context

PIPELINE = "attn-canonicalize,rope-fusion{{strategy={}}},online-softmax,mask-tiling,lower-to-tile"


def _extra_programs() -> dict[str, str]:
    b = Builder("custom_head", hq=8, hkv=2, d=128, dtype="bf16")
    lim = b.table("lim", 8, "i32")
    tab = b.table("rel", 32)
    temp = b.arg("temp", "f32", lambda *_: 1.0)
    b.qk_norm(weight="bf16").rope(style="interleaved", rotary_dim=64)
    b.score_mod(
        """
        %d$ = arith.subi %q$, %kv$ : index
        %z$ = arith.constant 0 : index
        %c31$ = arith.constant 31 : index
        %a$ = arith.maxsi %d$, %z$ : index
        %i$ = arith.minsi %a$, %c31$ : index
        %w$ = tensor.extract %c0$[%i$] : tensor<32xf32>
        %y$ = arith.addf %x$, %w$ : f32
        %t$ = arith.mulf %y$, %c1$ : f32
        attn.yield %t$ : f32
    """,
        tab,
        temp,
    )
    b.custom_mask(
        """
        %n$ = tensor.extract %c0$[%h$] : tensor<8xi32>
        %ni$ = arith.index_cast %n$ : i32 to index
        %w$ = arith.addi %q$, %ni$ : index
        %keep$ = arith.cmpi sle, %kv$, %w$ : index
        attn.yield %keep$ : i1
    """,
        lim,
    )
    custom = b.build(sinks=True, lse=True).text

    b = Builder("everything", hq=6, hkv=3, d=80, dv=96, dtype="f16")
    pos = b.positions(2)
    plen = b.prefix_lengths()
    b.rope(positions=pos, scaling="llama3", factor=8.0).alibi().bias(
        (1, 6, "?", "?"), dtype="f16"
    )
    b.softcap(30.0).mask("prefix_lm", plen).mask(
        "sliding_window", left=100, align="bottom_right"
    )
    everything = b.build(dropout=0.1).text
    return {"custom_head": custom, "everything": everything}


def _programs() -> dict[str, str]:
    programs = {name: examples.path(name).read_text() for name in examples.names()}
    programs.update(_extra_programs())
    return programs


def _kernels(strategy: str) -> list[KernelOp]:
    kernels: list[KernelOp] = []
    for name, text in _programs().items():
        ctx = make_context()
        module, locations = parse_module_with_locations(ctx, text, name)
        PassManager(PIPELINE.format(strategy)).run(module, ctx, locations=locations)
        found = [op for op in module.walk() if isinstance(op, KernelOp)]
        assert any(k.sym_name.data == f"{name}_fwd" for k in found), name
        kernels += found
    return kernels


@pytest.fixture(scope="module")
def compiled() -> dict[str, tuple[list[str], dict[str, str]]]:
    """strategy -> (all its kernel names, {kernel name: PTX .target line}); a kernel
    whose source is the same as one already compiled (another strategy's, or another
    program's but for the name) gets that one's line."""
    first: dict[str, tuple[str, str]] = {}  # renamed source -> (strategy, kernel) compiled
    todo: dict[str, list[KernelOp]] = {s: [] for s in STRATEGIES}
    compiled_as: dict[str, dict[str, tuple[str, str]]] = {}
    names: dict[str, list[str]] = {}
    for strategy in STRATEGIES:
        compiled_as[strategy] = {}
        kernels = _kernels(strategy)
        names[strategy] = [k.sym_name.data for k in kernels]
        for k in kernels:
            source = source_named_kernel(k)
            if source not in first:
                first[source] = (strategy, k.sym_name.data)
                todo[strategy].append(k)
            compiled_as[strategy][k.sym_name.data] = first[source]
    with ThreadPoolExecutor(len(STRATEGIES)) as pool:
        futures = {s: pool.submit(compile_all, todo[s]) for s in STRATEGIES if todo[s]}
        targets = {s: f.result() for s, f in futures.items()}
    return {
        s: (names[s], {name: targets[rs][rn] for name, (rs, rn) in compiled_as[s].items() if rn in targets.get(rs, {})})
        for s in STRATEGIES
    }


def test_kernels_found() -> None:
    names = [k.sym_name.data for k in _kernels("separate")]
    assert "document_block_map" in names and "custom_head_block_map" in names
    assert "llama3_q_prologue" in names and "llama3_k_prologue" in names
    assert len(names) == len(set(names))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_compiles_for_sm90(strategy: str, compiled: dict[str, tuple[list[str], dict[str, str]]]) -> None:
    names, targets = compiled[strategy]
    assert set(targets) == set(names), "every kernel is compiled"
    if strategy != "fused":
        suffix = "_k_prologue" if strategy == "hybrid" else "_q_prologue"
        assert any(n.endswith(suffix) for n in targets), "pre-kernels are compiled"
    for name, target in targets.items():
        assert target.startswith(".target sm_90"), f"{name}: {target}"
