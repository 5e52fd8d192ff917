"""Issue 11 probe 2: the split kernel with one masked KV loop (VARIANT=single), the paged
kernel at the contiguous depth (stages3), both (single3), or as committed (base)."""
import json, os
import torch, triton.testing
import torch.nn.functional as F
import attnfuse
from attnfuse.passes import default_pipeline
from attnfuse.lowering import split_kv as lsk
from attnfuse.lowering.forward import ForwardKernel
from decode import PROGRAM, PAGED_PROGRAM, page_cache, launched
from backward_profile import kernel_times

VARIANT = os.environ["VARIANT"]
if VARIANT.startswith("single"):
    def _single(self, *args):
        ranges = ForwardKernel._loop_ranges(self, *args)
        return [(ranges[0][0], ranges[-1][1], False)]
    lsk.SplitKernel._loop_ranges = _single
if VARIANT.endswith("3"):
    _kv = lsk.kv_stages
    lsk.kv_stages = lambda *a, paged, **k: _kv(*a, paged=False, **k)
out = os.environ.get("OUT", ".")  # noqa
shapes = [(1, 1024), (1, 8192), (1, 32768), (1, 131072), (16, 1024), (16, 8192), (64, 1024), (64, 4096)]
base = attnfuse.compile(PROGRAM)
fns = {"paged16": attnfuse.compile(PAGED_PROGRAM, params={"page": 16}),
       "paged16_w1": attnfuse.compile(PAGED_PROGRAM, pipeline=default_pipeline({"split-kv": "waves=1 min-blocks=1"}),
                                      params={"page": 16})}
for b, skv in shapes:
    gen = torch.Generator(device="cuda").manual_seed(skv)
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    calls = {"contiguous": (base, [q, k, v])}
    for n, fn in fns.items():
        calls[n] = (fn, [q, *page_cache(k, v, 16, gen)])
    with torch.no_grad():
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        err_sdpa = float((sdpa().double() - want).abs().max())
    row = {"variant": VARIANT, "batch": b, "kv_len": skv, "sdpa_max_err": err_sdpa}
    if VARIANT == "base":
        row["sdpa_graph_us"] = 1000 * float(triton.testing.do_bench_cudagraph(sdpa, rep=50, return_mode="median"))
    for n, (fn, args) in calls.items():
        f = lambda fn=fn, args=args: fn(*args)
        row[f"{n}_max_err"] = float((f().double() - want).abs().max())
        row[f"{n}_kernels"] = launched(fn, args)
        row[f"{n}_graph_us"] = 1000 * float(triton.testing.do_bench_cudagraph(f, rep=50, return_mode="median"))
        row[f"{n}_kernel_us"] = kernel_times(f, 30)
    del calls
    torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    with open(f"{out}/probe2.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
