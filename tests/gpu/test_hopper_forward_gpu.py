"""The Hopper forward schedule (warp-specialized Gluon kernel) on an sm_90 GPU: for every
program of tests/lowering/hopper_programs.py, O and lse against the float64 reference
and against the Triton kernel (`lower-to-tile{hopper-forward=false}`), at a real size
(B=2, S=2048), at B=3, S=256, with more queries than keys and fewer (bottom-right
causal, where the first rows see no key: O = 0, lse = -inf), and at lengths that are not
multiples of 128 or a K whose head dim is strided, which must fall back to the Triton
kernel and stay right; Q, K, V as [B, H, S, D] views of [B, S, H, D] memory with the
output stored [B, S, H, D] (Hugging Face's layout) take the Gluon kernel. Each case also checks which forward kernel the launch plan ran.

The Gluon kernel cannot run in Triton's interpreter: these tests are its correctness
proof. Run on the GPU machine: `python -m pytest tests/gpu/test_hopper_forward_gpu.py -q`
(bench/hopper_forward_check.py runs the same comparisons and writes JSON).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lowering"))

from hopper_programs import ELIGIBLE, pipeline  # noqa: E402
from programs import reference_lse  # noqa: E402

import attnfuse  # noqa: E402
from attnfuse import reference  # noqa: E402
from attnfuse.diagnostics import parse_module_with_locations  # noqa: E402
from attnfuse.pass_manager import make_context  # noqa: E402
from attnfuse.program import find_functions  # noqa: E402
from attnfuse.runtime.host import call_signature  # noqa: E402
from attnfuse.runtime.launch import KernelLaunch  # noqa: E402
from attnfuse.testing import TOLERANCE, assert_close, make_inputs  # noqa: E402

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
"""Where the cases run (a CPU dry run of `compare` sets "cpu": Triton kernel only)."""

_FNS: dict[tuple[str, bool, bool], Any] = {}


def compiled(name: str, hopper: bool, bshd_out: bool = False) -> Any:
    text, pipe = ELIGIBLE[name]
    options = [*([] if hopper else ["hopper-forward=false"]), *(["out-layout=bshd"] if bshd_out else [])]
    if options:
        pipe = pipe.replace("lower-to-tile", "lower-to-tile{" + " ".join(options) + "}")
    if (name, hopper, bshd_out) not in _FNS:
        _FNS[(name, hopper, bshd_out)] = attnfuse.compile(text, pipeline=pipe)
    return _FNS[(name, hopper, bshd_out)]


def forward_kernels(fn: Any, args: list[Any]) -> list[str]:
    """Names of the forward kernels the call's launch plan ran."""
    plan = fn._host.plan(call_signature(args))
    assert plan is not None
    return [s.meta.name for s in plan.steps if isinstance(s, KernelLaunch) and s.meta.launch.get("role") == "forward"]


def inputs(name: str, batch: int, q_len: int, kv_len: int, seed: int = 0) -> list[Any]:
    text, _ = ELIGIBLE[name]
    function = find_functions(parse_module_with_locations(make_context(), text, name)[0])[0]
    return make_inputs(function, batch, q_len, kv_len, device=DEVICE, seed=seed)


def compare(name: str, batch: int, q_len: int, kv_len: int, *, expect_gluon: bool,
            layout: str = "bhsd") -> dict[str, Any]:
    """Run `name` with hopper-forward on and off; check both against the float64
    reference (O and lse) and against each other; return the errors (raises on failure).
    `layout` "bshd": the same Q, K, V values in [B, S, H, D] storage and the output
    stored so; "strided_d": K's head dim strided (no TMA descriptor reads it)."""
    text, _ = ELIGIBLE[name]
    args = inputs(name, batch, q_len, kv_len)
    if layout == "bshd":
        args[:3] = [a.transpose(1, 2).contiguous().transpose(1, 2) for a in args[:3]]
    elif layout == "strided_d":
        args[1] = args[1].transpose(2, 3).contiguous().transpose(2, 3)
    bshd = layout == "bshd"
    on, off = compiled(name, True, bshd), compiled(name, False, bshd)
    out, lse = on(*args, return_lse=True)
    out_t, lse_t = off(*args, return_lse=True)
    if bshd:
        assert out.transpose(1, 2).is_contiguous() and out_t.transpose(1, 2).is_contiguous()
    if out.is_cuda:
        torch.cuda.synchronize()
    ran = forward_kernels(on, args)
    gluon = any(k.endswith("_fwd_ws") for k in ran)
    assert gluon == expect_gluon, f"{name}: ran {ran}"
    result: dict[str, Any] = {"name": name, "batch": batch, "q_len": q_len, "kv_len": kv_len, "gluon": gluon,
                              "kernels": ran}
    want_out, want_lse = [], []
    for b in range(batch):  # the float64 reference per batch element bounds its memory
        one = [a[b:b + 1] if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == batch else a
               for a in args]
        want_out.append(reference.run(text, *one).to("cpu"))
        want_lse.append(reference_lse(text, one).to("cpu"))
    ref_out, ref_lse = torch.cat(want_out), torch.cat(want_lse)
    assert_close(out, ref_out)
    assert_close(lse, ref_lse, out.dtype)
    assert_close(out_t, ref_out)
    # the two kernels round differently but agree to twice the tolerance
    atol, rtol = TOLERANCE[out.dtype]
    diff = (out.double() - out_t.double()).abs()
    assert float((diff - 2 * (atol + rtol * out_t.double().abs())).max()) <= 0, f"{name}: vs Triton {diff.max()}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite) and torch.equal(torch.isfinite(lse_t.cpu()), finite)
    result.update(
        o_err=float((out.double().cpu() - ref_out).abs().max()),
        o_err_triton=float((out_t.double().cpu() - ref_out).abs().max()),
        lse_err=float((lse.double().cpu() - ref_lse)[finite].abs().max()) if finite.any() else 0.0,
        o_vs_triton=float(diff.max()), empty_rows=int((~finite).sum()),
    )
    return result


CASES = [
    *[(n, 2, 2048, 2048, True) for n in sorted(ELIGIBLE) if n != "bottom_right"],
    ("bottom_right", 2, 1024, 2048, True),
    *[(n, 3, 256, 256, True) for n in sorted(ELIGIBLE)],
    ("bottom_right", 3, 512, 256, True),  # more queries than keys: the first 256 rows see nothing
    ("bottom_right", 1, 128, 1152, True),
    ("llama3", 2, 200, 200, False),  # not multiples of 128: the Triton kernel
    ("window", 2, 384, 300, False),
    ("alibi", 1, 1000, 1000, False),
]


@pytest.mark.parametrize(("name", "batch", "q_len", "kv_len", "gluon"), CASES,
                         ids=[f"{c[0]}-B{c[1]}-{c[2]}x{c[3]}" for c in CASES])
def test_hopper_forward_matches_reference(name: str, batch: int, q_len: int, kv_len: int, gluon: bool) -> None:
    compare(name, batch, q_len, kv_len, expect_gluon=gluon)


def test_strided_head_dim_falls_back() -> None:
    """alibi reads K as given (no pre-kernel): a K whose head dim is strided cannot be read
    through a TMA descriptor."""
    compare("alibi", 2, 256, 256, expect_gluon=False, layout="strided_d")


@pytest.mark.parametrize("name", ["alibi", "llama3", "llama3_fused", "qwen3", "window", "d64"])
def test_bshd_layout_takes_the_gluon_kernel(name: str) -> None:
    """[B, H, S, D] views of [B, S, H, D] memory in, [B, S, H, D] out (what the Hugging
    Face backends pass and want): the descriptors read and write them in place."""
    compare(name, 2, 1024, 1024, expect_gluon=True, layout="bshd")


def test_off_by_option() -> None:
    args = inputs("llama3", 1, 256, 256)
    fn = compiled("llama3", False)
    fn(*args)
    assert all(not k.endswith("_fwd_ws") for k in forward_kernels(fn, args))
    assert pipeline(hopper=False).endswith("lower-to-tile{hopper-forward=false}")
