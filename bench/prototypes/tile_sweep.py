"""Prototype sweep (run 14): forward tile configs per strategy, backward options with
per-kernel profiler times, and a cProfile of one host call. Edit FWD / BWD to choose the
rows. Needs CUDA:

    python bench/prototypes/tile_sweep.py fwd bwd host    # writes $OUT/sweep.json
"""
import cProfile, io, json, os, pstats, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch, triton
from run_all import pipeline, inputs, bench, compiled, TOKENS
from torch.profiler import ProfilerActivity, profile

OUT = os.environ.get("OUT", "/tmp")
res = {"forward": [], "backward": []}

def save():
    json.dump(res, open(os.path.join(OUT, "sweep.json"), "w"), indent=1)

def kernel_times(fn, iters=10):
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.self_device_time_total / iters / 1000 for e in prof.key_averages() if e.self_device_time_total > 0}

which = sys.argv[1:] or ["fwd", "bwd", "host"]
if "fwd" in which:
    FWD = [("separate", ""), ("hybrid", ""), ("fused", ""), ("fused", "128x128x8x2")]
    for seq in (4096, 16384):
        q, k, v, _ = inputs(seq)
        for strategy, cfg in FWD:
            row = {"S": seq, "strategy": strategy, "cfg": cfg or "default"}
            try:
                fn = compiled(pipeline(strategy, cfg))
                with torch.no_grad():
                    row["ms"] = bench(lambda: fn(q, k, v))
            except Exception as e:
                row["fail"] = str(e)[:300]
            res["forward"].append(row); print(json.dumps(row), flush=True)
        save()
if "bwd" in which:
    BWD = ["", "dkdv-num-warps=8", "num-warps=8"]
    for seq in (2048, 8192):
        q, k, v, g = inputs(seq, grad=True)
        for opts in BWD:
            row = {"S": seq, "bwd": opts or "default"}
            try:
                fn = compiled(pipeline("hybrid", bwd=opts))
                def step():
                    fn(q, k, v).backward(g)
                    q.grad = k.grad = v.grad = None
                row["fwd_bwd_ms"] = bench(step)
                row["kernels"] = {n: round(t, 4) for n, t in kernel_times(step).items() if "llama3" in n}
            except Exception as e:
                row["fail"] = str(e)[:300]
            res["backward"].append(row); print(json.dumps(row), flush=True)
            save()
if "host" in which:
    import attnfuse
    from attnfuse import examples
    fn = compiled(pipeline("hybrid"))
    q, k, v, _ = (t[:1, :, :128].contiguous() for t in inputs(128))
    with torch.no_grad():
        for _ in range(100):
            fn(q, k, v)
        torch.cuda.synchronize()
        pr = cProfile.Profile(); pr.enable()
        t = time.perf_counter()
        for _ in range(3000):
            fn(q, k, v)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) / 3000 * 1e6
        pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    res["host_profile_us_per_call_profiled"] = dt
    res["host_profile"] = s.getvalue()[-6000:]
    print(s.getvalue()[-4000:])
    save()
