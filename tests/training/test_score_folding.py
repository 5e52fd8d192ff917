"""Score-chain folding (`fold-scale`, `alibi-vectors`) in the forward and backward kernels.

`ScoreChain.apply_scaled` keeps the scale symbolic through masks, biases and softcaps
and ALiBi distances come from per-key / per-query vectors; these are the defaults. Each
program here runs with the defaults and with both options off (the ablation, which must
stay correct too), forward and gradients against the float64 reference. Scales other
than 1 / sqrt(D), softcaps before and after biases and a score_mod after a softcap (the
one op that needs the scores themselves) cover the rules of `apply_scaled`; 70 queries
with 16-row blocks put ALiBi's distance origin (the tile's first key) far from the
queries of most tiles. One batch entry: nothing folded here depends on the batch index.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from programs import Builder, Program

import attnfuse
from attnfuse import reference
from attnfuse.testing import GRAD_TOLERANCE, assert_close, assert_grad_close

OFF = "fold-scale=false alibi-vectors=false"


def pipeline(options: str) -> str:
    return (
        "attn-canonicalize,rope-fusion{strategy=separate},online-softmax,mask-tiling{block-m=16 block-n=16},"
        f"lower-backward{{block-m=16 block-n=16 {options}}},lower-to-tile{{{options}}}"
    )


def alibi_causal(dtype: str) -> Program:
    return Builder(hq=4, hkv=2, d=32, dtype=dtype).alibi().mask("causal").build()


def alibi_slopes_window() -> Program:
    return Builder(hq=2, hkv=1, d=32).scores(scale=0.3).alibi(slopes=True).mask(
        "sliding_window", left=20, right=5).build()


def bias_softcap() -> Program:
    return Builder(hq=2, hkv=1, d=32).scores(scale=0.3).bias([1, 2, "?", "?"]).softcap(2.5).mask("causal").build()


def softcap_bias_score_mod() -> Program:
    body = """
        %t$ = math.tanh %x$ : f32
        %y$ = arith.mulf %x$, %t$ : f32
        attn.yield %y$ : f32
    """
    return Builder(hq=2, hkv=1, d=32).scores(scale=0.7).softcap(4.0).alibi().score_mod(body).mask("causal").build()


PROGRAMS = {
    "alibi_causal_f16": lambda: alibi_causal("f16"),
    "alibi_causal_f32": lambda: alibi_causal("f32"),
    "alibi_slopes_window": alibi_slopes_window,
    "bias_softcap": bias_softcap,
    "softcap_bias_score_mod": softcap_bias_score_mod,
}


def _is_float(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


@pytest.mark.parametrize("options", ["", OFF], ids=["folded", "ablation"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_against_reference(name: str, options: str) -> None:
    p = PROGRAMS[name]()
    fn = attnfuse.compile(p.text, pipeline=pipeline(options))
    args = p.inputs(1, 70, 70, seed=5)
    leaves = [a.detach().clone().requires_grad_(True) if _is_float(a) else a for a in args]
    refs = [a.detach().double().requires_grad_(True) if _is_float(a) else a for a in args]
    out = fn(*leaves)
    want = reference.run(p.text, *refs)
    assert_close(out, want)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(11)).to(out.dtype)
    out.backward(g)
    want.backward(g.double())
    for a, leaf, ref in zip(p.args, leaves, refs):
        if _is_float(leaf):
            assert_grad_close(leaf.grad, ref.grad, max(out.dtype, leaf.dtype, key=lambda d: GRAD_TOLERANCE[d]),
                              f"d{a.name}")


def test_alibi_vectors_replace_the_per_score_conversion() -> None:
    """With `alibi-vectors` the kernels build ALiBi from two vectors; the ablation
    converts `kv - q` per score."""
    p = alibi_causal("f16")
    folded = attnfuse.compile(p.text, pipeline=pipeline("")).triton_source
    ablation = attnfuse.compile(p.text, pipeline=pipeline(OFF)).triton_source
    assert folded.count("alibi_kv") >= 3 and "alibi_kv" not in ablation  # forward, dQ, dK/dV
