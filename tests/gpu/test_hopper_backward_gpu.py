"""The Hopper backward schedule (warp-specialized Gluon kernel, dQ by TMA reduce-adds) on
an sm_90 GPU: for every program of `BACKWARD_ELIGIBLE` (tests/lowering/hopper_programs.py),
dQ, dK and dV against the float64 reference and against the Triton backward
(`lower-backward{hopper-backward=false}`) on the same inputs and upstream gradient,
at a real size, with more queries than keys and fewer (bottom-right causal, where the
first rows see no key), and at lengths that are not multiples of 128, which must fall
back to the Triton kernels. Each case checks which backward kernels the launch plan ran.

Run on the GPU machine: `python -m pytest tests/gpu/test_hopper_backward_gpu.py -q`.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from hopper_programs import BACKWARD_ELIGIBLE, backward_pipeline, backward_plans  # noqa: E402

import attnfuse  # noqa: E402
from attnfuse import reference  # noqa: E402
from attnfuse.diagnostics import parse_module_with_locations  # noqa: E402
from attnfuse.pass_manager import make_context  # noqa: E402
from attnfuse.program import find_functions  # noqa: E402
from attnfuse.runtime.launch import KernelLaunch  # noqa: E402
from attnfuse.testing import GRAD_TOLERANCE, make_inputs  # noqa: E402

pytestmark = pytest.mark.gpu

_FNS: dict[tuple[str, bool, bool], Any] = {}


def compiled(name: str, hopper: bool, bshd: bool = False) -> Any:
    """`name` with lower-backward{hopper-backward=hopper} (false: the Triton backward);
    `bshd`: the output and the gradients stored [B, S, H, D] (Hugging Face's pipeline)."""
    if (name, hopper, bshd) not in _FNS:
        pipe = backward_pipeline(hopper=hopper)
        if bshd:
            pipe = pipe.replace("{hopper-backward", "{grad-layout=bshd hopper-backward").replace(
                "lower-to-tile", "lower-to-tile{out-layout=bshd}")
        _FNS[(name, hopper, bshd)] = attnfuse.compile(BACKWARD_ELIGIBLE[name], pipeline=pipe)
    return _FNS[(name, hopper, bshd)]


def backward_kernels(fn: Any, before: Collection[Any] = ()) -> set[str]:
    """Names of the kernels of the backward launch plans built since `before` (plan keys)."""
    plans = [plan for key, plan in backward_plans(fn).items() if key not in before]
    assert plans, "no backward launch plan was built"
    return {s.meta.name for plan in plans for s in plan.steps if isinstance(s, KernelLaunch)}


def plan_keys(fn: Any) -> set[Any]:
    return set(backward_plans(fn))


def gradients(fn: Any, args: list[Any], d_out: torch.Tensor) -> list[torch.Tensor]:
    leaves = [a.detach().clone().requires_grad_() for a in args[:3]]
    fn(*leaves, *args[3:]).backward(d_out)
    return [leaf.grad for leaf in leaves]  # type: ignore[misc]


def relative_errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[float]:
    return [float((g.double().cpu() - w).abs().max()) / (float(w.abs().max()) or 1.0) for g, w in zip(got, want)]


def compare(name: str, batch: int, q_len: int, kv_len: int, *, expect_gluon: bool, bshd: bool = False) -> dict[str, Any]:
    """dQ, dK, dV of the Hopper and the Triton backward against the float64 reference;
    `bshd`: Q, K, V and the upstream gradient as [B, H, S, D] views of [B, S, H, D] memory,
    the output and the gradients stored so (`grad-layout=bshd`)."""
    text = BACKWARD_ELIGIBLE[name]
    function = find_functions(parse_module_with_locations(make_context(), text, name)[0])[0]
    args = make_inputs(function, batch, q_len, kv_len, device="cuda", seed=q_len + kv_len)
    on, off = compiled(name, True, bshd), compiled(name, False, bshd)
    out = on(*args)
    d_out = torch.randn(out.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(7)).to(out.dtype)
    if bshd:
        args[:3] = [a.transpose(1, 2).contiguous().transpose(1, 2) for a in args[:3]]
        d_out = d_out.transpose(1, 2).contiguous().transpose(1, 2)
    before = plan_keys(on)
    got, triton = gradients(on, args, d_out), gradients(off, args, d_out)
    torch.cuda.synchronize()
    if bshd:
        assert all(g.transpose(1, 2).is_contiguous() for g in got + triton), [g.stride() for g in got + triton]
    ran = backward_kernels(on, before)
    gluon = f"{name}_bwd_ws" in ran
    assert gluon == expect_gluon, f"{name}: ran {sorted(ran)}"
    want: list[list[torch.Tensor]] = [[], [], []]
    for b in range(batch):  # the float64 reference per batch element bounds its memory
        refs = [a[b:b + 1].double().requires_grad_() for a in args[:3]]
        rest = [a[b:b + 1] if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == batch else a
                for a in args[3:]]  # per-row operands (positions, document ids) follow the row
        reference.run(text, *refs, *rest).backward(d_out[b:b + 1].double())
        for i, r in enumerate(refs):
            assert r.grad is not None
            want[i].append(r.grad.cpu())
    ref = [torch.cat(w) for w in want]
    ours, theirs = relative_errors(got, ref), relative_errors(triton, ref)
    bound = GRAD_TOLERANCE[out.dtype]
    for what, e, t in zip("qkv", ours, theirs):
        # within the dtype's tolerance, and no worse than twice the Triton backward's error
        assert e <= bound and e <= 2 * max(t, torch.finfo(out.dtype).eps), (name, f"d{what}", e, t)
    return {"name": name, "batch": batch, "q_len": q_len, "kv_len": kv_len, "gluon": gluon,
            "errors": ours, "errors_triton": theirs}


CASES = [
    *[(n, 2, 1024, 1024, True) for n in BACKWARD_ELIGIBLE if n != "bottom_right"],
    ("window", 1, 2048, 2048, True),
    ("llama3", 1, 2048, 2048, True),
    ("bottom_right", 2, 512, 1024, True),
    ("bottom_right", 1, 512, 256, True),  # more queries than keys: the first 256 rows see nothing
    ("window", 3, 256, 256, True),
    ("llama3", 2, 200, 200, False),  # not multiples of 128: the Triton kernels
]


@pytest.mark.parametrize(("name", "batch", "q_len", "kv_len", "gluon"), CASES,
                         ids=[f"{c[0]}-B{c[1]}-{c[2]}x{c[3]}" for c in CASES])
def test_hopper_backward_matches_reference(name: str, batch: int, q_len: int, kv_len: int, gluon: bool) -> None:
    compare(name, batch, q_len, kv_len, expect_gluon=gluon)


def test_gradients_are_reproducible() -> None:
    """Two backward passes on the same inputs give the same bits (dK and dV are written
    once; dQ tiles are summed in key-block order)."""
    text = BACKWARD_ELIGIBLE["llama3"]
    function = find_functions(parse_module_with_locations(make_context(), text, "llama3")[0])[0]
    args = make_inputs(function, 4, 2048, 2048, device="cuda", seed=5)
    fn = compiled("llama3", True)
    d_out = torch.randn(4, 32, 2048, 128, device="cuda").to(args[0].dtype)
    before = plan_keys(fn)
    first = gradients(fn, args, d_out)
    assert "llama3_bwd_ws" in backward_kernels(fn, before)
    for _ in range(3):
        again = gradients(fn, args, d_out)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("name", ["window", "llama3", "qwen3", "alibi"])
def test_bshd_layout_takes_the_gluon_kernel(name: str) -> None:
    """[B, H, S, D] views of [B, S, H, D] memory (what the Hugging Face backends pass),
    the upstream gradient too: the descriptors read them in place."""
    compare(name, 2, 1024, 1024, expect_gluon=True, bshd=True)


def test_strided_head_dim_falls_back() -> None:
    """window reads K as given (no pre-kernel): a K whose head dim is strided cannot be
    read through a TMA descriptor."""
    text = BACKWARD_ELIGIBLE["window"]
    function = find_functions(parse_module_with_locations(make_context(), text, "window")[0])[0]
    args = make_inputs(function, 1, 256, 256, device="cuda", seed=0)
    args[1] = args[1].transpose(2, 3).contiguous().transpose(2, 3)
    fn = attnfuse.compile(text, pipeline=backward_pipeline())
    out = fn(*args)
    d_out = torch.randn(out.shape, device="cuda").to(out.dtype)
    before = plan_keys(fn)  # compiled functions of one program share their launch plans
    got = gradients(fn, args, d_out)
    ref = gradients(compiled("window", False), args, d_out)
    ran = backward_kernels(fn, before)
    assert "window_bwd_dkdv" in ran and "window_bwd_ws" not in ran, sorted(ran)
    # the same Triton kernels, dQ summed into an f32 buffer and cast
    assert max(relative_errors(got, [r.double().cpu() for r in ref])) <= GRAD_TOLERANCE[out.dtype]
