"""`qk_side.sin_cos`, the branch-free cos/sin of in-kernel RoPE, against float64 on the
f32 angles RoPE forms (through the Triton interpreter), and its point: a decode split
kernel that rotates its queries issues its first K/V loads with no branch ahead of them
(sm_90 PTX)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch
from xdsl.dialects.builtin import f32

from attnfuse.backends.triton.emitter import emit_module
from attnfuse.dialects.tile_builder import TileBuilder
from attnfuse.dialects.tile_types import PtrType
from attnfuse.lowering.qk_side import sin_cos
from attnfuse.runtime.loader import load_kernels

N = 1024


def _run(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = TileBuilder.kernel("sin_cos", [("x", PtrType(f32)), ("c", PtrType(f32)), ("s", PtrType(f32))], launch={})
    x, c, s = b.args
    i = b.arange(0, N)
    cos, sin = sin_cos(b, b.load(x, i))
    b.store(c, i, cos)
    b.store(s, i, sin)
    kernel = b.finish()
    kernel.verify()
    fn = load_kernels(emit_module(kernel), interpret=True)["sin_cos"]
    cos_out, sin_out = torch.empty(N), torch.empty(N)
    fn[(1,)](angles, cos_out, sin_out)
    return cos_out, sin_out


def _angles(high: float, seed: int) -> torch.Tensor:
    """RoPE's f32 angles (position x Llama-3 frequency) and uniform ones in [-high, high]."""
    g = torch.Generator().manual_seed(seed)
    freq = 500000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    pos = torch.randint(0, int(high), (N // 2,), generator=g).double()
    rope = (pos.float() * freq.float()[torch.arange(N // 2) % 64])
    uniform = (torch.rand(N // 2, generator=g, dtype=torch.float64) * 2 - 1) * high
    return torch.cat([rope, uniform.float()])


@pytest.mark.parametrize(("high", "bound"), [(10.0, 2e-7), (8000.0, 5e-7), (131072.0, 1e-5)])
def test_sin_cos_matches_float64(high: float, bound: float) -> None:
    """Within a few f32 ulps of 1 below 10^4 (the interpreter rounds `fma` twice; the
    GPU fuses it); beyond, within 1e-5, far below the f32 angle's own rounding there
    (ulp(131072) = 0.0156)."""
    angles = _angles(high, seed=int(high))
    cos, sin = _run(angles)
    exact = angles.double()
    assert float((cos.double() - exact.cos()).abs().max()) <= bound
    assert float((sin.double() - exact.sin()).abs().max()) <= bound
    assert math.isclose(float(cos[0]), math.cos(float(angles[0])), abs_tol=bound)


def test_quadrants_and_signs() -> None:
    """Every quadrant, both signs, and the points where the quadrant count changes."""
    k = torch.arange(-N // 8, N // 8, dtype=torch.float64)
    angles = torch.cat([k * math.pi / 2, k * math.pi / 2 + math.pi / 4 - 1e-6, k * math.pi / 2 + 0.3,
                        k * math.pi / 2 - 0.3]).float()
    cos, sin = _run(angles)
    exact = angles.double()
    assert float((cos.double() - exact.cos()).abs().max()) <= 5e-7
    assert float((sin.double() - exact.sin()).abs().max()) <= 5e-7


def test_rope_decode_split_kernel_loads_kv_before_any_branch() -> None:
    """bench/decode.py's program with RoPE on the new queries: its 16-row split kernel
    evaluates cos/sin itself (no table kernel) and has no branch between its start and
    its first cp.async at sm_90 (libdevice's `sin`/`cos` put 112 there) but the one that
    skips an empty KV loop (`SplitKernel._kv_range`), after the rotation's arithmetic."""
    from attnfuse.backends.triton.sm90 import compile_kernel_for_sm90
    from attnfuse.dialects.tile import KernelOp
    from attnfuse.pass_manager import PassManager, make_context
    from attnfuse.passes import default_pipeline
    from attnfuse.reference import parse_program

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from decode import ROPE_PROGRAM

    module = parse_program(ROPE_PROGRAM)
    PassManager(default_pipeline(without=["lower-backward"])).run(module, make_context())
    kernels = {op.sym_name.data: op for op in module.walk() if isinstance(op, KernelOp)}
    ptx = compile_kernel_for_sm90(kernels["rope_decode_split_kv_small"], specialize=True).asm["ptx"]
    lines = ptx.splitlines()
    first_load = next(i for i, line in enumerate(lines) if "cp.async" in line)
    assert "sin.approx" not in ptx and "cos.approx" not in ptx
    branches = [i for i, line in enumerate(lines[:first_load]) if re.search(r"\bbra(\.uni)?\b", line)]
    last_fma = max(i for i, line in enumerate(lines[:first_load]) if "fma" in line)
    assert len(branches) <= 1 and all(i > last_fma for i in branches), branches
