"""`f32-dot`: the precision of the dots of f32 programs (`tile.dot {precision}`).

The default `tf32x3` multiplies on the tensor cores with three TF32 products (about fp32
accuracy; `DEFAULT_F32_DOT`); `ieee` on the FMA units (what flex_attention does under
PyTorch's default matmul precision); `tf32` one TF32 product. The default f32 tiles
follow the precision. The Triton interpreter multiplies in fp32 whatever the precision,
so the runs here check the plumbing (every f32 dot of every kernel carries the option;
results stay right), not TF32 rounding, which only a GPU shows (tests/gpu).
"""

from __future__ import annotations

import re

import pytest
from programs import Builder
from xdsl.dialects.builtin import bf16, f32
from xdsl.utils.exceptions import VerifyException

import attnfuse
from attnfuse import reference
from attnfuse.dialects.attn import OnlineSoftmaxOp
from attnfuse.dialects.tile import DotOp, KernelOp
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.driver import AttnfuseOptMain
from attnfuse.pass_manager import PassManager, PipelineError, make_context
from attnfuse.passes import DEFAULT_PIPELINE
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.testing import assert_close


def pipeline(precision: str) -> str:
    options = f"f32-dot={precision}"
    return ("attn-canonicalize,rope-fusion{strategy=separate},online-softmax,mask-tiling{block-m=16 block-n=16},"
            f"lower-backward{{block-m=16 block-n=16 {options}}},lower-to-tile{{{options}}}")


@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_every_f32_dot_carries_the_precision(precision: str) -> None:
    p = Builder(hq=2, hkv=1, d=32).bias([1, 2, "?", "?"]).mask("causal").build()
    fn = attnfuse.compile(p.text, pipeline=pipeline(precision))
    dots = re.findall(r"tl\.dot\([^\n]*", fn.triton_source)
    assert len(dots) >= 7  # forward 2, dQ 3, dK/dV 4
    assert all(f'input_precision="{precision}"' in d for d in dots)
    args = p.inputs(2, 37, 37, seed=2)
    assert_close(fn(*args), reference.run(p.text, *args))


def test_16bit_dots_ignore_the_option() -> None:
    p = Builder(hq=2, hkv=1, d=32, dtype="bf16").mask("causal").build()
    source = attnfuse.compile(p.text, pipeline=pipeline("tf32x3")).triton_source
    assert "tl.dot(" in source and "input_precision" not in source


def test_unknown_precision_is_an_error() -> None:
    p = Builder(hq=2, hkv=1, d=32).build()
    with pytest.raises(Exception, match="f32-dot must be one of ieee, tf32x3, tf32"):
        attnfuse.compile(p.text, pipeline=pipeline("bf16x3"))


def test_dot_verifier() -> None:
    for element, precision, message in ((bf16, "tf32x3", "f32 operands only"), (f32, "fast", "must be one of")):
        b = TileBuilder.kernel("k", [])
        a = b.zeros((16, 16), element)
        with pytest.raises(VerifyException, match=message):
            DotOp(a, a, precision=precision).verify()


def _lowered(text: str, f32_dot: str) -> tuple[tuple[int, int], dict[str, KernelOp]]:
    """The forward tile plan mask-tiling records and the kernels of the default pipeline,
    both under `PassManager(f32_dot=...)`."""
    modules = []
    for pipeline in ("attn-canonicalize,rope-fusion,online-softmax,mask-tiling", DEFAULT_PIPELINE):
        ctx = make_context()
        module, locations = parse_module_with_locations(ctx, text, "f32.attn")
        PassManager(pipeline, f32_dot=f32_dot).run(module, ctx, locations=locations)
        modules.append(module)
    plan = next(op for op in modules[0].walk() if isinstance(op, OnlineSoftmaxOp)).tile_plan
    assert plan is not None
    kernels = {op.sym_name.data: op for op in modules[1].walk() if isinstance(op, KernelOp)}
    return (plan.block_m.data, plan.block_n.data), kernels


@pytest.mark.parametrize(("f32_dot", "head_dim", "forward", "warps", "backward"), [
    ("", 64, (128, 64), 8, 32), ("ieee", 64, (64, 32), 8, 32), ("", 256, (64, 32), 4, 16),
    ("tf32", 32, (128, 64), 8, 32), ("", 128, (64, 32), 4, 32),
])
def test_default_f32_tiles_follow_the_precision(f32_dot: str, head_dim: int, forward: tuple[int, int],
                                                warps: int, backward: int) -> None:
    """Tensor-core dots take 128 x 64 forward tiles up to head dim 64 (64 x 32 beyond, to
    fit an SM's shared memory with pipelining; 4 warps); FMA dots keep 64 x 32 with 8 scores per thread. The
    backward takes 32 x 32 for every f32 precision (16 x 16 beyond head dim 128). `attnfuse.compile(f32_dot=...)` sets
    the option of every pass that has it."""
    p = Builder(hq=2, hkv=1, d=head_dim).mask("causal").build()
    tiles, kernels = _lowered(p.text, f32_dot)
    assert tiles == forward
    assert kernels["f_fwd"].num_warps.value.data == warps
    # the dK/dV kernel's K tile: `backward` keys of the head dim
    assert f"tensor<{backward}x{head_dim}xf32>" in str(kernels["f_bwd_dkdv"])
    fn = attnfuse.compile(p.text, f32_dot=f32_dot)
    precision = f32_dot or "tf32x3"
    dots = re.findall(r"tl\.dot\([^\n]*", fn.triton_source)
    assert dots and all(f'input_precision="{precision}"' in d for d in dots)


def test_unknown_global_precision_is_a_pipeline_error(capsys: pytest.CaptureFixture[str]) -> None:
    p = Builder(hq=2, hkv=1, d=32).build()
    with pytest.raises(PipelineError, match="f32-dot must be one of ieee, tf32x3, tf32, got 'fp64'"):
        attnfuse.compile(p.text, f32_dot="fp64")
    with pytest.raises(SystemExit) as exit_:
        AttnfuseOptMain(args=["-", "--f32-dot", "fp64"]).run()
    assert exit_.value.code != 0 and "invalid choice: 'fp64'" in capsys.readouterr().err


def test_driver_flag_fills_every_pass(tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    p = Builder(hq=2, hkv=1, d=32).mask("causal").build()
    path = tmp_path / "f.attn"  # type: ignore[operator]
    path.write_text(p.text)
    planned = "attn-canonicalize,rope-fusion,online-softmax,mask-tiling"
    AttnfuseOptMain(args=[str(path), "-p", planned, "--f32-dot", "ieee"]).run()
    assert "#attn.tile_plan<64x32" in capsys.readouterr().out
    AttnfuseOptMain(args=[str(path), "-p", f"{planned},lower-backward,lower-to-tile", "--f32-dot", "ieee"]).run()
    out = capsys.readouterr().out
    assert "tile.dot" in out and "tf32" not in out  # IEEE dots carry no precision attribute
