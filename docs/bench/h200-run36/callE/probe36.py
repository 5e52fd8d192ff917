"""Session 36 probe: HEAD (base) against the working tree (new: causal loops without the
empty leading range everywhere, the paged short split kernel), and new_s4 (the short
kernel at 4 stages). Decode from CUDA graphs (contiguous and paged, Sq 1 and 4), and the
packed varlen forward / forward + backward (Triton kernels whose causal loops changed)."""
import json, os
import torch, triton.testing
import torch.nn.functional as F
import attnfuse
from attnfuse import examples
from attnfuse.lowering import split_kv as lsk
from decode import PROGRAM, PAGED_PROGRAM, page_cache, launched
from varlen import draw_lengths, packed_inputs

VARIANT = os.environ["VARIANT"]
if VARIANT == "new_s4":
    _st = lsk.split_stages
    lsk.split_stages = lambda spec, rows, bn, paged_depth=True: _st(spec, rows, bn, paged_depth=paged_depth) + (0 if paged_depth else 1)
out = os.environ.get("OUT", ".")
shapes = [(1, 1024, 1), (1, 8192, 1), (1, 32768, 1), (1, 131072, 1), (1, 1024, 4), (1, 8192, 4),
          (16, 1024, 1), (16, 8192, 1), (64, 1024, 1), (64, 4096, 1)]
base = attnfuse.compile(PROGRAM)
paged = attnfuse.compile(PAGED_PROGRAM, params={"page": 16})
gb = lambda f: 1000 * float(triton.testing.do_bench_cudagraph(f, rep=50, return_mode="median"))
for b, skv, sq in shapes:
    gen = torch.Generator(device="cuda").manual_seed(skv)
    q = torch.randn(b, 32, sq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    calls = {"contiguous": (base, [q, k, v]), "paged16": (paged, [q, *page_cache(k, v, 16, gen)])}
    with torch.no_grad():
        mask = torch.ones(sq, skv, dtype=torch.bool, device="cuda").tril(skv - sq)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, enable_gqa=True)
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask if sq > 1 else None, enable_gqa=True)
    row = {"variant": VARIANT, "batch": b, "kv_len": skv, "q_len": sq}
    if VARIANT == "base":
        row["sdpa_graph_us"] = gb(sdpa)
        row["sdpa_max_err"] = float((sdpa().double() - want).abs().max())
    for n, (fn, args) in calls.items():
        f = lambda fn=fn, args=args: fn(*args)
        row[f"{n}_max_err"] = float((f().double() - want).abs().max())
        row[f"{n}_kernels"] = launched(fn, args)
        row[f"{n}_graph_us"] = gb(f)
    del calls
    torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    with open(f"{out}/probe36.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
if VARIANT != "new_s4":
    varlen = attnfuse.compile(examples.path("varlen"))
    lengths = draw_lengths(16384, 256, 4096, 0)
    q, k, v, cu = packed_inputs(lengths, "cuda", torch.bfloat16, 0)
    varlen.check_segment_values = False
    fwd = lambda: varlen(q, k, v, cu, cu)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    do = torch.randn_like(q)
    def step():
        varlen(qg, kg, vg, cu, cu).backward(do)
    row = {"variant": VARIANT, "varlen_lengths": lengths,
           "varlen_fwd_ms": float(triton.testing.do_bench(fwd, warmup=25, rep=200, return_mode="median")),
           "varlen_fwd_bwd_ms": float(triton.testing.do_bench(step, warmup=10, rep=200, grad_to_none=[qg, kg, vg],
                                                              return_mode="median"))}
    print(json.dumps(row), flush=True)
    with open(f"{out}/probe36.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
