"""GPU check of the Hopper forward schedule (lower-to-tile{hopper-forward}): correctness,
then speed, in one command (< 5 min on an H200):

    python bench/hopper_forward_check.py [--out DIR] [--seqs 2048 4096 8192 16384] [--quick]

1. correctness: the comparisons of tests/gpu/test_hopper_forward_gpu.py (every eligible
   program against the float64 reference and the Triton kernel, O and lse, which
   forward kernel ran; shapes that must fall back);
2. speed: Llama-3-8B forward (32/8 heads, D=128, bf16, causal, RoPE; rope-fusion hybrid)
   with hopper-forward on and off, next to SDPA cuDNN + torch.compile'd RoPE (the
   baselines of bench/run_all.py), at B*S = 16384, S = 2048 .. 16384.

The work runs in a child process killed after --timeout seconds without progress (a
wrong mbarrier phase hangs the kernel instead of failing); DIR/hopper_forward_check.json
is rewritten after every step, so a crash or a hang keeps what was measured before it.
DIR defaults to $OUT, else bench/out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICK_CASES = [("llama3", 2, 2048, 2048, True), ("qwen3", 3, 256, 256, True), ("llama3", 2, 200, 200, False)]


def worker(path: Path, seqs: list[int], quick: bool) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests" / "gpu"), str(ROOT / "tests" / "lowering")]
    import torch

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "checks": [], "timing": []}

    def save() -> None:
        path.write_text(json.dumps(res, indent=1))

    save()
    import test_hopper_forward_gpu as gpu_tests

    cases = QUICK_CASES if quick else gpu_tests.CASES
    for name, batch, q_len, kv_len, gluon in cases:
        t0 = time.time()
        try:
            row = gpu_tests.compare(name, batch, q_len, kv_len, expect_gluon=gluon)
            row["ok"] = True
        except Exception as exc:  # reported, never hidden
            row = {"name": name, "batch": batch, "q_len": q_len, "kv_len": kv_len, "ok": False,
                   "error": f"{type(exc).__name__}: {exc}"[:600], "trace": traceback.format_exc()[-1500:]}
        row["s"] = round(time.time() - t0, 1)
        res["checks"].append(row)
        print(row, flush=True)
        save()
    if not quick:
        try:
            gpu_tests.compare("alibi", 2, 256, 256, expect_gluon=False, layout="strided_d")
            res["checks"].append({"name": "alibi strided K falls back", "ok": True})
        except Exception as exc:
            res["checks"].append({"name": "alibi strided K falls back", "ok": False, "error": repr(exc)[:600]})
        save()

    import run_all

    on, off = run_all.pipeline("hybrid"), run_all.pipeline("hybrid", lower="hopper-forward=false")
    for seq in seqs:
        q, k, v, _ = run_all.inputs(seq)
        base = run_all.Baselines(seq)
        cudnn = base.sdpa("cudnn")
        ref = cudnn(q, k, v)
        row: dict[str, Any] = {"seq": seq, "batch": q.shape[0], "cudnn_rope_ms": run_all.bench(lambda: cudnn(q, k, v))}
        for label, pipe in (("hopper", on), ("triton", off)):
            try:
                fn = run_all.compiled(pipe)
                out = fn(q, k, v)
                row[f"{label}_kernels"] = gpu_tests.forward_kernels(fn, [q, k, v])
                row[f"{label}_err_vs_cudnn"] = float((out.float() - ref.float()).abs().max())
                row[f"{label}_ms"] = run_all.bench(lambda fn=fn: fn(q, k, v))
                row[f"{label}_vs_cudnn"] = row["cudnn_rope_ms"] / row[f"{label}_ms"]
                row[f"{label}_tflops"] = run_all.fwd_flops(seq) / row[f"{label}_ms"] / 1e9
            except Exception as exc:
                row[f"{label}_error"] = f"{type(exc).__name__}: {exc}"[:600]
        res["timing"].append(row)
        print(row, flush=True)
        save()
        del q, k, v, ref
        torch.cuda.empty_cache()
    res["done"] = True
    save()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench" / "out")))
    ap.add_argument("--seqs", type=int, nargs="*", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--quick", action="store_true", help="three correctness cases only")
    ap.add_argument("--timeout", type=int, default=150, help="seconds without progress before the child is killed")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(Path(a.worker), a.seqs, a.quick)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "hopper_forward_check.json"
    cmd = [sys.executable, __file__, "--worker", str(path), "--seqs", *map(str, a.seqs)] + (["--quick"] if a.quick else [])
    child = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    last = time.time()
    while child.poll() is None:
        time.sleep(2)
        if path.exists() and path.stat().st_mtime > last:
            last = path.stat().st_mtime
        if time.time() - last > a.timeout:
            child.kill()
            res = json.loads(path.read_text()) if path.exists() else {}
            res["killed"] = f"no progress for {a.timeout} s (a hang?)"
            path.write_text(json.dumps(res, indent=1))
            break
    res = json.loads(path.read_text()) if path.exists() else {}
    ok = res.get("done") and all(c.get("ok") for c in res.get("checks", []))
    print(json.dumps({"checks_failed": [c["name"] for c in res.get("checks", []) if not c.get("ok")],
                      "timing": res.get("timing", []), "killed": res.get("killed")}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
