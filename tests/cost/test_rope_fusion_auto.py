"""rope-fusion{strategy=auto} asks the cost model when given a target."""

from __future__ import annotations

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp

import attnfuse
from attnfuse import examples
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.pass_manager import PassManager, PipelineError, make_context


MHA = (attnfuse.attention(heads=32, kv_heads=32, head_dim=128, dtype=torch.bfloat16, name="mha")
       .rope(theta=500000.0).causal().build().text())
"""Llama-3-8B's attention without GQA (32 KV heads)."""


def placements(pipeline: str, text: str | None = None, **kwargs: object) -> list[str]:
    ctx = make_context()
    text = examples.path("llama3").read_text() if text is None else text
    module, _ = parse_module_with_locations(ctx, text, "llama3.attn")
    assert isinstance(module, ModuleOp)
    PassManager(pipeline, **kwargs).run(module, ctx)  # type: ignore[arg-type]
    return [op.str_option("placement") for op in module.walk() if op.name == "attn.rope"]


@pytest.mark.parametrize(
    ("pipeline", "kwargs", "expected"),
    [
        ("attn-canonicalize,rope-fusion", {}, ["kernel", "prekernel"]),  # no target: hybrid
        # run 14 on the H200: hybrid fastest from S = 256 up; the model puts fused's
        # crossover below one 256-row block there, and on an L4 (group 4); without GQA
        # fused wins below about 3500 on an L4 (and 1200 on the H200's Gluon kernel)
        ("attn-canonicalize,rope-fusion", {"target": "h200", "seq_len": 256}, ["kernel", "prekernel"]),
        ("attn-canonicalize,rope-fusion", {"target": "h200", "seq_len": 8192}, ["kernel", "prekernel"]),
        ("attn-canonicalize,rope-fusion{target=l4 seq-len=512}", {}, ["kernel", "prekernel"]),
        ("attn-canonicalize,rope-fusion{target=l4 seq-len=512}", {"text": MHA}, ["kernel", "kernel"]),
        ("attn-canonicalize,rope-fusion{target=l4 seq-len=2048}", {"text": MHA}, ["kernel", "kernel"]),
        ("attn-canonicalize,rope-fusion{target=l4 seq-len=8192}", {"text": MHA}, ["kernel", "prekernel"]),
        ("attn-canonicalize,rope-fusion{strategy=separate}", {"target": "h200", "seq_len": 256}, ["prekernel", "prekernel"]),
    ],
)
def test_auto_placement(pipeline: str, kwargs: dict[str, object], expected: list[str]) -> None:
    assert placements(pipeline, **kwargs) == expected


def test_bad_options_are_rejected_before_running() -> None:
    with pytest.raises(PipelineError, match="unknown target 'v100'; known targets: a100"):
        PassManager("attn-canonicalize,rope-fusion{target=v100}")
    with pytest.raises(PipelineError, match="seq-len must be >= 0"):
        PassManager("rope-fusion{seq-len=-1}")
