"""The Gluon fused-backward prototype (bench/prototypes/gluon_bwd.py) compiles for sm_90a:
no spill reloads inside the loop, shared memory under the sm_90 limit, async wgmma for
the five matmuls, TMA loads, the dQ TMA reduce-add and the dK/dV TMA stores, and
setmaxnreg budgets for the partitions. Its numerics need a GPU (the script's `main`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuse.backends.gluon.sm90 import SHARED_MEMORY_LIMIT

_ROOT = Path(__file__).parents[2]
_PROTOTYPES = _ROOT / "bench" / "prototypes"

_COMPILE = """
import json, re, sys
sys.path.insert(0, {prototypes!r})
import gluon_bwd
from attnfuse.backends.gluon.sm90 import gluon_resources
out = {{}}
for stages in (2, 3):
    compiled = gluon_bwd.compile_for_sm90(stages)
    r = gluon_resources(compiled)
    r["tma_reduce"] = len(re.findall(r"cp\\.reduce\\.async\\.bulk\\.tensor\\.2d\\.global\\.shared::cta\\.add",
                                     compiled.asm["ptx"]))
    out[stages] = r
print(json.dumps(out))
"""


def _gluon_sm90_available() -> str | None:
    """Why the prototype cannot be compiled here, or None."""
    try:
        from triton._C.libtriton import gluon_ir
        from triton.backends.nvidia.compiler import get_ptxas
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401 - availability
    except ImportError as err:
        return f"no Gluon / NVIDIA backend: {err}"
    if not hasattr(gluon_ir.GluonOpBuilder, "create_async_tma_reduce"):
        return "this Triton's Gluon builder has no create_async_tma_reduce"
    try:
        get_ptxas(90)
    except Exception as err:  # noqa: BLE001 - any failure to find ptxas means: skip
        return f"no ptxas for sm_90: {err}"
    return None


def test_gluon_bwd_prototype_compiles_for_sm90() -> None:
    reason = _gluon_sm90_available()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    done = subprocess.run([sys.executable, "-c", _COMPILE.format(prototypes=str(_PROTOTYPES))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    for stages, r in json.loads(done.stdout.splitlines()[-1]).items():
        # at most one 4-byte spill (today a scalar of the epilogue, reloaded once per CTA: SASS)
        assert r["spill_bytes"] <= 4 and r["local_loads"] <= 1, (stages, r)
        assert 0 < r["shared"] <= SHARED_MEMORY_LIMIT, (stages, r)
        # per consumer warpgroup: S^T, dP^T, dV, dK, dQ (each unrolled into its K steps)
        assert r["wgmma"] > 0 and r["tma_load"] > 0 and r["tma_store"] > 0, (stages, r)
        assert r["tma_reduce"] == 2, (stages, r)  # one per consumer warpgroup
        assert {24, 240} <= set(r["setmaxnreg"]) and r["num_warps"] == 12, (stages, r)
