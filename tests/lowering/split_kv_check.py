"""Helpers of the split-KV tests: compile with `split-kv`, run, see which kernels ran, and
bound the error against the float64 reference by PyTorch's own error in the same dtype.

`pipeline(strategy, options)` is the lowering tests' pipeline (`programs.pipeline`: 16 x 16
blocks) with `split-kv{block-n=16 ...}` before `lower-to-tile`, so that a few dozen keys
make several KV blocks, and several splits under the `auto` rule (the interpreter's
`host.sm_count` is an H200's 132).

PyTorch's error: the reference's scores right before the softmax (float64), rounded to
the inputs' dtype, then `torch.softmax` and the PV product in that dtype, as an eager
PyTorch attention would compute them. The kernel's relative error must stay within
`FACTOR[dtype]` times that (or the dtype's unit roundoff, when PyTorch happens to be
exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from programs import Program, reference_lse

import attnfuse
from attnfuse import reference
from attnfuse.runtime.host import call_signature
from attnfuse.testing import assert_close

BLOCK = 16

FACTOR = {torch.float16: 2.0, torch.float32: 8.0}
"""Allowed ratio to PyTorch's error. In f16 the kernel (fp32 accumulation, one rounding
of P) is more accurate than PyTorch's f16 softmax; in f32 both are at a few units of
2^-24, and the kernel's scores pass a few more fp32 roundings (exp2 with the folded scale,
online rescaling, the lse-weighted merge of the splits)."""

_COMPILED: dict[tuple[str, str], attnfuse.api.AttentionFunction] = {}


def pipeline(strategy: str = "fused", options: str = "") -> str:
    split_options = options if "block-n=" in options else f"block-n={BLOCK}{' ' + options if options else ''}"
    return (
        f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,"
        f"mask-tiling{{block-m={BLOCK} block-n={BLOCK}}},split-kv{{{split_options}}},lower-to-tile"
    )


def compile_split(text: str, strategy: str = "fused", options: str = "") -> attnfuse.api.AttentionFunction:
    """`attnfuse.compile` with `pipeline(strategy, options)`, memoised per process."""
    key = (text, pipeline(strategy, options))
    if key not in _COMPILED:
        _COMPILED[key] = attnfuse.compile(text, pipeline=key[1])
    return _COMPILED[key]


def launches(fn: attnfuse.api.AttentionFunction, args: Sequence[Any]) -> dict[str, tuple[int, int, int]]:
    """Kernel name -> grid of the launches the plan of `args`' shape class runs (after a call)."""
    plan = fn._host.plan(call_signature(args))  # noqa: SLF001
    assert plan is not None, "call the function on these arguments first"
    return {step.meta.name: step.grid for step in plan.steps if hasattr(step, "meta")}


def split_grid(fn: attnfuse.api.AttentionFunction, args: Sequence[Any]) -> tuple[int, int, int]:
    """The grid of the split kernel the plan of `args`' shape class runs (the full, the
    16-row or the wide tier; grid[0] is the split count), (0, 0, 0) when the call does not split."""
    ran = [grid for name, grid in launches(fn, args).items()
           if name.endswith(("_split_kv", "_split_kv_small", "_split_kv_wide"))]
    assert len(ran) <= 1, ran
    return ran[0] if ran else (0, 0, 0)


def torch_output(program: Program, args: Sequence[Any]) -> torch.Tensor:
    """PyTorch's eager attention in the inputs' dtype, from the reference's scores."""
    scores = reference.run(program.text, *args, return_all=True)[program.notes["scores"]]
    dtype = args[0].dtype
    v = args[2]
    s = scores.to(dtype)
    names = [a.name for a in program.args]
    if "sinks" in names:
        sinks = args[names.index("sinks")].to(dtype).view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        p = torch.softmax(torch.cat([s, sinks], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    v = v.repeat_interleave(s.shape[1] // v.shape[1], 1)
    return p.nan_to_num(0.0) @ v


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = float(want.abs().max()) or 1.0
    return float((got.double() - want).abs().max()) / scale


def check_decode(
    program: Program, batch: int, q_len: int, kv_len: int, *, strategy: str = "fused", options: str = "",
    seed: int = 0, args: Sequence[Any] | None = None, split: bool = True, exact_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `program` compiled with split-KV; check that the split kernel served the call
    (`split`) or did not, the output against the reference within PyTorch's own error,
    and the lse against the reference's (to fp32 precision when `exact_lse`, else to the
    dtype's: in-kernel Q/K transforms round their result to the inputs' dtype)."""
    if args is None:
        args = program.inputs(batch, q_len, kv_len, seed)
    fn = compile_split(program.text, strategy, options)
    out, lse = fn(*args, return_lse=True)
    ran = launches(fn, args)
    tiers = {f"{program.name}_split_kv{tier}" for tier in ("", "_small", "_wide", "_persistent")} & set(ran)
    assert len(tiers) == int(split), ran
    assert (f"{program.name}_fwd" in ran) == (not split), ran
    want = reference.run(program.text, *args)
    want = want[0] if isinstance(want, tuple) else want
    dtype = args[0].dtype
    assert out.dtype == dtype and not torch.isnan(out).any()
    ours, theirs = relative_error(out, want), relative_error(torch_output(program, args), want)
    bound = FACTOR[dtype] * max(theirs, torch.finfo(dtype).eps)
    assert ours <= bound, f"relative error {ours:.2e} > {bound:.2e} ({FACTOR[dtype]} x PyTorch's {theirs:.2e})"
    assert_close(lse, reference_lse(program, args), torch.float32 if exact_lse else dtype)
    return out, lse


__all__ = ["BLOCK", "check_decode", "compile_split", "launches", "pipeline", "split_grid", "torch_output"]
