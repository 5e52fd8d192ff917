"""Session 40 probe 2: B = 64 decode, contiguous, Sq = 1, CUDA graphs. D: the tree; W8: the
64-row tile at 8 warps; BN32: split-kv{block-n=32}; SP2: split-kv{splits=2}; WIDE: the
wide kernel for calls of several waves too."""
import json, sys
import torch
sys.path.insert(0, "bench")
import decode
import attnfuse
import attnfuse.lowering.split_kv as sk
from attnfuse.passes import DEFAULT_PIPELINE

orig_taken, orig_warps = sk.tier_taken, sk.split_warps
def taken_wide_any(host, suffix, tier, whole_sm, short, packed_rows, wide_fits, waves, blocks_per_split):
    if suffix == "wide":
        return wide_fits
    return orig_taken(host, suffix, tier, whole_sm, short, packed_rows, wide_fits, waves, blocks_per_split)
def pipe(opts):
    return DEFAULT_PIPELINE.replace("split-kv", "split-kv{" + opts + "}")
fns = {}
for name in ("D", "W8", "BN32", "SP2", "WIDE"):
    if name == "W8":
        sk.split_warps = lambda spec, rows: 8 if rows == 64 else orig_warps(spec, rows)
    if name == "WIDE":
        sk.tier_taken = taken_wide_any
    try:
        p = {"BN32": pipe("block-n=32"), "SP2": pipe("splits=2")}.get(name, DEFAULT_PIPELINE)
        fns[name] = attnfuse.compile(decode.PROGRAM.replace("@decode(", f"@decode_{name}("), pipeline=p)
    except Exception as e:
        print("build", name, type(e).__name__, str(e)[:300])
    finally:
        sk.tier_taken, sk.split_warps = orig_taken, orig_warps
rows = []
for b, skv in ((64, 1024), (64, 2048), (64, 8192), (32, 1024), (128, 1024)):
    gen = torch.Generator(device="cuda").manual_seed(skv)
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    want = decode.sdpa_lower_right(q, k, v)
    row = {"B": b, "Skv": skv, "sdpa_us": 1000 * decode._graph_ms(lambda: decode.sdpa_lower_right(q, k, v))}
    for name, fn in fns.items():
        try:
            got = fn(q, k, v)
            row[f"{name}_diff"] = float((got.float() - want.float()).abs().max())
            row[f"{name}_us"] = 1000 * decode._graph_ms(lambda: fn(q, k, v))
            row[f"{name}_kernels"] = decode.launched(fn, [q, k, v])
        except Exception as e:
            print("run", name, b, skv, type(e).__name__, str(e)[:300])
            row[f"{name}_us"] = float("nan")
    rows.append(row)
    print(json.dumps(row), flush=True)
print("| B | Skv | SDPA | " + " | ".join(fns) + " |")
for r in rows:
    print(f"| {r['B']} | {r['Skv']} | {r['sdpa_us']:.2f} | " + " | ".join(f"{r[n+'_us']:.2f}" for n in fns) + " |")
