"""Session 33 experiment: warps of the 16-row and the full split kernel.
python .gpu/s33_warps.py --name N [--small-warps W] [--full-warps W] --out F"""
import argparse, json, sys, os
sys.path.insert(0, os.path.dirname(__file__))
import attnfuse.lowering.split_kv as sk
import torch, triton.testing
import attnfuse
from attnfuse.passes import DEFAULT_PIPELINE
from decode import PROGRAM, PAGED_PROGRAM, page_cache, sdpa_lower_right, launched

ap = argparse.ArgumentParser()
ap.add_argument("--name"); ap.add_argument("--small-warps", type=int); ap.add_argument("--full-warps", type=int)
ap.add_argument("--long-blocks", type=int); ap.add_argument("--paged-opts", default="")
ap.add_argument("--batches", default="1,16"); ap.add_argument("--kv", default="1024,8192,32768,131072")
ap.add_argument("--sdpa", action="store_true"); ap.add_argument("--out")
a = ap.parse_args()
if a.long_blocks:
    sk.LONG_SPLIT_BLOCKS = a.long_blocks
orig = sk.split_warps
def patched(spec, rows):
    if rows == 16 and a.small_warps:
        return a.small_warps
    if rows != 16 and a.full_warps:
        return a.full_warps
    return orig(spec, rows)
sk.split_warps = patched
fn = attnfuse.compile(PROGRAM)
pp = DEFAULT_PIPELINE.replace("split-kv,", f"split-kv{a.paged_opts},") if a.paged_opts else DEFAULT_PIPELINE
paged = attnfuse.compile(PAGED_PROGRAM, pipeline=pp, params={"page": 16})
def gms(f):
    f(); torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(f, rep=100, return_mode="median"))
rows = []
for b in map(int, a.batches.split(",")):
    for skv in map(int, a.kv.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(skv)
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn_like(k)
        cache = page_cache(k, v, 16, gen)
        row = {"name": a.name, "batch": b, "kv_len": skv}
        with torch.no_grad():
            want = sdpa_lower_right(q, k, v).float()
            row["diff"] = float((fn(q, k, v).float() - want).abs().max())
            row["paged_diff"] = float((paged(q, *cache).float() - want).abs().max())
            row["ms"] = gms(lambda: fn(q, k, v))
            row["paged_ms"] = gms(lambda: paged(q, *cache))
            if a.sdpa:
                row["sdpa_ms"] = gms(lambda: sdpa_lower_right(q, k, v))
            row["kernels"] = launched(fn, [q, k, v]); row["paged_kernels"] = launched(paged, [q, *cache])
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        del cache, k, v
        torch.cuda.empty_cache()
