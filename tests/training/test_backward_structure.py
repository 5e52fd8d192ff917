"""The shape of what `lower-backward` builds, and properties of the compiled backward.

* which kernels `@f_backward` launches under each rope-fusion strategy (no pre-kernel with
  `fused`; the recomputed pre-kernels and their transposes with `hybrid` / `separate`), in
  which order, and that the returned gradients are what those launches write;
* `attnfuse.grad_of`: one argument index per result, with the argument's type;
* determinism: two backward runs give bit-identical gradients;
* the disk cache: a program compiled a second time (cache hit) runs the same backward;
* every backward kernel of every example compiles for sm_90 (in this process, through
  `attnfuse.backends.triton.sm90.compile_kernel_for_sm90`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, ModuleOp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from programs import Builder, Program

import attnfuse
from attnfuse.backends.triton.sm90 import (
    SM90_PTX_TARGET,
    compile_kernel_for_sm90,
    ptx_target,
)
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.host import LaunchOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_hopper import KernelOp as HopperKernelOp
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import DEFAULT_PIPELINE, default_pipeline
from attnfuse.testing import make_inputs

STRATEGIES = ("fused", "hybrid", "separate")
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.attn"))
EXAMPLE_TEXT = {p.stem: p.read_text() for p in EXAMPLES}
WITH_TRANSFORMS = {"document", "gemma2", "gpt_oss", "llama3", "llama3_1", "qwen3"}
PIPELINE = (
    "attn-canonicalize,rope-fusion{{strategy={}}},online-softmax,mask-tiling{{block-m=16 block-n=16}},"
    "lower-backward{{block-m=16 block-n=16 transforms-in-kernel=true hopper-backward=false}},lower-to-tile"
)
"""The Triton backward kernels alone: the Hopper schedule's guarded path, which the default
adds for the programs it serves, is tested in tests/lowering/test_hopper_backward.py."""


@pytest.fixture(scope="module", autouse=True)
def _fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("attnfuse_cache")))
        yield


_COMPILED: dict[tuple[str, str], attnfuse.api.AttentionFunction] = {}


def compile_once(text: str, pipeline: str) -> attnfuse.api.AttentionFunction:
    """attnfuse.compile, memoised: one cache miss per program (the cache-hit path is
    only exercised by test_backward_from_disk_cache)."""
    if (text, pipeline) not in _COMPILED:
        _COMPILED[(text, pipeline)] = attnfuse.compile(text, pipeline=pipeline)
    return _COMPILED[(text, pipeline)]


def lower(text: str, pipeline: str) -> ModuleOp:
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, text, "<test>")
    PassManager(pipeline).run(module, ctx, locations=locations)
    return module


def backward_of(module: ModuleOp) -> func.FuncOp:
    found = [
        op
        for op in module.ops
        if isinstance(op, func.FuncOp) and op.sym_name.data.endswith("_backward")
    ]
    assert len(found) == 1, [op.sym_name.data for op in found]
    return found[0]


def launches(function: func.FuncOp) -> list[LaunchOp]:
    return [op for op in function.walk() if isinstance(op, LaunchOp)]


def launched(function: func.FuncOp) -> list[str]:
    return [op.kernel.root_reference.data for op in launches(function)]


def kernels(module: ModuleOp) -> dict[str, KernelOp]:
    return {op.sym_name.data: op for op in module.walk() if isinstance(op, KernelOp)}


def grad_of(function: func.FuncOp) -> list[int]:
    attr = function.attributes["attnfuse.grad_of"]
    assert isinstance(attr, ArrayAttr)
    return [int(a.value.data) for a in attr.data]  # type: ignore[attr-defined]


# ============================================================================ launches per strategy


@pytest.mark.parametrize("name", sorted(EXAMPLE_TEXT))
def test_fused_backward_has_no_prekernel(name: str) -> None:
    """strategy=fused: @f_backward launches preprocess, dQ, dK/dV (and the block map for
    runtime maps) and nothing that runs a Q/K transform outside them."""
    module = lower(EXAMPLE_TEXT[name], PIPELINE.format("fused"))
    bwd = backward_of(module)
    names = launched(bwd)
    assert not [n for n in names if "prologue" in n], names
    assert not [k for k in kernels(module) if "_bwd" in k and "prologue" in k]
    expected = [f"{name}_bwd_preprocess", f"{name}_bwd_dq", f"{name}_bwd_dkdv"]
    # (rope tables hold cos/sin per position and schedules the slots of a packed batch;
    # they transform nothing)
    assert [n for n in names if not n.endswith("_block_map") and "_rope_table" not in n
            and "_schedule_" not in n] == expected
    # the returned dq / dk / dv are written by the dQ and dK/dV launches themselves
    ret = bwd.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    dq_launch, dkdv_launch = launches(bwd)[-2:]
    assert ret.operands[0] in dq_launch.args
    assert ret.operands[1] in dkdv_launch.args and ret.operands[2] in dkdv_launch.args


def test_fused_backward_from_lowered_ir() -> None:
    """The same, read from what attnfuse.compile keeps (`fn.lowered_ir`), when the
    backward keeps the transforms in its kernels (`transforms-in-kernel=true`)."""
    fn = compile_once(
        EXAMPLE_TEXT["qwen3"],
        default_pipeline({"rope-fusion": "strategy=fused", "lower-backward": "transforms-in-kernel=true"}),
    )
    host = fn.lowered_ir[fn.lowered_ir.index("func.func @qwen3_backward") :]
    host = host[: host.index("func.return")]
    assert "host.launch @qwen3_bwd_dq" in host and "host.launch @qwen3_bwd_dkdv" in host
    assert "prologue" not in host


def test_fused_backward_prerotates_by_default() -> None:
    """Under the default lower-backward, a fused forward still gets a backward that runs
    its transforms once in pre-kernels (not once per visited tile in dQ / dK/dV)."""
    module = lower(EXAMPLE_TEXT["qwen3"], default_pipeline({"rope-fusion": "strategy=fused"}))
    names = launched(backward_of(module))
    assert "qwen3_bwd_q_prologue" in names and "qwen3_bwd_k_prologue_transpose" in names, names
    forward = next(f for f in module.ops if isinstance(f, func.FuncOp) and f.sym_name.data == "qwen3")
    assert not [n for n in launched(forward) if "prologue" in n]


@pytest.mark.parametrize("epilogue", [True, False], ids=["epilogue", "transposes"])
@pytest.mark.parametrize("strategy", ["hybrid", "separate"])
@pytest.mark.parametrize("name", sorted(WITH_TRANSFORMS))
def test_prekernel_backward(name: str, strategy: str, epilogue: bool) -> None:
    """hybrid / separate: Q and K transforms recomputed in pre-kernels before the main
    kernels. With `rotate-in-epilogue=true`, a side whose transforms are all RoPE gets
    dq / dk straight from the main kernels (rotated back in their epilogue); otherwise
    transposes after them turn d(rotated) into dq / dk."""
    pipeline = PIPELINE.format(strategy).replace(
        "transforms-in-kernel=true", f"transforms-in-kernel=true rotate-in-epilogue={str(epilogue).lower()}")
    module = lower(EXAMPLE_TEXT[name], pipeline)
    bwd = backward_of(module)
    names = [n for n in launched(bwd) if not n.endswith("_block_map") and "_rope_table" not in n]
    p = f"{name}_bwd_"
    transposed = not epilogue or name == "qwen3"  # qwen3's sides carry a QK-norm
    assert names == [p + "q_prologue", p + "k_prologue", p + "preprocess", p + "dq", p + "dkdv"] + (
        [p + "q_prologue_transpose", p + "k_prologue_transpose"] if transposed else [])
    assert set(names) <= set(kernels(module))
    by_name = {op.kernel.root_reference.data: op for op in launches(bwd)}
    ret = bwd.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    for tag, index, main in (("q", 0, "dq"), ("k", 1, "dkdv")):
        if transposed:  # dq / dk come out of the transposes, which read what dQ and dK/dV wrote
            transpose = by_name[f"{p}{tag}_prologue_transpose"]
            assert ret.operands[index] in transpose.args
            assert any(a in transpose.args for a in by_name[p + main].args[-2:])
        else:  # written by the main kernel itself, in the input dtype
            assert ret.operands[index] in by_name[p + main].args
            assert ret.operands[index].type == bwd.body.block.args[index].type
    # the main kernels read the pre-kernels' outputs, not the raw q / k
    q_arg, k_arg = bwd.body.block.args[0], bwd.body.block.args[1]
    assert q_arg not in by_name[p + "dq"].args and k_arg not in by_name[p + "dkdv"].args


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["alibi", "dropout", "t5_bias"])
def test_no_transforms_no_prekernel(name: str, strategy: str) -> None:
    bwd = backward_of(lower(EXAMPLE_TEXT[name], PIPELINE.format(strategy)))
    assert launched(bwd) == [
        f"{name}_bwd_preprocess",
        f"{name}_bwd_dq",
        f"{name}_bwd_dkdv",
    ]


def test_one_side_transform_separate() -> None:
    """RoPE on Q only, separate: a Q pre-kernel and its transpose (in the dQ epilogue
    with `rotate-in-epilogue=true`), nothing for K."""
    p = Builder(hq=2, hkv=1, d=32).rope("q").mask("causal").build()
    transposes = PIPELINE.format("separate").replace("transforms-in-kernel=true", "rotate-in-epilogue=false")
    names = launched(backward_of(lower(p.text, transposes)))
    assert names == ["f_bwd_rope_table0", "f_bwd_q_prologue", "f_bwd_preprocess", "f_bwd_dq", "f_bwd_dkdv",
                     "f_bwd_q_prologue_transpose"]
    epilogue = PIPELINE.format("separate").replace("transforms-in-kernel=true", "rotate-in-epilogue=true")
    names = launched(backward_of(lower(p.text, epilogue)))
    assert names == ["f_bwd_rope_table0", "f_bwd_q_prologue", "f_bwd_preprocess", "f_bwd_dq", "f_bwd_dkdv"]


def test_document_backward_block_map() -> None:
    """Document masks: the backward builds its own runtime block map before the dQ kernel."""
    names = launched(
        backward_of(lower(EXAMPLE_TEXT["document"], PIPELINE.format("fused")))
    )
    assert "document_bwd_block_map" in names
    assert names.index("document_bwd_block_map") < names.index("document_bwd_dq")


# ============================================================================ grad_of

EXPECTED_GRAD_OF = {
    "alibi": [0, 1, 2],
    "document": [0, 1, 2],  # positions and document ids are integers
    "dropout": [0, 1, 2],  # the seed is an integer
    "gemma2": [0, 1, 2],
    "gpt_oss": [0, 1, 2, 3],  # sinks
    "llama3": [0, 1, 2],
    "llama3_1": [0, 1, 2],
    "qwen3": [0, 1, 2, 3, 4],  # q_norm / k_norm weights
    "t5_bias": [0, 1, 2, 3],  # the [1, H, S, S] bias
}


@pytest.mark.parametrize("name", sorted(EXAMPLE_TEXT))
def test_grad_of_examples(name: str) -> None:
    bwd = backward_of(lower(EXAMPLE_TEXT[name], PIPELINE.format("hybrid")))
    forward = next(
        op
        for op in lower(EXAMPLE_TEXT[name], "attn-canonicalize").ops
        if isinstance(op, func.FuncOp)
    )
    indices = grad_of(bwd)
    assert sorted(indices) == EXPECTED_GRAD_OF.get(name, sorted(indices))
    outputs = bwd.function_type.outputs.data
    assert len(outputs) == len(indices) == len(set(indices))
    for i, ty in zip(indices, outputs):
        assert ty == forward.args[i].type, (i, ty)
    # arguments: the forward's, then out, lse, d_out, d_lse
    n = len(forward.args)
    assert [a.name_hint for a in bwd.body.block.args[n:]] == [
        "out",
        "lse",
        "d_out",
        "d_lse",
    ]
    assert list(bwd.function_type.inputs.data[:n]) == [a.type for a in forward.args]


def _all_learnables() -> Program:
    b = Builder(hq=4, hkv=2, d=32)
    pos = b.positions(2)
    b.qk_norm(weight="f32").rope(positions=pos).alibi(slopes=True).bias(
        (1, 4, "?", "?")
    )
    return b.mask("causal").build(sinks=True)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_grad_of_every_learnable(strategy: str) -> None:
    """q, k, v, both norm weights, slopes, bias and sinks: one result each; positions none."""
    p = _all_learnables()
    names = [a.name for a in p.args]
    bwd = backward_of(lower(p.text, PIPELINE.format(strategy)))
    got = {names[i] for i in grad_of(bwd)}
    assert got == {"q", "k", "v", "wq", "wk", "slopes", "bias", "sinks"}
    assert "pos" not in got


def test_gradients_method_slots() -> None:
    """fn.gradients puts each result at its argument's index; None for the rest."""
    p = _all_learnables()
    fn = compile_once(p.text, PIPELINE.format("fused"))
    args = p.inputs(2, 21, 21)
    out, lse = fn(*args, return_lse=True)
    grads = fn.gradients(args, out, lse, torch.randn_like(out))
    for a, grad, arg in zip(p.args, grads, args):
        if a.name == "pos":
            assert grad is None
        else:
            assert (
                grad is not None and grad.shape == arg.shape and grad.dtype == arg.dtype
            ), a.name


# ============================================================================ determinism


def _grad_runs(
    text: str, args: list[Any], pipeline: str, *, memo: bool = True, times: int = 2
) -> list[list[Any]]:
    """The float gradients of `times` forward + backward runs of one compiled function."""
    fn = (
        compile_once(text, pipeline)
        if memo
        else attnfuse.compile(text, pipeline=pipeline)
    )
    g = None
    runs = []
    for _ in range(times):
        leaves = [
            a.detach().clone().requires_grad_(True)
            if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a
            for a in args
        ]
        out = fn(*leaves)
        if g is None:
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(
                out.dtype
            )
        out.backward(g)
        runs.append(
            [
                leaf.grad
                for leaf in leaves
                if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
            ]
        )
    return runs


@pytest.mark.parametrize("strategy", ["fused", "separate"])
def test_backward_is_deterministic(strategy: str) -> None:
    """Two backward runs: bit-identical gradients (GQA, weights, slopes, broadcast bias,
    sinks: every reduction is a fixed-order partial sum, no atomics)."""
    p = _all_learnables()
    first, second = _grad_runs(p.text, p.inputs(2, 29, 29), PIPELINE.format(strategy))
    assert len(first) == 8
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_dropout_backward_is_deterministic() -> None:
    p = Builder(hq=2, hkv=1, d=32, dtype="bf16").mask("causal").build(dropout=0.3)
    first, second = _grad_runs(p.text, p.inputs(2, 29, 29), PIPELINE.format("fused"))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# ============================================================================ disk cache

CACHE_PROGRAMS = {
    "rope": lambda b: b.rope().mask("causal").build(),
    "sinks": lambda b: b.mask("causal").build(sinks=True),
    "norm_weight": lambda b: b.qk_norm(weight="f32").build(),
    "bias": lambda b: b.bias((1, 2, "?", "?")).build(),
    "slopes": lambda b: b.alibi(slopes=True).build(),
}


@pytest.mark.parametrize("name", list(CACHE_PROGRAMS))
def test_backward_from_disk_cache(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled twice into one cache dir: the second (a cache hit) gives bit-identical gradients."""
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path))
    p = CACHE_PROGRAMS[name](Builder(hq=2, hkv=1, d=32))
    args = p.inputs(2, 21, 21)
    (miss,) = _grad_runs(p.text, args, PIPELINE.format("fused"), memo=False, times=1)
    (hit,) = _grad_runs(p.text, args, PIPELINE.format("fused"), memo=False, times=1)
    for a, b in zip(miss, hit):
        assert torch.equal(a, b)


# ============================================================================ sm_90


def _sm90_kernels(name: str) -> tuple[dict[str, KernelOp], bool]:
    """Every Triton backward kernel of one example under the default pipeline (strategy
    auto: pre-kernels and their transposes; block maps) and, for qwen3 (QK-norm and RoPE),
    the dQ / dK/dV kernels of strategy fused, which run the transforms and their
    transposes inside; and whether the Hopper backward's Gluon kernel is built too
    (compiled in tests/lowering/test_hopper_backward.py)."""
    text = EXAMPLE_TEXT[name]
    module = lower(text, DEFAULT_PIPELINE)
    found = {f"default:{k}": kernel for k, kernel in kernels(module).items() if "_bwd" in k}
    if name == "qwen3":
        fused = kernels(
            lower(text, default_pipeline({"rope-fusion": "strategy=fused", "lower-backward": "transforms-in-kernel=true"}))
        )
        found.update(
            {f"fused:{k}": fused[k] for k in (f"{name}_bwd_dq", f"{name}_bwd_dkdv")}
        )
    return found, any(isinstance(op, HopperKernelOp) and op.sym_name.data.endswith("_bwd_ws") for op in module.walk())


@pytest.mark.parametrize("name", sorted(EXAMPLE_TEXT))
def test_backward_kernels_compile_for_sm90(name: str) -> None:
    found, hopper = _sm90_kernels(name)
    short = {label.split(":")[1] for label in found}
    assert {f"{name}_bwd_preprocess", f"{name}_bwd_dq", f"{name}_bwd_dkdv"} <= short
    transposes = {f"{name}_bwd_q_prologue_transpose", f"{name}_bwd_k_prologue_transpose"}
    if name == "qwen3":
        # QK-norm before RoPE: the transposes take dq / dk back through both
        assert transposes <= short
    elif hopper and name in WITH_TRANSFORMS:
        # RoPE alone: the Hopper schedule's path takes its f32 dQ through Q's transpose
        # and rotates dK back in its epilogue, as the Triton dQ and dK/dV epilogues do
        assert transposes & short == {f"{name}_bwd_q_prologue_transpose"}
    else:  # RoPE alone (or nothing) is undone in the dQ and dK/dV epilogues
        assert not transposes & short
    if name == "document":
        assert "document_bwd_block_map" in short
    failures = []
    for label, kernel in found.items():
        try:
            target = ptx_target(compile_kernel_for_sm90(kernel))
        except Exception as e:  # noqa: BLE001 - collect every failing kernel
            failures.append(f"{label}: {type(e).__name__}: {str(e)[:300]}")
            continue
        if not target.startswith(SM90_PTX_TARGET):
            failures.append(f"{label}: {target}")
    assert not failures, "\n".join(failures)


def test_sm90_does_not_disturb_the_interpreter() -> None:
    """After compiling for sm_90 in this process, kernels still run on the CPU."""
    p = Builder(hq=2, hkv=1, d=32).mask("causal").build()
    fn = compile_once(p.text, PIPELINE.format("fused"))
    args = make_inputs(
        next(
            op
            for op in lower(p.text, "attn-canonicalize").ops
            if isinstance(op, func.FuncOp)
        ),
        2,
        21,
        21,
    )
    leaves = [a.clone().requires_grad_(True) for a in args]
    fn(*leaves).sum().backward()
    assert all(torch.isfinite(leaf.grad).all() for leaf in leaves)
