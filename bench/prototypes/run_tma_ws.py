"""Prototype (run 14): a hand-written causal GQA forward (tma_ws_forward.py) with TMA
descriptors, one- or two-loop causal walks and Triton 3.6 warp specialization, against
SDPA cuDNN and AttnFuse's kernel for the same program (no RoPE), in one run. Needs CUDA:

    python bench/prototypes/run_tma_ws.py     # writes $OUT/proto.json
"""
import json, math, os, sys, time
sys.path.insert(0, os.path.dirname(__file__))
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import tma_ws_forward as proto
import attnfuse

out_dir = os.environ.get("OUT", "/tmp")
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
H, HKV, D = 32, 8, 128
PROG = """
func.func @plain(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %s = attn.scores %q, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
"""
af = attnfuse.compile(PROG)
rows = []
def bench(fn):
    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
for S in (2048, 4096, 8192, 16384):
    B = 16384 // S
    torch.manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        t_cudnn = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    flops = 4 * B * H * S * S * D / 2
    row = {"S": S, "B": B, "cudnn_ms": t_cudnn}
    with torch.no_grad():
        o = af(q, k, v)
        row["attnfuse_ms"] = bench(lambda: af(q, k, v))
        row["attnfuse_err"] = (o.float() - ref.float()).abs().max().item()
    for fn in ("proto_fwd", "proto3_fwd"):
      for ws, one, nw, ns in [(False, False, 8, 3), (False, True, 8, 3), (True, True, 4, 2), (True, True, 8, 2)]:
        if fn == "proto_fwd" and ws: continue
        name = f"{fn}_ws{int(ws)}_one{int(one)}_{nw}w{ns}s"
        o = torch.empty_like(q); lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
        kern = getattr(proto, fn)
        grid = (triton.cdiv(S, 128), B * H)
        def call():
            kern[grid](q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                       B, S, 1.0 / math.sqrt(D) * 1.4426950408889634, H=H, GROUP=H // HKV, BM=128, BN=128, D=D,
                       WS=ws, ONE_LOOP=one, num_warps=nw, num_stages=ns)
        try:
            call(); torch.cuda.synchronize()
            row[name + "_err"] = (o.float() - ref.float()).abs().max().item()
            row[name + "_ms"] = bench(call)
        except Exception as e:
            row[name + "_fail"] = str(e)[:200]
    for key in list(row):
        if key.endswith("_ms"):
            row[key.replace("_ms", "_x_cudnn")] = t_cudnn / row[key]
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(rows, open(os.path.join(out_dir, "proto.json"), "w"), indent=1)
