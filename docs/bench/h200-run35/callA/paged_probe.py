"""Issue 11 probe: where paged split-KV decode loses to contiguous at small B.
Times (CUDA graph replay, per-kernel profiler) contiguous vs paged variants; with --ncu
just runs each variant's call a few times for ncu to profile."""
import json, sys, os
import torch, triton.testing
import attnfuse
from attnfuse.passes import default_pipeline
from decode import PROGRAM, PAGED_PROGRAM, page_cache, launched
from backward_profile import kernel_times

NCU = "--ncu" in sys.argv
out = os.environ.get("OUT", ".")
shapes = [(1, 1024), (1, 8192)] if NCU else [(1, 1024), (1, 8192), (1, 32768), (16, 1024), (16, 8192)]
base = attnfuse.compile(PROGRAM)
variants = {
    "paged16": (16, default_pipeline()),
    "paged64": (64, default_pipeline()),
    "paged16_w1": (16, default_pipeline({"split-kv": "waves=1 min-blocks=1"})),
    "paged64_w1": (64, default_pipeline({"split-kv": "waves=1 min-blocks=1"})),
}
if NCU:
    variants = {k: variants[k] for k in ("paged16", "paged64_w1")}
fns = {n: attnfuse.compile(PAGED_PROGRAM, pipeline=p, params={"page": pg}) for n, (pg, p) in variants.items()}
for b, skv in shapes:
    gen = torch.Generator(device="cuda").manual_seed(skv)
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    calls = {"contiguous": (base, [q, k, v])}
    for n, (pg, _) in variants.items():
        calls[n] = (fns[n], [q, *page_cache(k, v, pg, gen)])
    want = base(q, k, v).float()
    row = {"batch": b, "kv_len": skv}
    for n, (fn, args) in calls.items():
        f = lambda fn=fn, args=args: fn(*args)
        got = f()
        row[f"{n}_max_diff"] = float((got.float() - want).abs().max())
        if NCU:
            torch.cuda.synchronize()
            continue
        row[f"{n}_kernels"] = launched(fn, args)
        row[f"{n}_graph_us"] = 1000 * float(triton.testing.do_bench_cudagraph(f, rep=50, return_mode="median"))
        row[f"{n}_kernel_us"] = kernel_times(f, 50)
    print(json.dumps(row), flush=True)
    if not NCU:
        with open(f"{out}/paged_probe.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
