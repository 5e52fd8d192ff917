"""Program parameters: `${name}` placeholders bound by `attnfuse.compile(params=...)`."""

from __future__ import annotations

import pytest
import torch

import attnfuse
from attnfuse.params import ParameterError, substitute
from attnfuse.reference import run
from attnfuse.testing import assert_close

TEMPLATE = """// one file, several sizes: ${comment} stays as written
func.func @sized(%q: tensor<?x${heads}x?x${head_dim}x${dtype}>, %k: tensor<?x${kv_heads}x?x${head_dim}x${dtype}>,
                 %v: tensor<?x${kv_heads}x?x${head_dim}x${dtype}>) -> tensor<?x${heads}x?x${head_dim}x${dtype}> {
  %qr = attn.rope %q {theta = ${theta=500000.0}} : tensor<?x${heads}x?x${head_dim}x${dtype}>
  %kr = attn.rope %k {theta = ${theta=500000.0}} : tensor<?x${kv_heads}x?x${head_dim}x${dtype}>
  %s = attn.scores %qr, %kr {scale = ${scale}} : tensor<?x${heads}x?x${head_dim}x${dtype}>, tensor<?x${kv_heads}x?x${head_dim}x${dtype}> -> !attn.scores<?x${heads}x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x${heads}x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x${heads}x?x?xf32> -> !attn.probs<?x${heads}x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x${heads}x?x?xf32>, tensor<?x${kv_heads}x?x${head_dim}x${dtype}> -> tensor<?x${heads}x?x${head_dim}x${dtype}>
  func.return %o : tensor<?x${heads}x?x${head_dim}x${dtype}>
}
"""


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 2, 16), (2, 1, 32)])
def test_one_template_serves_several_sizes(heads: int, kv_heads: int, head_dim: int) -> None:
    params = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": torch.float32, "scale": 0.3}
    fn = attnfuse.compile(TEMPLATE, params=params)
    assert [p.describe() for p in fn.parameters] == [
        f"[?, {heads}, ?, {head_dim}] torch.float32", *[f"[?, {kv_heads}, ?, {head_dim}] torch.float32"] * 2]
    q, k = torch.randn(1, heads, 7, head_dim), torch.randn(1, kv_heads, 7, head_dim)
    assert_close(fn(q, k, k), run(substitute(TEMPLATE, params), q, k, k))


def test_substitution() -> None:
    text = substitute(TEMPLATE, {"heads": 8, "kv_heads": 2, "head_dim": 64, "dtype": "bf16", "scale": 1e-5})
    assert "tensor<?x8x?x64xbf16>" in text and "{scale = 1.0e-05}" in text and "{theta = 500000.0}" in text
    assert text.startswith("// one file, several sizes: ${comment} stays as written")
    assert "theta = 1.5" in substitute(TEMPLATE, {"heads": 1, "kv_heads": 1, "head_dim": 2, "dtype": "f32",
                                                  "scale": 1.0, "theta": 1.5})


def test_missing_parameter_is_located() -> None:
    with pytest.raises(ParameterError, match=r"^sized\.attn:2:31: parameter \$\{heads\} has no value; "
                                             r"pass params=\{'heads': \.\.\.\} to attnfuse\.compile$"):
        substitute(TEMPLATE, {"kv_heads": 2}, "sized.attn")
    with pytest.raises(ParameterError, match=r"<program>:2:31: parameter \$\{heads\} has no value"):
        attnfuse.compile(TEMPLATE)


def test_unused_and_bad_values() -> None:
    full = {"heads": 4, "kv_heads": 2, "head_dim": 16, "dtype": "f32", "scale": 0.25}
    with pytest.raises(ParameterError, match=r"params 'layers' not used by the program \(its parameters: dtype, "
                                             r"head_dim, heads, kv_heads, scale, theta\)"):
        substitute(TEMPLATE, {**full, "layers": 2})
    with pytest.raises(ParameterError, match="parameter 'heads': expected an int, a float, a dtype or a word, got bool"):
        substitute(TEMPLATE, {**full, "heads": True})
    with pytest.raises(ParameterError, match=r"parameter 'dtype': expected .* got str 'f32>, %x'"):
        substitute(TEMPLATE, {**full, "dtype": "f32>, %x"})
    with pytest.raises(ParameterError, match="parameter 'scale': inf is not finite"):
        substitute(TEMPLATE, {**full, "scale": float("inf")})
