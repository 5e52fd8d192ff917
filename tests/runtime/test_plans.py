"""The run-time package: no environment side effects, launch plans, compiled variants."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

import attnfuse
from attnfuse import examples, reference
from attnfuse.runtime import checks, host, loader
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.testing import assert_close
from tiny import TINY

ROOT = Path(__file__).resolve().parents[2]


def tiny_inputs(batch: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 2, length, 32, generator=g) for _ in range(3)]


def test_import_changes_no_environment_and_cpu_runs_interpreted() -> None:
    """A fresh process without TRITON_INTERPRET: importing every attnfuse module leaves
    os.environ alone, and CPU tensors still run (through the interpreter)."""
    script = textwrap.dedent(
        f"""
        import os, pkgutil, importlib
        before = dict(os.environ)
        import attnfuse
        for m in pkgutil.walk_packages(attnfuse.__path__, "attnfuse."):
            if m.name not in ("attnfuse.__main__",):
                importlib.import_module(m.name)
        assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
        import torch
        from attnfuse import reference, testing
        text = {TINY!r}
        fn = attnfuse.compile(text)
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(2, 2, 19, 32, generator=g) for _ in range(3))
        testing.assert_close(fn(q, k, v), reference.run(text, q, k, v))
        assert dict(os.environ) == before
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_hot_path_does_no_program_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first call of a shape class, a call neither walks IR, parses, hashes
    source, rebuilds steps, re-checks the signature, nor reloads kernels."""
    fn = attnfuse.compile(TINY)
    q, k, v = tiny_inputs(2, 21)
    first = fn(q, k, v)
    q2, k2, v2 = tiny_inputs(2, 21, seed=5)  # new data, same shape class
    expected = reference.run(TINY, q2, k2, v2)

    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("program-only work on the hot path")

    from xdsl.ir import Operation
    from xdsl.parser import Parser

    monkeypatch.setattr(Operation, "walk", forbidden)
    monkeypatch.setattr(Parser, "__init__", forbidden)
    monkeypatch.setattr(loader, "source_digest", forbidden)
    monkeypatch.setattr(loader, "load_kernels", forbidden)
    monkeypatch.setattr(host.HostProgram, "_build", forbidden)
    monkeypatch.setattr(checks.ArgumentChecker, "check", forbidden)
    out = fn(q2, k2, v2)
    assert_close(out, expected)
    assert not torch.equal(out, first)
    with pytest.raises(AssertionError, match="program-only work"):
        fn(*tiny_inputs(2, 22))  # a new shape class builds a plan


def test_plans_per_shape_class() -> None:
    fn = attnfuse.compile(TINY.replace("@tiny", "@tiny_classes"))  # plans of its own (shared per program)
    for length in (5, 5, 17):
        fn(*tiny_inputs(1, length))
    q, k, v = tiny_inputs(1, 17)
    fn(q.transpose(1, 2).contiguous().transpose(1, 2), k, v)  # another layout: another class
    assert fn._host.plan_count() == 3  # noqa: SLF001


def _specializations(kernel: Any, args: list[Any]) -> tuple[Any, ...]:
    """Triton's specialization of one launch (what selects a compiled variant)."""
    key = []
    for param, arg in zip(kernel.params, args):
        spec = native_specialize_impl(BaseBackend, arg, param.is_const, not param.do_not_specialize,
                                      not param.do_not_specialize_on_alignment)
        key.append(spec)
    return tuple(key)


def test_at_most_two_variants_per_kernel_across_lengths_and_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The llama3 example (K pre-kernel, forward, and two cos/sin tables: bf16 for the
    kernel's Q rotation, f32 for the pre-kernel): lengths and batch sizes are not
    specialized on, so S in {127, ..., 4096} and B in {1, 3} give at most 2 variants
    (length % 16 shows only through strides, e.g. lse's)."""
    fn = attnfuse.compile(examples.path("llama3"))
    jit = loader.load_kernels(fn.triton_source, interpret=False)
    assert "@triton.jit(do_not_specialize=[" in fn.triton_source
    seen: dict[str, set[tuple[Any, ...]]] = {}

    def record(self: KernelLaunch, slots: list[Any]) -> None:
        args = self.template.copy()
        for position, slot in self.fill:
            args[position] = slots[slot]
        seen.setdefault(self.meta.name, set()).add(_specializations(jit[self.meta.name], args))

    monkeypatch.setattr(KernelLaunch, "__call__", record)
    for batch in (1, 3):
        for length in (127, 128, 129, 2048, 2049, 4096):
            q = torch.empty(batch, 32, length, 128, dtype=torch.bfloat16)
            k = torch.empty(batch, 8, length, 128, dtype=torch.bfloat16)
            fn(q, k, k)
    assert set(seen) == {"llama3_k_prologue", "llama3_fwd", "llama3_rope_table0", "llama3_rope_table1"}
    assert all(len(variants) <= 2 for variants in seen.values()), {n: len(v) for n, v in seen.items()}


CHUNKED = """
func.func @chunked(%q: tensor<?x2x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x2x?x32xf32>) -> tensor<?x2x?x32xf32> {
  %s = attn.scores %q, %k : tensor<?x2x?x32xf32>, tensor<?x2x?x32xf32> -> !attn.scores<?x2x?x?xf32>
  %m = attn.mask custom %s : !attn.scores<?x2x?x?xf32> {
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %n = arith.constant 24 : index
    %cq = arith.divsi %qi, %n : index
    %ck = arith.divsi %ki, %n : index
    %same = arith.cmpi eq, %cq, %ck : index
    attn.yield %same : i1
  }
  %p = attn.softmax %m : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x2x?x?xf32>, tensor<?x2x?x32xf32> -> tensor<?x2x?x32xf32>
  func.return %o : tensor<?x2x?x32xf32>
}
"""


def _plan_kernels(fn: Any) -> list[str]:
    plans = list(fn._host._plans.values())  # noqa: SLF001
    assert len(plans) == 1
    return [s.meta.name for s in plans[0].steps if isinstance(s, KernelLaunch)]


def test_static_block_map_runs_once_per_plan() -> None:
    """A custom mask over indices only needs a runtime block map that depends on
    shapes alone: it is built with the plan and kept. Document ids make the map depend
    on data: it is rebuilt on every call."""
    fn = attnfuse.compile(CHUNKED)
    assert "chunked_block_map" in fn.triton_source
    for seed in (0, 1):  # the second call reuses the kept map
        q, k, v = tiny_inputs(2, 50, seed)
        assert_close(fn(q, k, v), reference.run(CHUNKED, q, k, v))
    assert _plan_kernels(fn) == ["chunked_fwd"]

    from attnfuse.program import find_functions
    from attnfuse.reference import parse_program
    from attnfuse.testing import make_inputs

    text = examples.path("document").read_text()
    doc = attnfuse.compile(text)
    doc(*make_inputs(find_functions(parse_program(text))[0], 1, 24, 24))
    assert any(name.endswith("_block_map") for name in _plan_kernels(doc))


def test_top_left_causal_with_fewer_queries_warns_once_per_shape_class() -> None:
    """Decoding against a cache with a top-left causal mask sees keys <= i only: the
    runtime says so (once per shape class, at the caller); bottom-right and Sq == Skv
    stay silent, and the answer is still the documented one."""
    import warnings

    fn = attnfuse.compile(TINY)
    q, k, v = tiny_inputs(1, 1)[0], *tiny_inputs(1, 24)[1:]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = fn(q, k, v)
            fn(q, k, v)
    assert [str(w.message) for w in caught] == [
        f"@{fn.name}: causal / window mask aligned top-left with 1 queries and 24 keys: query i sees keys up "
        'to i only (not the last 23 keys of a cache); for decoding against a KV cache write the mask with '
        'align = "bottom_right"']
    assert caught[0].filename == __file__
    assert_close(out, reference.run(TINY, q, k, v))
    bottom_right = TINY.replace("attn.mask causal %s", 'attn.mask causal %s {align = "bottom_right"}')
    assert bottom_right != TINY
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            attnfuse.compile(bottom_right)(q, k, v)
            fn(*tiny_inputs(1, 24))
    assert not caught
