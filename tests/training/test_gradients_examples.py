"""Every example in examples/ trains: `loss.backward()` through `attnfuse.compile(...)`
gives the gradients of the float64 reference's autograd.

Each example runs at its declared heads and head dims, S=37, twice:

* declared dtype, B=2, `attnfuse.compile(path)` with the default pipeline (what a user
  runs: rope-fusion{strategy=auto}, the backward's own block sizes), dtype tolerances;
* a precise f32 variant, B=1 (`attnfuse.testing.with_dtype(text, "f32")`; operands that
  are not q/k/v keep their declared dtype) with the default pipeline but `strategy=fused`,
  so the Q/K transforms stay inside the backward kernels: f32 tolerance (or the operand's
  own dtype's, for a bf16 norm weight whose gradient is stored in bf16). One batch entry:
  the interpreter runs one program per (batch entry, head), and the batch offsets are
  the declared-dtype run's to check.

The loss is `(out * g).sum()` with a random `g`; inputs from `attnfuse.testing.make_inputs`
(fresh random values, never zeros; document ids as random segments, seeds as ints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import attnfuse
from attnfuse import reference
from attnfuse.passes import default_pipeline
from attnfuse.program import find_functions
from attnfuse.reference import parse_program
from attnfuse.testing import GRAD_TOLERANCE, assert_grad_close, make_inputs, with_dtype

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.attn"))
FUSED_PIPELINE = default_pipeline({"rope-fusion": "strategy=fused"})
SEQ = 37


@pytest.fixture(scope="module", autouse=True)
def _fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Compile into an empty disk cache (every program lowered by the passes); the
    cache-hit path is tested in test_backward_structure.py."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("attnfuse_cache")))
        yield


def _is_float(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


def train_step(fn: attnfuse.api.AttentionFunction, text: str, seed: int, batch: int) -> None:
    """One loss.backward() through the kernels and through the reference; compare."""
    function = find_functions(parse_program(text))[0]
    names = [a.name_hint for a in function.args]
    args = make_inputs(function, batch, SEQ, SEQ, seed=seed)
    leaves = [
        a.detach().clone().requires_grad_(True) if _is_float(a) else a for a in args
    ]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    dtype = args[0].dtype
    assert out.dtype == dtype and out.requires_grad
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 99)).to(
        dtype
    )
    loss = (out * g).sum()
    loss.backward()

    refs = [
        a.detach().double().requires_grad_(True) if _is_float(a) else a for a in args
    ]
    want = reference.run(text, *refs)
    want = want[0] if isinstance(want, tuple) else want
    (want * g.double()).sum().backward()
    learnable = 0
    for i, (leaf, ref) in enumerate(zip(leaves, refs)):
        if not _is_float(leaf):
            continue
        assert leaf.grad is not None, f"no gradient for {names[i]}"
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype
        tol = max(dtype, leaf.dtype, key=lambda d: GRAD_TOLERANCE[d])
        assert_grad_close(leaf.grad, ref.grad, tol, f"d{names[i]}")
        learnable += 1
    assert learnable >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_trains(path: Path) -> None:
    """Declared dtype, default pipeline, compiled from the file path."""
    fn = attnfuse.compile(path)
    assert fn.lowered_ir.count("_backward(") >= 1
    train_step(fn, path.read_text(), seed=3, batch=2)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_trains_f32(path: Path) -> None:
    """The same program in f32, backward kernels with in-kernel Q/K transforms."""
    text = with_dtype(path.read_text(), "f32")
    assert "xf32>" in text
    fn = attnfuse.compile(text, pipeline=FUSED_PIPELINE)
    train_step(fn, text, seed=4, batch=1)


def test_examples_found() -> None:
    assert {p.stem for p in EXAMPLES} >= {
        "alibi",
        "document",
        "dropout",
        "gemma2",
        "gpt_oss",
        "llama3",
        "llama3_1",
        "qwen3",
        "t5_bias",
    }
