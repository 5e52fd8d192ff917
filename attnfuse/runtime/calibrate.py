"""`attnfuse-calibrate`: measure the GPU at hand and write a cost-model profile.

The cost model (`attnfuse.cost`) knows the GPUs of its table; for any other, measure
this one and pass the profile where a target name goes (`attnfuse-opt --device
profile.json`, `attnfuse.compile(..., target="profile.json")`):

    attnfuse-calibrate --out h200.json        # or: python -m attnfuse.runtime.calibrate

Measured (median of `triton.testing.do_bench`): dense matmul FLOP/s in bf16, f16 and
tf32 (`torch.matmul`, n = 8192), device copy bandwidth (1 GiB), L2 read bandwidth (a
Triton kernel whose programs read a buffer of a quarter of the L2 over and over, so
that after the first pass every read hits L2), FP32 vector FMA rate and
special-function rate (`sin.approx`) from Triton loops. A single copy of an L2-sized
buffer, what this measured before, is too short to leave its launch and ramp behind:
on an H200 it gave 2.5 TB/s, less than the HBM copy. Read from the device: SMs, L2
size, shared memory and registers per SM, clock. Shared-memory bandwidth is derived
(128 bytes per SM per clock), as in the table. The profile is JSON in `Target`'s fields (`attnfuse.cost.target.target_from_profile`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["measure", "main"]

_ITERS = 256
_BLOCK = 1024
_PASSES = 64


def _loop_kernel() -> Any:
    """A loop of FMAs (SIN=False) or `sin.approx` (SIN=True), four independent chains per
    element for ILP."""
    import triton
    import triton.language as tl

    @triton.jit
    def _step(x, SIN: tl.constexpr):  # type: ignore[no-untyped-def]
        if SIN:
            return tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
        return x * 0.999 + 0.001

    @triton.jit
    def loop(X, ITERS: tl.constexpr, BLOCK: tl.constexpr, SIN: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(X + offs)
        b, c, d = a + 1.0, a + 2.0, a + 3.0
        for _ in range(ITERS):
            a = _step(a, SIN)
            b = _step(b, SIN)
            c = _step(c, SIN)
            d = _step(d, SIN)
        tl.store(X + offs, a + b + c + d)

    return loop


def _read_kernel() -> Any:
    """Program `p` reads chunks ``(p + i) % CHUNKS`` of X (``BLOCK`` elements each) for
    ``i < PASSES`` (a different chunk each pass: no load is loop-invariant) and stores
    their sum (so the reads stay)."""
    import triton
    import triton.language as tl

    @triton.jit
    def read(X, Out, CHUNKS: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        acc = tl.zeros((BLOCK,), tl.float32)
        for i in range(PASSES):
            acc += tl.load(X + ((pid + i) % CHUNKS) * BLOCK + tl.arange(0, BLOCK), cache_modifier=".cg")
        tl.store(Out + pid, tl.sum(acc))

    return read


def _l2_bandwidth(l2_bytes: int, sms: int) -> float:
    """Bytes per second read from L2 by every SM at once (see the module docstring)."""
    block = 4096
    chunks = max(1, (l2_bytes // 4) // (4 * block))
    x = torch.rand(chunks * block, device="cuda")
    programs = max(chunks, 8 * sms)
    out = torch.empty(programs, device="cuda")
    kernel = _read_kernel()
    ms = _ms(lambda: kernel[(programs,)](x, out, CHUNKS=chunks, PASSES=_PASSES, BLOCK=block, num_warps=8))
    return programs * _PASSES * block * 4 / (ms * 1e-3)


def _ms(fn: Callable[[], object]) -> float:
    import triton

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median"))


def _matmul_flops(dtype: torch.dtype, n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return 2.0 * n**3 / (_ms(lambda: torch.matmul(a, b)) * 1e-3)


def _copy_bandwidth(nbytes: int) -> float:
    x = torch.empty(nbytes, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    return 2.0 * nbytes / (_ms(lambda: y.copy_(x)) * 1e-3)


def _loop_rate(kernel: Any, sms: int, per_element: int, *, sin: bool) -> float:
    elements = sms * 64 * _BLOCK  # enough programs to fill every SM many times
    x = torch.rand(elements, device="cuda")
    grid = (elements // _BLOCK,)
    ms = _ms(lambda: kernel[grid](x, ITERS=_ITERS, BLOCK=_BLOCK, SIN=sin, num_warps=4))
    return per_element * 4 * _ITERS * elements / (ms * 1e-3)


def measure(name: str | None = None) -> dict[str, Any]:
    """The profile of the current CUDA device (see the module docstring)."""
    if not torch.cuda.is_available():
        raise RuntimeError("attnfuse-calibrate measures a CUDA GPU and none is visible (torch.cuda.is_available() is False)")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    sms = int(props.multi_processor_count)
    loop = _loop_kernel()
    vector = _loop_rate(loop, sms, per_element=2, sin=False)  # an FMA counts 2 FLOPs
    clock_khz = getattr(props, "clock_rate", 0)
    lanes = 64 if (props.major, props.minor) in ((7, 0), (8, 0)) else 128  # FP32 lanes per SM
    clock = clock_khz * 1e3 if clock_khz else vector / (2 * lanes * sms)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        f32 = _matmul_flops(torch.float32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    l2 = int(props.L2_cache_size)
    return {
        "name": name or f"calibrated:{props.name}",
        "vendor": "amd" if getattr(torch.version, "hip", None) else "nvidia",
        "sms": sms,
        "clock_hz": clock,
        "tensor_flops": {"bf16": _matmul_flops(torch.bfloat16), "f16": _matmul_flops(torch.float16), "f32": f32},
        "vector_f32_flops": vector,
        "sfu_ops": _loop_rate(loop, sms, per_element=1, sin=True),
        "hbm_bw": _copy_bandwidth(1 << 30),
        "l2_bytes": l2,
        "l2_bw": _l2_bandwidth(l2, sms),
        "smem_per_sm": int(props.shared_memory_per_multiprocessor),
        "smem_bw": 128.0 * sms * clock,
        "regs_per_sm": int(props.regs_per_multiprocessor),
        "warp_specialized": props.major == 9 and not getattr(torch.version, "hip", None),
        "source": f"attnfuse-calibrate on {props.name}, torch {torch.__version__}, "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnfuse-calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the profile (JSON)")
    parser.add_argument("--name", help="the target's name in cost reports (default: calibrated:<GPU name>)")
    args = parser.parse_args(argv)
    try:
        profile = measure(args.name)
    except RuntimeError as e:
        print(f"attnfuse-calibrate: error: {e}")
        return 1
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"attnfuse-calibrate: wrote {args.out} ({profile['name']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
