"""The differential fuzzer: random programs, compiled kernels vs the float64 reference.

For each `generator.Case` and each rope-fusion strategy that applies, `check_case`
compiles the program with the training pipeline (`lower-backward`, 16 or 32 row / key tiles),
runs the forward through the Triton interpreter with `return_lse=True`, backpropagates
a random upstream gradient of both the output and the lse, runs the same loss through
`attnfuse.reference` in float64, and compares

* the output and the lse with `attnfuse.testing.assert_close` (the dtype's tolerance),
  or, for an output beyond it, within 8 times the error that perturbing every input by
  the dtype's rounding unit causes in the float64 reference (`_forward_bound`: a program
  whose logits are large, e.g. unscaled scores after a QK-norm, is ill-conditioned in
  f16, and every implementation in that dtype errs that much; seed 2026 found one),
* the gradient of q, k, v and of every learnable operand (norm weights, ALiBi slopes,
  bias tensors, sinks) with `attnfuse.testing.GRAD_TOLERANCE`, relative to the largest
  reference entry, floored at `GRAD_SCALE_FLOOR` (masks such as a one-key window make
  some gradients exactly zero; relative to 1e-17 noise the check would be meaningless).

`fuzz(seed, count)` runs `count` cases and returns a `Summary`. From the command line
(`make fuzz`, or `TRITON_INTERPRET=1 python tests/fuzz/differential.py --seed 1 --count 200`)
it prints every failure with its program text, then the summary, and exits 1 on failure.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generator import Case, random_case
from programs import reference_lse

import attnfuse
from attnfuse import reference
from attnfuse.testing import GRAD_TOLERANCE, assert_close

PIPELINE = (
    "attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,mask-tiling{{block-m={m} block-n={n}}},"
    "lower-backward{{block-m={m} block-n={n}}},lower-to-tile"
)
FORWARD_PIPELINE = PIPELINE.replace("lower-backward{{block-m={m} block-n={n}}},", "")
GRAD_SCALE_FLOOR = 1e-2
"""Gradients are compared relative to max(max |reference|, this)."""

DTYPES = {"f16": torch.float16, "f32": torch.float32}


@dataclass
class Failure:
    case_index: int
    strategy: str
    case: Case
    error: str

    def report(self) -> str:
        c = self.case
        return (
            f"--- case {self.case_index} strategy={self.strategy} blocks={c.blocks_mn} dtype={c.dtype} B={c.batch} "
            f"Sq={c.q_len} Skv={c.kv_len} blocks={','.join(c.blocks)}\n{self.error}\n{c.program.text}"
        )


@dataclass
class Summary:
    seed: int
    programs: int = 0
    cases: int = 0
    """(program, strategy) pairs compiled and compared."""
    comparisons: int = 0
    """Tensors compared: outputs, lse, gradients."""
    seconds: float = 0.0
    blocks: Counter[str] = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"differential fuzz seed={self.seed}: {self.programs} programs, {self.cases} "
            f"(program, strategy) cases, {self.comparisons} tensors compared, "
            f"{len(self.failures)} failures, {self.seconds:.1f}s"
        )


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(max |want|, GRAD_SCALE_FLOOR)."""
    if not want.numel():
        return 0.0
    scale = max(float(want.abs().max()), GRAD_SCALE_FLOOR)
    return float((got.double() - want.double()).abs().max()) / scale


def _reference_grads(
    case: Case, args: Sequence[Any], g: torch.Tensor, g2: torch.Tensor, noise: float, seed: int
) -> list[torch.Tensor]:
    """Float64 reference gradients of the learnable arguments for the loss
    (out * g).sum() + (lse * g2).sum(), with every float input and upstream gradient
    multiplied by (1 + noise * N(0, 1)) (noise = 0: the exact reference)."""
    gen = torch.Generator().manual_seed(seed)

    def jitter(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().double()
        return t * (1.0 + noise * torch.randn(t.shape, generator=gen, dtype=torch.float64)) if noise else t

    program = case.program
    refs = [jitter(a).requires_grad_() if i in case.learnable else a for i, a in enumerate(args)]
    out = reference.run(program.text, *refs)
    out, lse = out if isinstance(out, tuple) else (out, reference_lse(program, refs))
    torch.autograd.backward([out, lse], [jitter(g), jitter(g2)])
    grads = []
    for i in case.learnable:
        grad = refs[i].grad
        assert grad is not None, f"reference has no gradient for {program.args[i].name}"
        grads.append(grad)
    return grads


def _forward_bound(case: Case, args: Sequence[Any], want: torch.Tensor, dtype: torch.dtype, seed: int) -> float:
    """8 times the largest output error of the float64 reference when every float input is
    multiplied by (1 + eps/2 N(0, 1)), eps the rounding unit of `dtype` (the smallest of
    three draws: the bound is what rounding the inputs alone does)."""
    gen = torch.Generator().manual_seed(seed + 2)
    eps = torch.finfo(dtype).eps / 2
    errors = []
    for _ in range(3):
        jittered = [a.double() * (1.0 + eps * torch.randn(a.shape, generator=gen, dtype=torch.float64))
                    if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        got = reference.run(case.program.text, *jittered)
        got = got[0] if isinstance(got, tuple) else got
        errors.append(float((got - want).abs().max()))
    return 8 * min(errors)


def check_case(case: Case, strategy: str, seed: int) -> int:
    """Compile and compare one case under one strategy; returns the number of tensors
    compared. Raises AssertionError (or the compiler's error) on a mismatch.

    A gradient passes when its error relative to the reference is within the dtype's
    `GRAD_TOLERANCE`, or within 8 times the error that perturbing every input by the
    dtype's rounding unit causes in the float64 reference: the error any implementation
    in that dtype makes, PyTorch's included (backward error analysis). Sums over the whole
    sequence (sinks, slopes, norm weights) can cancel to a small value, which that second
    bound accepts where a plain relative bound would not.
    """
    program = case.program
    args = program.inputs(case.batch, case.q_len, case.kv_len, seed)
    dtype = DTYPES[case.dtype]
    m, n = case.blocks_mn
    pipeline = FORWARD_PIPELINE if case.forward_only else PIPELINE
    fn = attnfuse.compile(program.text, pipeline=pipeline.format(strategy=strategy, m=m, n=n))
    leaves = [
        a.detach().clone().requires_grad_() if i in case.learnable and not case.forward_only else a
        for i, a in enumerate(args)
    ]
    out, lse = fn(*leaves, return_lse=True)
    want = reference.run(program.text, *args)
    want_out = want[0] if isinstance(want, tuple) else want
    want_lse = want[1] if isinstance(want, tuple) else reference_lse(program, args)
    assert out.dtype == dtype, f"output dtype {out.dtype}"
    try:
        assert_close(out, want_out)
    except AssertionError:
        err = float((out.detach().double() - want_out).abs().max())
        bound = _forward_bound(case, args, want_out, dtype, seed)
        if not err <= bound:
            raise AssertionError(f"output: max error {err:.3e} beyond the tolerance and 8x the error of the "
                                 f"reference on inputs perturbed by the {dtype} rounding unit ({bound:.3e})") from None
    assert_close(lse, want_lse, dtype)
    if case.forward_only:
        return 2

    gen = torch.Generator().manual_seed(seed + 1)
    g = torch.randn(out.shape, generator=gen).to(dtype)
    g2 = torch.randn(lse.shape, generator=gen)
    torch.autograd.backward([out, lse], [g, g2])
    exact = _reference_grads(case, args, g, g2, 0.0, seed)
    perturbed = _reference_grads(case, args, g, g2, torch.finfo(dtype).eps / 2, seed)
    for i, want_grad, noisy in zip(case.learnable, exact, perturbed):
        name = f"d{program.args[i].name}"
        got = leaves[i].grad
        assert got is not None, f"{name}: no gradient"
        assert got.shape == want_grad.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want_grad.shape)}"
        assert torch.isfinite(got).all(), f"{name}: non-finite gradient"
        tolerance = GRAD_TOLERANCE[max(dtype, got.dtype, key=lambda d: GRAD_TOLERANCE[d])]
        bound = max(tolerance, 8 * _relative_error(noisy, want_grad))
        err = _relative_error(got, want_grad)
        assert err <= bound, f"{name}: relative error {err:.2e} > {bound:.2e}"
    return 2 + len(case.learnable)


def fuzz(seed: int, count: int, *, verbose: bool = False) -> Summary:
    """Run `count` random cases from `seed` (see the module docstring)."""
    rng = random.Random(seed)
    summary = Summary(seed)
    start = time.perf_counter()
    for index in range(count):
        case = random_case(rng)
        summary.programs += 1
        summary.blocks.update(set(case.blocks))
        for strategy in case.strategies:
            summary.cases += 1
            failures = len(summary.failures)
            try:
                summary.comparisons += check_case(case, strategy, seed * 1000 + index)
            except Exception:  # noqa: BLE001 - every failure is reported with its program
                summary.failures.append(Failure(index, strategy, case, traceback.format_exc(limit=3)))
            if verbose:
                status = "FAIL" if len(summary.failures) > failures else "ok"
                print(f"case {index} {strategy} {','.join(case.blocks)}: {status}", flush=True)
    summary.seconds = time.perf_counter() - start
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="AttnFuse differential fuzzer (Triton interpreter on CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=100, help="number of random programs")
    parser.add_argument("-v", "--verbose", action="store_true")
    options = parser.parse_args(argv)
    summary = fuzz(options.seed, options.count, verbose=options.verbose)
    for failure in summary.failures:
        print(failure.report())
    print("blocks covered:", ", ".join(f"{k} x{v}" for k, v in sorted(summary.blocks.items())))
    print(summary.line())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["PIPELINE", "Failure", "Summary", "check_case", "fuzz", "main"]
