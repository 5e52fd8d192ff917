"""Every example program, lowered under each rope-fusion strategy, against the reference.

Real head counts and head dims at the declared dtype, B=1, Sq = Skv = 37 (block-m =
block-n = 16: three q blocks, the last partial), inputs from `attnfuse.testing.make_inputs`.
One batch entry: the interpreter runs one program per (batch entry, head, q block), up to
64 heads here; batch offsets are checked by tests/training/test_gradients_examples.py's
B=2 run of every example and by the building-block tests.
Examples without Q/K transforms lower identically under every strategy: for them the
test proves the emitted Triton is the same and runs it once. Then one Sq != Skv run per
example that allows it (not `document`, whose single ids / positions operands need
Sq == Skv), and the sliding-window examples with a window short enough to bite at 37.
"""

from __future__ import annotations

import pytest
import torch
from programs import STRATEGIES, compile_program, reference_lse

from attnfuse import examples, reference
from attnfuse.program import find_functions
from attnfuse.testing import assert_close, make_inputs

NAMES = examples.names()
SAME_LENGTH_ONLY = {"document"}


def _text(name: str) -> str:
    return examples.path(name).read_text()


def _has_transforms(text: str) -> bool:
    return "attn.rope" in text or "attn.qk_norm" in text


def _run(
    text: str, strategy: str, batch: int, q_len: int, kv_len: int, seed: int
) -> None:
    fn = compile_program(text, strategy)
    function = find_functions(reference.parse_program(text))[0]
    args = make_inputs(function, batch, q_len, kv_len, seed=seed)
    out, lse = fn(*args, return_lse=True)
    ref = reference.run(text, *args)
    assert out.dtype == args[0].dtype and out.shape == ref.shape
    assert_close(out, ref)
    assert_close(lse, reference_lse(text, args), args[0].dtype)


def test_examples_found() -> None:
    assert {"llama3", "gemma2", "gpt_oss", "qwen3", "document", "alibi"} <= set(NAMES)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", NAMES)
def test_example(name: str, strategy: str) -> None:
    text = _text(name)
    if strategy != "fused" and not _has_transforms(text):
        fused = compile_program(text, "fused").triton_source
        assert compile_program(text, strategy).triton_source == fused
        return
    _run(text, strategy, 1, 37, 37, seed=NAMES.index(name))


@pytest.mark.parametrize("name", [n for n in NAMES if n not in SAME_LENGTH_ONLY])
def test_example_sq_ne_skv(name: str) -> None:
    _run(_text(name), "fused", 1, 29, 45, seed=7)


@pytest.mark.parametrize(
    "name,old", [("gemma2", "left = 4095"), ("gpt_oss", "left = 127")]
)
def test_example_window_bites(name: str, old: str) -> None:
    text = _text(name)
    assert old in text
    _run(text.replace(old, "left = 9"), "fused", 1, 37, 37, seed=3)


def test_example_inputs_not_degenerate() -> None:
    """The generated inputs are random (never zeros) and the reference output too."""
    text = _text("llama3")
    function = find_functions(reference.parse_program(text))[0]
    args = make_inputs(function, 2, 37, 37, seed=0)
    assert all(a.abs().sum() > 0 for a in args[:3])
    assert reference.run(text, *args).abs().sum() > 0
    assert not torch.equal(args[0], make_inputs(function, 2, 37, 37, seed=1)[0])
