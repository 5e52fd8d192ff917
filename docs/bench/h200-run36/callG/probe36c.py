"""Session 36 probe c: a paged program's split rule with min-blocks 1 (instead of 2) at
short caches, where the short kernel then gets one block per split. CUDA graphs."""
import json, os
import torch, triton.testing
import attnfuse
from attnfuse.passes import default_pipeline
from decode import PAGED_PROGRAM, page_cache, launched

out = os.environ.get("OUT", ".")
fns = {"default": attnfuse.compile(PAGED_PROGRAM, params={"page": 16}),
       "min_blocks1": attnfuse.compile(PAGED_PROGRAM, pipeline=default_pipeline({"split-kv": "min-blocks=1"}),
                                       params={"page": 16})}
gb = lambda f: 1000 * float(triton.testing.do_bench_cudagraph(f, rep=50, return_mode="median"))
for rnd in range(2):
    for b, skv in [(1, 1024), (1, 2048), (2, 1024), (4, 1024)]:
        gen = torch.Generator(device="cuda").manual_seed(skv)
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn_like(k)
        args = [q, *page_cache(k, v, 16, gen)]
        row = {"round": rnd, "batch": b, "kv_len": skv}
        outs = {}
        for n, fn in fns.items():
            f = lambda fn=fn: fn(*args)
            outs[n] = f().float()
            row[f"{n}_kernels"] = launched(fn, args)
            row[f"{n}_graph_us"] = gb(f)
        row["max_diff"] = float((outs["default"] - outs["min_blocks1"]).abs().max())
        print(json.dumps(row), flush=True)
        with open(f"{out}/probe36c.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
