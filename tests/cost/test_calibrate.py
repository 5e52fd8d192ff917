"""`attnfuse-calibrate` profiles: loading them as targets, errors, the measuring kernels."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from attnfuse import examples
from attnfuse.driver import AttnfuseOptMain
from attnfuse.cost.target import UnknownTargetError, get_target, target_from_profile
from attnfuse.runtime import calibrate


def _driver(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        AttnfuseOptMain(args=args).run()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def _profile(name: str = "calibrated:test-gpu") -> dict[str, object]:
    """What attnfuse-calibrate writes, with the H200 table's figures."""
    h200 = get_target("h200")
    profile = {f.name: getattr(h200, f.name) for f in dataclasses.fields(h200) if not f.name.startswith("measured_")}
    profile["tensor_flops"] = dict(h200.tensor_flops)
    profile["name"] = name
    profile["source"] = "test"
    return profile


def test_profile_is_a_target_with_measured_overrides(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(_profile()))
    target = get_target(str(path))
    h200 = get_target("h200")
    assert target.name == "calibrated:test-gpu" and target.sms == h200.sms
    assert target.matmul_flops("bf16") == h200.peak_tensor_flops("bf16")  # measured = the profile's
    assert target.bandwidth() == h200.hbm_bw
    path.write_text(json.dumps(_profile("calibrated:again")))  # a rewritten profile is read again
    assert get_target(str(path)).name == "calibrated:again"


def test_profile_warp_specialized_is_optional() -> None:
    """A profile says whether the GPU runs the sm_90 Gluon schedules; one written before
    the field existed reads as false."""
    assert target_from_profile(_profile()).warp_specialized is True  # the H200's figures
    old = {k: v for k, v in _profile().items() if k != "warp_specialized"}
    assert target_from_profile(old).warp_specialized is False


def test_cost_report_and_pipeline_with_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(_profile()))
    args = [str(examples.path("llama3")), "--device", str(path), "--seq-len", "2048", "--cost-report"]
    code, out, _ = _driver(args, capsys)
    assert code == 0 and "@llama3 on calibrated:test-gpu: B=8" in out
    code, out, _ = _driver([str(examples.path("llama3")), "--device", str(path), "-p",
                            "attn-canonicalize,rope-fusion,online-softmax"], capsys)
    assert code == 0 and 'placement = "kernel"' in out


@pytest.mark.parametrize(("content", "message"), [
    ("{}", "not a cost-model profile, missing name, vendor, sms"),
    ("[1, 2]", "not a cost-model profile (a JSON object)"),
    ("{not json", "cannot read the target profile"),
])
def test_bad_profiles_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                       message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(UnknownTargetError, match="not a cost-model profile|cannot read"):
        get_target(str(path))
    code, _, err = _driver([str(examples.path("llama3")), "--device", str(path), "--cost-report"], capsys)
    assert code in (1, 2) and message in err and "Traceback" not in err
    with pytest.raises(UnknownTargetError, match="does not exist"):
        get_target(str(tmp_path / "missing.json"))
    bad_value = _profile() | {"sms": "many"}
    with pytest.raises(UnknownTargetError, match="bad value"):
        target_from_profile(bad_value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_calibrate_without_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert calibrate.main(["--out", str(tmp_path / "p.json")]) == 1
    assert "measures a CUDA GPU and none is visible" in capsys.readouterr().out
    assert not (tmp_path / "p.json").exists()


def test_measuring_kernels_compile_for_sm90() -> None:
    """The FMA and sin.approx loops compile for Hopper (no GPU needed): both loops
    survive (no folding away) and the special-function loop uses the MUFU instruction."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = calibrate._loop_kernel()
    for sin, instruction, other in ((False, "fma.rn.f32", "sin.approx.f32"), (True, "sin.approx.f32", "fma.rn.f32")):
        source = ASTSource(kernel, {"X": "*fp32", "ITERS": "constexpr", "BLOCK": "constexpr", "SIN": "constexpr"},
                           {(1,): 8, (2,): 1024, (3,): sin})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        assert instruction in compiled.asm["ptx"] and other not in compiled.asm["ptx"]


def test_l2_read_kernel_compiles_for_sm90() -> None:
    """The L2 read loop compiles for Hopper with its load inside the loop (bypassing L1:
    `.cg`), not hoisted out of it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(calibrate._read_kernel(), {"X": "*fp32", "Out": "*fp32", "CHUNKS": "constexpr",
                                                  "PASSES": "constexpr", "BLOCK": "constexpr"},
                       {(2,): 960, (3,): 64, (4,): 4096})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = compiled.asm["ptx"]
    loop = ptx[ptx.index("$L__BB0_"):]  # the first label opens the loop body
    assert "ld.global.cg" in loop and "ld.global.cg" not in ptx[:ptx.index("$L__BB0_")]
