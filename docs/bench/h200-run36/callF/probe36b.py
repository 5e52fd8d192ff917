"""Session 36 probe b: the working tree (new) against small2 (the 16-row split kernel for
calls of up to two waves of programs instead of one). Paged and contiguous decode, CUDA graphs."""
import json, os
import torch, triton.testing
import attnfuse
from decode import PROGRAM, PAGED_PROGRAM, page_cache, launched

VARIANT = os.environ["VARIANT"]
out = os.environ.get("OUT", ".")
shapes = [(1, 2048, 1), (1, 4096, 1), (1, 8192, 1), (1, 32768, 1), (1, 131072, 1), (1, 8192, 4),
          (4, 8192, 1), (16, 1024, 1), (16, 8192, 1), (16, 32768, 1)]
base = attnfuse.compile(PROGRAM)
paged = attnfuse.compile(PAGED_PROGRAM, params={"page": 16})
gb = lambda f: 1000 * float(triton.testing.do_bench_cudagraph(f, rep=50, return_mode="median"))
print(VARIANT, attnfuse.__file__, flush=True)
for b, skv, sq in shapes:
    gen = torch.Generator(device="cuda").manual_seed(skv)
    q = torch.randn(b, 32, sq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    calls = {"contiguous": (base, [q, k, v]), "paged16": (paged, [q, *page_cache(k, v, 16, gen)])}
    row = {"variant": VARIANT, "batch": b, "kv_len": skv, "q_len": sq}
    ref = None
    for n, (fn, args) in calls.items():
        f = lambda fn=fn, args=args: fn(*args)
        o = f().float()
        ref = o if ref is None else ref
        row[f"{n}_vs_contiguous_max_diff"] = float((o - ref).abs().max())
        row[f"{n}_kernels"] = launched(fn, args)
        row[f"{n}_graph_us"] = gb(f)
    del calls
    torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    with open(f"{out}/probe36b.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
