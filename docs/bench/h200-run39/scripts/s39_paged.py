"""Session 39 probe: paged decode variants (Llama-3-8B, Sq = 1, pages of 16, CUDA graphs).
A: the tree's default (wide kernel first, waves 1); B: the wide kernel at the
contiguous depth (3 stages, not 5); C: no wide kernel on paged caches (short/small,
waves 1: call B's baseline); contiguous default for the ratio."""
import json, sys, os
import torch
sys.path.insert(0, "bench")
import decode
import attnfuse
import attnfuse.lowering.split_kv as sk
from attnfuse.passes import DEFAULT_PIPELINE

page = 16
out = {}
def build(variant):
    text = decode.PAGED_PROGRAM.replace("@paged(", f"@paged_{variant}(")
    orig_stages, orig_wide = sk.split_stages, sk.wide_block_n
    if variant == "B":
        sk.split_stages = lambda spec, rows, bn, paged_depth=True, whole_sm=False: orig_stages(
            spec, rows, bn, paged_depth=paged_depth and not whole_sm, whole_sm=whole_sm)
    if variant == "C":
        sk.wide_block_n = lambda program, rows, bn, group: None if program.func.sym_name.data.startswith("paged") else orig_wide(program, rows, bn, group)
    try:
        return attnfuse.compile(text, pipeline=DEFAULT_PIPELINE, params={"page": page})
    finally:
        sk.split_stages, sk.wide_block_n = orig_stages, orig_wide

fns = {}
for v in "ABC":
    try:
        fns[v] = build(v)
    except Exception as e:
        print("build", v, type(e).__name__, str(e)[:300])
contig = attnfuse.compile(decode.PROGRAM)
rows = []
for b in (1, 4, 16):
    for skv in (1024, 8192, 32768):
        gen = torch.Generator(device="cuda").manual_seed(skv)
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn_like(k)
        cache = decode.page_cache(k, v, page, gen)
        want = contig(q, k, v)
        row = {"B": b, "Skv": skv, "contig_us": 1000 * decode._graph_ms(lambda: contig(q, k, v))}
        for name, fn in fns.items():
            got = fn(q, *cache)
            row[f"{name}_diff"] = float((got.float() - want.float()).abs().max())
            row[f"{name}_us"] = 1000 * decode._graph_ms(lambda: fn(q, *cache))
            row[f"{name}_kernels"] = decode.launched(fn, [q, *cache])
        rows.append(row)
        print(json.dumps(row), flush=True)
print("| B | Skv | contiguous | A | B | C | A/contig | best |")
for r in rows:
    best = min((r[f"{n}_us"], n) for n in fns)
    print(f"| {r['B']} | {r['Skv']} | {r['contig_us']:.2f} | " + " | ".join(f"{r.get(n+'_us', float('nan')):.2f}" for n in "ABC")
          + f" | {r['contig_us']/r['A_us']:.2f} | {best[1]} {r['contig_us']/best[0]:.2f} |")
