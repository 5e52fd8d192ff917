"""Programs the Hopper forward schedule serves (and some it must not), shared by the CPU
compile / eligibility tests and the GPU correctness tests (tests/gpu/test_hopper_forward_gpu.py).

`ELIGIBLE`: name -> (program text, pipeline). Examples run with rope-fusion hybrid (the
default for Llama-3: K pre-rotated by a pre-kernel, Q rotated in the kernel's prologue);
`*_fused` ones with rope-fusion fused (K transformed by the producer warpgroup too).
`INELIGIBLE`: name -> (program text, pipeline, a fragment of the reason logged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from programs import Builder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def pipeline(strategy: str = "hybrid", hopper: bool = True) -> str:
    lower = "lower-to-tile" if hopper else "lower-to-tile{hopper-forward=false}"
    return f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,mask-tiling,{lower}"


_COMPILE = """
import json, sys
from attnfuse.backends.gluon.sm90 import compile_module_for_sm90
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.pass_manager import PassManager, make_context
out = {}
for text, pipe in json.load(sys.stdin):
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, text, "<test>")
    PassManager(pipe).run(module, ctx, locations=locations)
    out.update(compile_module_for_sm90(module))
print(json.dumps(out))
"""


def sm90_resources(programs: list[tuple[str, str]], timeout: int) -> dict[str, dict[str, Any]]:
    """Lower each (program text, pipeline) and compile its Gluon kernels for sm_90a in a
    fresh process (one that interprets kernels cannot compile them): kernel name ->
    `gluon_resources`."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _COMPILE], input=json.dumps(programs), capture_output=True,
                          text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def backward_pipeline(strategy: str = "hybrid", hopper: bool = True, forward_hopper: bool = True) -> str:
    """`pipeline` with lower-backward and its `hopper-backward` option (and, with it,
    `hopper-block-map`)."""
    backward = f"lower-backward{{hopper-backward={str(hopper).lower()}{' hopper-block-map=true' if hopper else ''}}}"
    return pipeline(strategy, forward_hopper).replace("mask-tiling,", f"mask-tiling,{backward},")


def backward_plans(fn: Any) -> dict[tuple[str, Any], Any]:
    """The backward launch plans `fn` has built, by (host program, plan key): those of
    `@f_backward` and of `@f_backward_saved` (what autograd runs where the forward saves
    a pre-kernel's output)."""
    runner = fn._runner
    hosts = (("backward", runner.backward), ("saved", runner.backward_saved))
    return {(name, key): plan for name, host in hosts if host is not None for key, plan in host._plans.items()}


def _gemma2_like() -> str:
    """Gemma-2 score ops (softcap 50, causal + sliding window) at head dim 128."""
    b = Builder("gemma2_like", hq=16, hkv=8, d=128, dtype="bf16")
    b.rope(theta=10000.0).scores(scale=0.0625).softcap(50.0)
    b.mask("causal").mask("sliding_window", left=300)
    return b.build().text


def _window(name: str = "window") -> str:
    """A two-sided local window (no causal mask): masked tiles at both band edges."""
    b = Builder(name, hq=8, hkv=2, d=128, dtype="bf16")
    b.mask("sliding_window", left=200, right=100)
    return b.build().text


def _bottom_right() -> str:
    """Causal aligned bottom-right (queries are the last Sq of Skv keys), RoPE, GQA."""
    b = Builder("bottom_right", hq=8, hkv=2, d=128, dtype="bf16")
    b.rope(theta=500000.0).mask("causal", align="bottom_right")
    return b.build().text


def _example(example: str, name: str) -> str:
    """A shipped example's text with its function renamed `name`."""
    return (EXAMPLES / f"{example}.attn").read_text().replace(f"@{example}(", f"@{name}(")


def _d64(name: str = "d64") -> str:
    """Head dim 64, GQA 16/4, RoPE + QK-norm without weight, causal."""
    b = Builder(name, hq=16, hkv=4, d=64, dtype="bf16")
    b.qk_norm(eps=1e-6).rope(theta=10000.0).mask("causal")
    return b.build().text


def _qk_norm_only() -> str:
    """QK-norm with a weight and no RoPE, head dim 128 (K as one 128-wide part)."""
    b = Builder("qk_norm_fused", hq=8, hkv=2, d=128, dtype="bf16")
    b.qk_norm(eps=1e-6, weight="bf16").mask("causal")
    return b.build().text


def _score_mod() -> str:
    """A score_mod region (scaled scores plus a distance term) and an f16 causal mask."""
    b = Builder("score_mod", hq=8, hkv=8, d=128, dtype="f16")
    b.score_mod(
        """
        %c$ = arith.constant 0.5 : f32
        %d$ = arith.subi %q$, %kv$ : index
        %di$ = arith.index_cast %d$ : index to i64
        %df$ = arith.sitofp %di$ : i64 to f32
        %e$ = arith.constant -0.01 : f32
        %t$ = arith.mulf %df$, %e$ : f32
        %y$ = arith.mulf %x$, %c$ : f32
        %z$ = arith.addf %y$, %t$ : f32
        attn.yield %z$ : f32
    """
    ).mask("causal")
    return b.build().text


def _sinks() -> str:
    b = Builder("sinks", hq=8, hkv=2, d=64, dtype="bf16")
    b.mask("causal")
    return b.build(sinks=True).text


def _d96() -> str:
    b = Builder("d96", hq=4, hkv=2, d=96, dtype="bf16")
    b.mask("causal")
    return b.build().text


def _interleaved() -> str:
    b = Builder("interleaved", hq=4, hkv=2, d=128, dtype="bf16")
    b.rope(style="interleaved").mask("causal")
    return b.build().text


def _head_mask() -> str:
    """A custom mask that reads the head (key <= query - 64 * head): a runtime block map
    per query head, GQA 8/2, RoPE."""
    b = Builder("head_mask", hq=8, hkv=2, d=128, dtype="bf16")
    body = """
        %c$ = arith.constant 64 : index
        %o$ = arith.muli %h$, %c$ : index
        %w$ = arith.subi %q$, %o$ : index
        %keep$ = arith.cmpi sle, %kv$, %w$ : index
        attn.yield %keep$ : i1
    """
    b.rope(theta=10000.0).custom_mask(body)
    return b.build().text


ELIGIBLE: dict[str, tuple[str, str]] = {
    "llama3": ((EXAMPLES / "llama3.attn").read_text(), pipeline()),
    "llama3_1": ((EXAMPLES / "llama3_1.attn").read_text(), pipeline()),
    "qwen3": ((EXAMPLES / "qwen3.attn").read_text(), pipeline()),
    "alibi": ((EXAMPLES / "alibi.attn").read_text(), pipeline("fused")),
    "gemma2_like": (_gemma2_like(), pipeline()),
    "window": (_window(), pipeline("fused")),
    "bottom_right": (_bottom_right(), pipeline()),
    "d64": (_d64(), pipeline()),
    "score_mod": (_score_mod(), pipeline("fused")),
    "llama3_fused": (_example("llama3", "llama3_fused"), pipeline("fused")),
    "qwen3_fused": (_example("qwen3", "qwen3_fused"), pipeline("fused")),
    "d64_fused": (_d64("d64_fused"), pipeline("fused")),
    "qk_norm_fused": (_qk_norm_only(), pipeline("fused")),
    "document": ((EXAMPLES / "document.attn").read_text(), pipeline()),
    "head_mask": (_head_mask(), pipeline()),
}

def _k_positions() -> str:
    """A K rope with a positions operand (K rows at arbitrary positions)."""
    b = Builder("k_positions", hq=8, hkv=2, d=128, dtype="bf16")
    pos = b.arg("pos", "tensor<?xi32>", lambda g, batch, sq, skv: torch.arange(skv, dtype=torch.int32))
    b.rope("q", theta=10000.0).rope("k", positions=pos, theta=10000.0).mask("causal")
    return b.build().text


INELIGIBLE: dict[str, tuple[str, str, str]] = {
    "gemma2": ((EXAMPLES / "gemma2.attn").read_text(), pipeline(), "head dims 256/256"),
    "gpt_oss": ((EXAMPLES / "gpt_oss.attn").read_text(), pipeline(), "attention sinks"),
    "head_mask_fused": (_head_mask(), pipeline("fused"), "a runtime block map with K transformed in the kernel"),
    "dropout": ((EXAMPLES / "dropout.attn").read_text(), pipeline(), "dropout"),
    "t5_bias": ((EXAMPLES / "t5_bias.attn").read_text(), pipeline(), "not all bf16 or all f16"),
    "sinks": (_sinks(), pipeline(), "attention sinks"),
    "d96": (_d96(), pipeline(), "head dims 96/96"),
    "interleaved": (_interleaved(), pipeline(), "not half-style"),
    "k_positions": (_k_positions(), pipeline("fused"), "a K rope with a positions operand"),
}


def _learnable_slopes() -> str:
    b = Builder("learnable_slopes", hq=4, hkv=2, d=64, dtype="bf16")
    b.alibi(slopes=True).mask("causal")
    return b.build().text


def _alibi_window() -> str:
    """ALiBi before a one-sided sliding window, GQA, head dim 128, bottom-right."""
    b = Builder("alibi_window", hq=8, hkv=2, d=128, dtype="bf16")
    b.rope(theta=10000.0).alibi().mask("sliding_window", left=300, align="bottom_right")
    return b.build().text


def _doc_alibi() -> str:
    """Document ids (one operand for queries and keys) with ALiBi, causal, head dim 64, f16, GQA 4/2."""
    b = Builder("doc_alibi", hq=4, hkv=2, d=64, dtype="f16")
    doc = b.doc_ids("doc")
    b.alibi().mask("causal").mask("document", doc)
    return b.build().text


def _d64_rope() -> str:
    """Head dim 64, GQA 8/2, RoPE alone, causal (dK rotated back in the epilogue at D = 64)."""
    b = Builder("d64_rope", hq=8, hkv=2, d=64, dtype="bf16")
    b.rope(theta=10000.0).mask("causal")
    return b.build().text


BACKWARD_ELIGIBLE: dict[str, str] = {
    **{n: ELIGIBLE[n][0] for n in ("llama3", "llama3_1", "qwen3", "bottom_right", "d64", "alibi", "window")},
    "alibi_window": _alibi_window(),
    "d64_rope": _d64_rope(),
    "interleaved": _interleaved(),
    "k_positions": _k_positions(),
    "document": (EXAMPLES / "document.attn").read_text(),
    "doc_alibi": _doc_alibi(),
}
"""Programs the Hopper backward schedule serves: name -> program text."""

BACKWARD_INELIGIBLE: dict[str, tuple[str, str, str]] = {
    "gemma2_like": (_gemma2_like(), backward_pipeline(), "score op attn.softcap"),
    "learnable_slopes": (_learnable_slopes(), backward_pipeline(), "learnable ALiBi slopes"),
    "score_mod": (_score_mod(), backward_pipeline(), "score op attn.score_mod"),
    "gpt_oss": ((EXAMPLES / "gpt_oss.attn").read_text(), backward_pipeline(), "attention sinks"),
    "document_off": ((EXAMPLES / "document.attn").read_text(),
                     backward_pipeline().replace(" hopper-block-map=true", ""), "hopper-block-map is off"),
    "head_mask": (_head_mask(), backward_pipeline(), "a runtime block map per head"),
    "d96": (_d96(), backward_pipeline(), "head dims 96/96"),
    "t5_bias": ((EXAMPLES / "t5_bias.attn").read_text(), backward_pipeline(), "not all bf16 or all f16"),
    "llama3_in_kernel": ((EXAMPLES / "llama3.attn").read_text(), backward_pipeline("fused").replace(
        "hopper-backward=true", "hopper-backward=true transforms-in-kernel=true"), "transforms-in-kernel"),
}
"""name -> (program text, pipeline, a fragment of the reason logged)."""
