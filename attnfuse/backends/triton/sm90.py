"""Compile many emitted kernels for Hopper (sm_90) in a separate process.

`attnfuse.backends.triton.loader.compile_kernel_for_sm90` compiles one kernel in-process
(no GPU needed). `compile_all` runs that in a fresh Python process, so that test suites
can compile the kernels of several programs in parallel on several cores:

```
python -m attnfuse.backends.triton.sm90 kernels.json   # {"source": ..., "kernels": [...]}
```
prints `{"<kernel>": ".target sm_90a", ...}` as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from typing import Any

from attnfuse.backends.triton.emitter import emit_module, kernel_metadata
from attnfuse.dialects.tile import KernelOp


def compile_all(kernels: Iterable[KernelOp], timeout: float = 600) -> dict[str, str]:
    """Compile every kernel for sm_90 in a subprocess; kernel name -> PTX `.target` line."""
    kernels = list(kernels)
    payload = {
        "source": emit_module(kernels),
        "kernels": [
            {
                "name": m.name,
                "signature": m.signature,
                "num_warps": m.num_warps,
                "num_stages": m.num_stages,
            }
            for m in (kernel_metadata(k) for k in kernels)
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
        path = f.name
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "attnfuse.backends.triton.sm90", path],
            capture_output=True, text=True, env=env, timeout=timeout, check=False,
        )
    finally:
        os.unlink(path)
    if done.returncode != 0:
        raise RuntimeError(f"sm_90 compilation failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _main(path: str) -> dict[str, Any]:
    from attnfuse.backends.triton.loader import compile_for_sm90, ptx_target

    with open(path) as f:
        payload = json.load(f)
    targets: dict[str, Any] = {}
    for kernel in payload["kernels"]:
        compiled = compile_for_sm90(
            payload["source"],
            kernel["name"],
            kernel["signature"],
            num_warps=kernel["num_warps"],
            num_stages=kernel["num_stages"],
        )
        targets[kernel["name"]] = ptx_target(compiled)
    return targets


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1])))
