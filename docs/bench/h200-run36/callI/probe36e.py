"""Session 36 probe e: the short paged split kernel with its first tile peeled off and
its block-table / K loads bounded by the capacity (new) against HEAD f034ebd (base)."""
import json, os
import torch, triton.testing
import attnfuse
from decode import PROGRAM, PAGED_PROGRAM, page_cache, launched

VARIANT, out = os.environ["VARIANT"], os.environ.get("OUT", ".")
print(VARIANT, attnfuse.__file__, flush=True)
base, paged = attnfuse.compile(PROGRAM), attnfuse.compile(PAGED_PROGRAM, params={"page": 16})
gb = lambda f: 1000 * float(triton.testing.do_bench_cudagraph(f, rep=40, return_mode="median"))
for b, skv, sq in [(1, 1024, 1), (1, 2048, 1), (1, 4096, 1), (1, 8192, 1), (2, 1024, 1), (1, 1024, 4)]:
    gen = torch.Generator(device="cuda").manual_seed(skv)
    q = torch.randn(b, 32, sq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    row = {"variant": VARIANT, "batch": b, "kv_len": skv, "q_len": sq}
    outs = []
    for n, fn, args in (("contiguous", base, [q, k, v]), ("paged16", paged, [q, *page_cache(k, v, 16, gen)])):
        f = lambda fn=fn, args=args: fn(*args)
        outs.append(f().float())
        row[f"{n}_kernels"] = launched(fn, args)
        row[f"{n}_graph_us"] = gb(f)
    row["max_diff"] = float((outs[0] - outs[1]).abs().max())
    print(json.dumps(row), flush=True)
    with open(f"{out}/probe36e.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
