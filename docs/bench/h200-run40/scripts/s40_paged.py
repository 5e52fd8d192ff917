"""Session 40 probe: paged decode address arithmetic (Llama-3-8B, Sq = 1, pages of 16, CUDA graphs).
base: the tree (per-key page slot and in-page row, i64 offsets); al64: in-page row from the
tile's own key index (tile starts are multiples of the block), i64; al32: that with i32
offsets; contiguous for the ratio."""
import json, sys
import torch
sys.path.insert(0, "bench")
import decode
import attnfuse
import attnfuse.lowering.paged as pg
from attnfuse.dialects.tile_types import shape_of

def within_inv(b, keys, P):
    return b.rem(b.arange(0, shape_of(keys.type)[0]), P, name="page_row")
def off_al64(self, b, page, keys):
    within = b.to_i64(within_inv(b, keys, self.paged.page_size))
    page64 = b.to_i64(page)
    return tuple(b.add(b.mul(page64, b.to_i64(a.strides[0])), b.mul(within, b.to_i64(a.strides[2])), name=f"{a.name}_rows") for a in (self.k, self.v))
def off_al32(self, b, page, keys):
    within = within_inv(b, keys, self.paged.page_size)
    return tuple(b.add(b.mul(page, a.strides[0]), b.mul(within, a.strides[2]), name=f"{a.name}_rows") for a in (self.k, self.v))
orig = pg.PageView._offsets
page = 16
fns = {}
for name, fn in (("base", orig), ("al64", off_al64), ("al32", off_al32)):
    pg.PageView._offsets = fn
    try:
        fns[name] = attnfuse.compile(decode.PAGED_PROGRAM.replace("@paged(", f"@paged_{name}("), params={"page": page})
    finally:
        pg.PageView._offsets = orig
contig = attnfuse.compile(decode.PROGRAM)
rows = []
for b, skvs in ((1, (1024, 8192, 32768)), (4, (1024, 8192)), (16, (1024, 8192)), (64, (1024,))):
    for skv in skvs:
        gen = torch.Generator(device="cuda").manual_seed(skv)
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn_like(k)
        cache = decode.page_cache(k, v, page, gen)
        want = contig(q, k, v)
        row = {"B": b, "Skv": skv, "contig_us": 1000 * decode._graph_ms(lambda: contig(q, k, v)),
               "contig_kernels": decode.launched(contig, [q, k, v])}
        for name, fn in fns.items():
            got = fn(q, *cache)
            row[f"{name}_diff"] = float((got.float() - want.float()).abs().max())
            row[f"{name}_us"] = 1000 * decode._graph_ms(lambda: fn(q, *cache))
            row[f"{name}_kernels"] = decode.launched(fn, [q, *cache])
        rows.append(row)
        print(json.dumps(row), flush=True)
print("| B | Skv | contiguous | base | al64 | al32 | base/c | al64/c | al32/c |")
for r in rows:
    c = r["contig_us"]
    print(f"| {r['B']} | {r['Skv']} | {c:.2f} | " + " | ".join(f"{r[n+'_us']:.2f}" for n in fns)
          + " | " + " | ".join(f"{c/r[n+'_us']:.3f}" for n in fns) + " |")
