"""Prototype (run 14): the generated dK/dV kernel of examples/llama3.attn patched to also
accumulate dQ = dS K with `tl.atomic_add` (a 5-matmul backward), timed against the
unpatched kernel, dQ checked against an fp32 PyTorch computation. Needs CUDA:

    python bench/prototypes/atomic_dq.py      # writes $OUT/atomic.json
"""
import json, math, os, re, sys
import torch, triton, triton.language as tl
from attnfuse.runtime.loader import load_kernels

import attnfuse
from pathlib import Path

_full = attnfuse.compile(Path(__file__).parents[2].joinpath("examples", "llama3.attn").read_text()).triton_source
src = _full[_full.index("def llama3_bwd_dkdv("):]
src = src[: src.index("\n# kernel")] if "\n# kernel" in src else src
header = "import triton\nimport triton.language as tl\n\n"
orig = src.replace("def llama3_bwd_dkdv(", "@triton.jit(do_not_specialize=['B', 'Sq', 'Skv'])\ndef dkdv_orig(", 1)
pat = re.compile(r"(\s+)(\w+) = tl\.trans\((\w+)\)\n\s+(\w+) = tl\.trans\((\w+)\)\n\s+(\w+) = tl\.dot\(\2, (Q_all\w*), dk_all_1\)\n")
count = [0]
def sub(m):
    ind = m.group(1)
    suffix = m.group(7)[len("Q_all"):]
    rows, ok = f"rows{suffix}", f"row_ok{suffix}"
    count[0] += 1
    return (m.group(0) + f"{ind}dq_part = tl.dot({m.group(3)}, v19)"
            f"{ind}dq_ptr = DQ + ((batch * 32 + head).to(tl.int64) * Sq) * 128 + {rows}[:, None] * 128 + tl.arange(0, 128)[None, :]"
            f"{ind}tl.atomic_add(dq_ptr, dq_part * 0.0883883461356163, mask={ok}[:, None], sem='relaxed')\n")
patched = pat.sub(sub, src)
assert count[0] == 3, count
patched = patched.replace("def llama3_bwd_dkdv(", "@triton.jit(do_not_specialize=['B', 'Sq', 'Skv'])\ndef dkdv_atomic(", 1)
sig_end = patched.index("):\n")
patched = patched[:sig_end] + ", DQ" + patched[sig_end:]
kernels = load_kernels(header + orig + "\n\n" + patched, interpret=False)
names = re.search(r"def llama3_bwd_dkdv\(([^)]*)\)", src).group(1).split(", ")

def args_for(t):
    out = []
    for n in names:
        if "_stride" in n:
            base, i = n.rsplit("_stride", 1)
            out.append(t[base].stride(int(i)))
        else:
            out.append(t[n])
    return out

OUT = os.environ.get("OUT", "/tmp")
rows = []
for S in (2048, 8192):
    B, H, HK, D = 16384 // S, 32, 8, 128
    torch.manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16)
    do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    scale = D ** -0.5
    with torch.no_grad():
        kk, vv = k.repeat_interleave(4, 1).float(), v.repeat_interleave(4, 1).float()
        lse = torch.empty(B, H, S, device="cuda"); out = torch.empty(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        dq_ref = torch.empty(B, H, S, D, device="cuda")
        mask = torch.ones(S, S, device="cuda", dtype=torch.bool).tril()
        for b in range(B):
            s = (q[b].float() @ kk[b].transpose(-1, -2)) * scale
            s = s.masked_fill(~mask, float("-inf"))
            lse[b] = torch.logsumexp(s, -1)
            p = torch.exp(s - lse[b][..., None])
            out[b] = (p @ vv[b]).to(torch.bfloat16)
            dp = do[b].float() @ vv[b].transpose(-1, -2)
            delta = (do[b].float() * out[b].float()).sum(-1)
            ds = p * (dp - delta[..., None])
            dq_ref[b] = ds @ kk[b] * scale
            del s, p, dp, ds
        delta = (do.float() * out.float()).sum(-1)
    t = {"Q": q, "K": k, "V": v, "Out": out, "B": B, "Sq": S, "Skv": S, "dOut": do, "LSE_in": lse, "Delta": delta,
         "dK": torch.empty(B, HK, S, D, device="cuda"), "dV": torch.empty_like(v)}
    grid = (triton.cdiv(S, 64), B * HK)
    a = args_for(t)
    dq = torch.zeros(B, H, S, D, device="cuda")
    def run_orig():
        kernels["dkdv_orig"][grid](*a, num_warps=4, num_stages=2)
    def run_atomic():
        dq.zero_()
        kernels["dkdv_atomic"][grid](*a, dq, num_warps=4, num_stages=2)
    run_atomic(); torch.cuda.synchronize()
    err = ((dq - dq_ref).abs().max() / dq_ref.abs().max()).item()
    row = {"S": S, "B": B, "orig_ms": triton.testing.do_bench(run_orig, rep=200), "atomic_ms": triton.testing.do_bench(run_atomic, rep=200),
           "zero_ms": triton.testing.do_bench(lambda: dq.zero_(), rep=100), "dq_rel_err": err}
    rows.append(row); print(json.dumps(row), flush=True)
    del kk, vv, dq_ref
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "atomic.json"), "w"))
