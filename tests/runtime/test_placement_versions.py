"""RoPE placement per shape class for calls without autograd (attnfuse/placement_versions.py).

A program compiled for the H200 with `rope-fusion{strategy=auto}` is `hybrid` (planned at
S = 4096); at B = 1 and short S the cost model predicts `fused` faster (one launch, no
pre-kernel), so calls that record no autograd run that version, checked here on the
interpreter against the float64 reference. Calls that record autograd keep `hybrid`."""

from __future__ import annotations

import warnings

import pytest
import torch

import attnfuse
from attnfuse import reference
from attnfuse.cost.target import get_target
from attnfuse.passes import default_pipeline
from attnfuse.runtime.host import call_signature
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.testing import assert_close

SMALL = """
func.func @versions(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>) -> tensor<?x4x?x32xf16> {
  %qr = attn.rope %q {theta = 10000.0} : tensor<?x4x?x32xf16>
  %kr = attn.rope %k {theta = 10000.0} : tensor<?x2x?x32xf16>
  %s = attn.scores %qr, %kr : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}
"""


def _inputs(batch: int, seq: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, h, seq, 32, generator=g).half() for h in (4, 2, 2)]


def _launches(steps: list) -> int:
    return sum(isinstance(s, KernelLaunch) for s in steps)


@pytest.fixture(scope="module")
def fn() -> attnfuse.AttentionFunction:
    return attnfuse.compile(SMALL, target="h200")


def test_the_model_chooses_per_shape(fn: attnfuse.AttentionFunction) -> None:
    versions = fn._runner.versions  # noqa: SLF001
    assert versions is not None and versions.compiled == "hybrid"
    h200 = get_target("h200")
    assert versions.placement(h200, 1, 64) == "fused"
    assert versions.placement(h200, 4, 4096) == "hybrid"
    long = [torch.empty(4, h, 4096, 32, dtype=torch.float16) for h in (4, 2, 2)]
    assert versions(long) is None  # the compiled placement: no second compile
    decode = [torch.empty(1, 4, 1, 32, dtype=torch.float16)] + [torch.empty(1, 2, 64, 32, dtype=torch.float16)] * 2
    assert versions(decode) is None  # Sq != Skv: the model has one S


def test_short_calls_run_the_fused_version(fn: attnfuse.AttentionFunction) -> None:
    for seed in (0, 1):
        args = _inputs(1, 40, seed)
        out, lse = fn(*args, return_lse=True)
        values = reference.run(SMALL, *args, return_all=True)
        assert isinstance(values, dict)
        assert_close(out, values["o"])
        assert_close(lse, torch.logsumexp(values["m"], dim=-1), torch.float16)
    runner = fn._runner  # noqa: SLF001
    plan = runner.inference[call_signature(_inputs(1, 40, 0))]
    assert _launches(plan.steps) == 1, "the fused version runs no pre-kernel"
    assert fn._host.plan(call_signature(_inputs(1, 40, 0))) is None  # noqa: SLF001


def test_autograd_calls_keep_the_compiled_placement(fn: attnfuse.AttentionFunction) -> None:
    args = _inputs(1, 40, 2)
    q = args[0].clone().requires_grad_()
    out = fn(q, *args[1:])
    assert_close(out, reference.run(SMALL, *args))
    plan = fn._host.plan(call_signature(args))  # noqa: SLF001
    assert plan is not None and _launches(plan.steps) == 2, "hybrid: the K pre-kernel, then the kernel"
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_no_versions_where_the_placement_is_fixed() -> None:
    pinned = attnfuse.compile(SMALL.replace("@versions", "@pinned"), target="h200",
                              pipeline=default_pipeline({"rope-fusion": "strategy=hybrid"}))
    assert pinned._runner.versions is None  # noqa: SLF001
    plain = SMALL.replace("@versions", "@norope").replace("%qr = attn.rope %q {theta = 10000.0} : tensor<?x4x?x32xf16>\n", "")
    plain = plain.replace("%kr = attn.rope %k {theta = 10000.0} : tensor<?x2x?x32xf16>\n", "")
    plain = plain.replace("attn.scores %qr, %kr", "attn.scores %q, %k")
    assert attnfuse.compile(plain, target="h200")._runner.versions is None  # noqa: SLF001
    untargeted = attnfuse.compile(SMALL.replace("@versions", "@untargeted"))
    assert untargeted._runner.versions is not None  # noqa: SLF001
    assert untargeted._runner.versions(_inputs(1, 40, 0)) is None  # on the CPU no device target  # noqa: SLF001


def test_a_version_that_fails_to_lower_leaves_the_compiled_placement() -> None:
    """An optional version whose lowering fails warns once and the call runs the compiled
    placement (right numbers, the K pre-kernel and the kernel)."""
    fn = attnfuse.compile(SMALL.replace("@versions", "@failing"), target="h200")
    versions = fn._runner.versions  # noqa: SLF001
    assert versions is not None

    def broken(passes: object) -> None:
        raise RuntimeError("no lowering today")

    versions._lower = broken  # noqa: SLF001
    args = _inputs(1, 24, 5)
    with pytest.warns(RuntimeWarning, match="lowering the 'fused' placement for short calls failed.*no lowering today"):
        out = fn(*args)
    assert_close(out, reference.run(SMALL.replace("@versions", "@failing"), *args))
    plan = fn._runner.inference[call_signature(args)]  # noqa: SLF001
    assert _launches(plan.steps) == 2 and versions.failed == {"fused"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert versions(_inputs(1, 32, 6)) is None  # not tried again
    assert not caught
