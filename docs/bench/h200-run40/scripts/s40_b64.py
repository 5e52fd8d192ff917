"""Session 40 probe: B = 64 decode (Llama-3-8B, Sq = 1, contiguous, CUDA graphs). base: the
tree (64-row tile, two programs per SM); S: the 16-row tile for calls of several waves
too (its stages as built); S2: that at two stages (three programs per SM)."""
import json, sys
import torch
sys.path.insert(0, "bench")
import decode
import attnfuse
import attnfuse.lowering.split_kv as sk
from xdsl.dialects import arith

orig_taken, orig_stages = sk.tier_taken, sk.split_stages
def taken_any_waves(host, suffix, tier, whole_sm, short, packed_rows, wide_fits, waves, blocks_per_split):
    if suffix == "small":
        return host.emit(arith.CmpiOp(packed_rows, host.const(tier), "sle"), "fits_small_tile")
    return orig_taken(host, suffix, tier, whole_sm, short, packed_rows, wide_fits, waves, blocks_per_split)
fns = {}
for name in ("base", "S", "S2"):
    if name != "base":
        sk.tier_taken = taken_any_waves
    if name == "S2":
        sk.split_stages = lambda spec, rows, bn, paged_depth=True, whole_sm=False: 2 if rows == 16 and not whole_sm else orig_stages(spec, rows, bn, paged_depth=paged_depth, whole_sm=whole_sm)
    try:
        fns[name] = attnfuse.compile(decode.PROGRAM.replace("@decode(", f"@decode_{name}("))
    finally:
        sk.tier_taken, sk.split_stages = orig_taken, orig_stages
import torch.nn.functional as F
rows = []
for b, skv in ((64, 1024), (64, 2048), (64, 8192), (32, 1024), (16, 1024), (16, 8192)):
    gen = torch.Generator(device="cuda").manual_seed(skv)
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    want = fns["base"](q, k, v)
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    row = {"B": b, "Skv": skv, "sdpa_us": 1000 * decode._graph_ms(sdpa)}
    for name, fn in fns.items():
        got = fn(q, k, v)
        row[f"{name}_diff"] = float((got.float() - want.float()).abs().max())
        row[f"{name}_us"] = 1000 * decode._graph_ms(lambda: fn(q, k, v))
        row[f"{name}_kernels"] = decode.launched(fn, [q, k, v])
    rows.append(row)
    print(json.dumps(row), flush=True)
print("| B | Skv | SDPA (math/default) | base | S | S2 |")
for r in rows:
    print(f"| {r['B']} | {r['Skv']} | {r['sdpa_us']:.2f} | " + " | ".join(f"{r[n+'_us']:.2f}" for n in fns) + " |")
