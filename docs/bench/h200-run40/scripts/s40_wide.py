"""Session 40 probe 3: the wide split kernel for calls of several waves (contiguous and
paged, Sq = 1, CUDA graphs). D: the tree (the wide kernel only for calls of one wave);
WIDE: for every call whose rows fit it."""
import json, sys
import torch
sys.path.insert(0, "bench")
import decode
import attnfuse
import attnfuse.lowering.split_kv as sk

orig_taken = sk.tier_taken
def taken_wide_any(host, suffix, tier, whole_sm, short, packed_rows, wide_fits, waves, blocks_per_split):
    if suffix == "wide":
        return wide_fits
    return orig_taken(host, suffix, tier, whole_sm, short, packed_rows, wide_fits, waves, blocks_per_split)
fns = {}
for name in ("D", "WIDE"):
    if name == "WIDE":
        sk.tier_taken = taken_wide_any
    try:
        fns[name] = attnfuse.compile(decode.PROGRAM.replace("@decode(", f"@decode_{name}("))
        fns["paged_" + name] = attnfuse.compile(decode.PAGED_PROGRAM.replace("@paged(", f"@paged_{name}("), params={"page": 16})
    finally:
        sk.tier_taken = orig_taken
rows = []
for b, skv in ((24, 1024), (32, 1024), (32, 4096), (40, 1024), (48, 1024), (48, 4096), (64, 1024), (64, 4096), (96, 1024), (128, 1024)):
    gen = torch.Generator(device="cuda").manual_seed(skv)
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    cache = decode.page_cache(k, v, 16, gen)
    want = decode.sdpa_lower_right(q, k, v)
    row = {"B": b, "Skv": skv, "sdpa_us": 1000 * decode._graph_ms(lambda: decode.sdpa_lower_right(q, k, v))}
    for name, fn in fns.items():
        args = [q, *cache] if name.startswith("paged") else [q, k, v]
        got = fn(*args)
        row[f"{name}_diff"] = float((got.float() - want.float()).abs().max())
        row[f"{name}_us"] = 1000 * decode._graph_ms(lambda: fn(*args))
        row[f"{name}_kernels"] = decode.launched(fn, args)
    rows.append(row)
    print(json.dumps(row), flush=True)
print("| B | Skv | SDPA | " + " | ".join(fns) + " |")
for r in rows:
    print(f"| {r['B']} | {r['Skv']} | {r['sdpa_us']:.2f} | " + " | ".join(f"{r[n+'_us']:.2f}" for n in fns) + " |")
