"""GPU runner (H100/H200, Triton 3.6 + torch) for the Gluon FA3 forward prototypes of
gluon_fa3_forward.py: correctness of O and LSE, then time against SDPA cuDNN in the same run.

    python bench/prototypes/run_gluon_fa3.py                # all variants, writes $OUT/gluon_fa3.json
    python bench/prototypes/run_gluon_fa3.py ws:2 ws_coop:2 simple:3  # chosen variant:STAGES

Each variant runs in its own subprocess, killed when it makes no progress for STALL_S
seconds (a wrong mbarrier phase hangs the GPU kernel forever instead of failing), in three phases: small shapes (S = 128, 256, 512,
B = 1..3) against an fp32 reference of every head; then B*S = 16384, S = 2048..16384
against SDPA cuDNN (O of every head) and an fp32 reference of a few heads (O and LSE);
then timing (triton.testing.do_bench, median) of the kernel launch with pre-built
descriptors, next to SDPA cuDNN (enable_gqa=True) timed in the same process.
LSE is compared in the natural log (what the kernel writes).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

H, HKV, D = 32, 8, 128
SIZES = (2048, 4096, 8192, 16384)
DEFAULT_VARIANTS = ("ws:2", "ws:3", "ws_coop:2", "simple:3", "simple:2")
TIMEOUT_S = int(os.environ.get("GLUON_TIMEOUT_S", "600"))
"""Wall-clock limit of one variant's worker."""
STALL_S = int(os.environ.get("GLUON_STALL_S", "150"))
"""A worker whose JSON has not been rewritten for this long is taken to hang (each step,
compile included, takes seconds), and killed."""


def reference_heads(q, k, v, heads: list[tuple[int, int]], chunk: int = 2048):
    """fp32 causal attention (O, natural-log LSE) of the (batch, q head) pairs `heads`."""
    import torch

    S = q.shape[2]
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[3])
    outs, lses = [], []
    for b, h in heads:
        qf, kf, vf = q[b, h].float(), k[b, h // group].float(), v[b, h // group].float()
        o = torch.empty(S, q.shape[3], device=q.device)
        lse = torch.empty(S, device=q.device)
        for r0 in range(0, S, chunk):
            r1 = min(S, r0 + chunk)
            s = (qf[r0:r1] @ kf[:r1].T) * scale
            rows = torch.arange(r0, r1, device=q.device)[:, None]
            cols = torch.arange(0, r1, device=q.device)[None, :]
            s = s.masked_fill(cols > rows, float("-inf"))
            lse[r0:r1] = torch.logsumexp(s, dim=1)
            o[r0:r1] = torch.softmax(s, dim=1) @ vf[:r1]
        outs.append(o)
        lses.append(lse)
    return outs, lses


def worker(variant: str, stages: int, path: str) -> dict[str, Any]:
    """All checks and timings of one variant (runs in a subprocess); the JSON at `path` is
    rewritten after every step, so a crash keeps what was measured before it."""
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import gluon_fa3_forward as fa3

    res: dict[str, Any] = {"variant": variant, "stages": stages, "small": [], "rows": []}

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    save()

    def rand(B, S):
        torch.manual_seed(1234 + S + B)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
        return q, k, v

    # phase 1: small shapes, every head against fp32
    for B, S in ((1, 128), (2, 256), (3, 512), (1, 1024)):
        q, k, v = rand(B, S)
        t0 = time.time()
        o, lse = fa3.launch(q, k, v, variant, stages)
        torch.cuda.synchronize()
        heads = [(b, h) for b in range(B) for h in range(H)]
        ro, rl = reference_heads(q, k, v, heads)
        o_err = max((o[b, h].float() - r).abs().max().item() for (b, h), r in zip(heads, ro))
        l_err = max((lse[b, h] - r).abs().max().item() for (b, h), r in zip(heads, rl))
        res["small"].append({"B": B, "S": S, "o_err_vs_fp32": o_err, "lse_err_vs_fp32": l_err,
                             "first_call_s": round(time.time() - t0, 2)})
        print(variant, stages, res["small"][-1], flush=True)
        save()

    # phase 2 + 3: B*S = 16384
    def bench(fn):
        return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))

    for S in SIZES:
        B = 16384 // S
        q, k, v = rand(B, S)
        row: dict[str, Any] = {"S": S, "B": B}
        flops = 4.0 * B * H * S * S * D / 2  # causal: half of the QK^T and PV flops
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            row["cudnn_ms"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
        o, lse = fa3.launch(q, k, v, variant, stages)
        torch.cuda.synchronize()
        row["o_err_vs_cudnn"] = (o.float() - ref.float()).abs().max().item()
        heads = [(0, 0), (0, 5), (B - 1, H - 1)]
        ro, rl = reference_heads(q, k, v, heads)
        row["o_err_vs_fp32"] = max((o[b, h].float() - r).abs().max().item() for (b, h), r in zip(heads, ro))
        row["cudnn_o_err_vs_fp32"] = max((ref[b, h].float() - r).abs().max().item() for (b, h), r in zip(heads, ro))
        row["lse_err_vs_fp32"] = max((lse[b, h] - r).abs().max().item() for (b, h), r in zip(heads, rl))
        args, kwargs, grid, _o, _lse = fa3.make_args(q, k, v, variant, stages)
        kernel = fa3.KERNELS[variant][0]
        row["gluon_ms"] = bench(lambda: kernel[grid](*args, **kwargs))
        row["gluon_launch_ms"] = bench(lambda: fa3.launch(q, k, v, variant, stages))  # incl. host descriptors
        row["gluon_tflops"] = flops / row["gluon_ms"] * 1e-9
        row["cudnn_tflops"] = flops / row["cudnn_ms"] * 1e-9
        row["gluon_over_cudnn"] = row["cudnn_ms"] / row["gluon_ms"]  # > 1: faster than cuDNN
        res["rows"].append(row)
        print(variant, stages, row, flush=True)
        save()
        del q, k, v, ref, o, lse, args
        torch.cuda.empty_cache()
    kernel = fa3.KERNELS[variant][0]
    try:  # registers / smem of the compiled kernel as the driver sees it
        compiled = list(kernel.device_caches[0][0].values())
        res["compiled"] = [{"n_regs": c.n_regs, "n_spills": c.n_spills, "shared": c.metadata.shared}
                           for c in compiled]
    except Exception as e:  # noqa: BLE001 - best effort
        res["compiled_error"] = repr(e)
    return res


def _partial(path: str, variant: str, stages: int) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"variant": variant, "stages": stages}


def main() -> int:
    out_dir = os.environ.get("OUT", "/tmp")
    os.makedirs(out_dir, exist_ok=True)
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        variant, stages, path = sys.argv[2], int(sys.argv[3]), sys.argv[4]
        try:
            worker(variant, stages, path)
        except Exception:  # noqa: BLE001 - reported in the JSON, next to what was measured
            with open(path) as f:
                res = json.load(f)
            res["error"] = traceback.format_exc()
            print(res["error"], flush=True)
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
        return 0

    import torch
    import triton

    specs = sys.argv[1:] or list(DEFAULT_VARIANTS)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "triton": triton.__version__, "variants": []}
    for spec in specs:
        variant, _, stages = spec.partition(":")
        stages = int(stages) if stages else None
        from gluon_fa3_forward import KERNELS  # noqa: E402 - for the default stage count only

        stages = stages or KERNELS[variant][3]
        path = os.path.join(out_dir, f"gluon_fa3_{variant}_{stages}.json")
        t0 = time.time()
        if os.path.exists(path):
            os.remove(path)
        proc = subprocess.Popen([sys.executable, __file__, "--worker", variant, str(stages), path])
        stalled = False
        while proc.poll() is None:
            time.sleep(2)
            last = os.path.getmtime(path) if os.path.exists(path) else t0
            if time.time() - last > STALL_S or time.time() - t0 > TIMEOUT_S:
                stalled = True
                proc.kill()
                proc.wait()
        res = _partial(path, variant, stages)
        if stalled:
            res["error"] = (f"killed: no progress for {STALL_S}s or over {TIMEOUT_S}s in all "
                            "(hang? wrong mbarrier phase / deadlock)")
        if "error" not in res and len(res.get("rows", [])) < len(SIZES):
            res["error"] = "worker stopped early (crashed?); see its output above"
        res["wall_s"] = round(time.time() - t0, 1)
        results["variants"].append(res)
        print(json.dumps({k: res.get(k) for k in ("variant", "stages", "error", "wall_s")}), flush=True)
    path = os.path.join(out_dir, "gluon_fa3.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print("wrote", path)
    for res in results["variants"]:
        for row in res.get("rows", []):
            print(f"{res['variant']}:{res['stages']} S={row['S']:5d} B={row['B']:2d} "
                  f"gluon {row['gluon_ms']:.3f} ms ({row['gluon_tflops']:.0f} TF/s)  "
                  f"cudnn {row['cudnn_ms']:.3f} ms ({row['cudnn_tflops']:.0f} TF/s)  "
                  f"ratio {row['gluon_over_cudnn']:.3f}  o_err {row['o_err_vs_cudnn']:.2e}  "
                  f"lse_err {row['lse_err_vs_fp32']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
