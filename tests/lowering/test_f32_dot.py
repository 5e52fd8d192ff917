"""`f32-dot`: the precision of the dots of f32 programs (`tile.dot {precision}`).

The default `ieee` multiplies on the FMA units (what flex_attention does under PyTorch's
default matmul precision); `tf32x3` and `tf32` use the tensor cores. The Triton
interpreter multiplies in fp32 whatever the precision, so the runs here check the
plumbing (every f32 dot of every kernel carries the option; results stay right), not
TF32 rounding, which only a GPU shows.
"""

from __future__ import annotations

import re

import pytest
from programs import Builder
from xdsl.dialects.builtin import bf16, f32
from xdsl.utils.exceptions import VerifyException

import attnfuse
from attnfuse import reference
from attnfuse.dialects.tile import DotOp
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
