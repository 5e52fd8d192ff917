"""Session 38 call C: the wide kernel as generated, without its (empty) masked loop, and the
hand kernel's fused combine with a counter zeroed per call (a memset in the graph)."""
import json
import os
import re
import sys
import time

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s38_exp as E  # noqa: E402

NEW = E.load(os.path.join(E.HERE, "gen_new.py"), "gen_new")


def no_masked_loop(src_path, name):
    text = open(src_path).read()
    start = text.index("def decode_split_kv_wide")
    end = text.index("# kernel decode_split_kv_small")
    body = text[start:end].split("\n")
    i = next(j for j, line in enumerate(body) if line.startswith("    for start_n_1 in range("))
    k = i + 1
    while body[k].startswith("        "):
        k += 1
    body = body[:i] + body[k:]
    text = text[:start] + "\n".join(body) + text[end:]
    path = f"/tmp/{name}.py"
    open(path, "w").write(text)
    return E.load(path, name)


NOLOOP = no_masked_loop(os.path.join(E.HERE, "gen_new.py"), "gen_noloop")
OUT = os.environ["OUT"]
results = []
for B, Skv in ((1, 8192), (1, 1024), (1, 32768), (16, 8192), (16, 1024)):
    HQ, HKV, D, GROUP = 32, 8, 128, 4
    torch.manual_seed(0)
    q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, HKV, Skv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, HKV, Skv, D, device="cuda", dtype=torch.bfloat16)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    ref = cudnn()
    row = {"B": B, "Skv": Skv, "cudnn": E.graph_us(cudnn)}
    slots = -(-B * HQ // 16) * 16
    out = torch.empty_like(q)
    lse = torch.empty(B, HQ, 1, device="cuda", dtype=torch.float32)
    opart = torch.empty(64, slots, D, device="cuda", dtype=torch.float32)
    lpart = torch.empty(64, slots, device="cuda", dtype=torch.float32)
    splits = 16 if B == 1 else 1

    def gen(mod, kernel):
        sk = getattr(mod, kernel)

        def f():
            sk[(splits, B * HKV, 1)](q, *q.stride(), k, *k.stride(), v, *v.stride(), out, *out.stride(), lse,
                                     *lse.stride(), B, 1, Skv, opart, *opart.stride(), lpart, *lpart.stride(),
                                     num_warps=4, num_stages=3)
            if splits > 1:
                mod.decode_split_kv_combine[(1, B * HQ, 1)](opart, *opart.stride(), lpart, *lpart.stride(), out,
                                                            *out.stride(), lse, *lse.stride(), 1, splits,
                                                            num_warps=4, num_stages=2)
        return f

    counter = torch.zeros(B * HKV, device="cuda", dtype=torch.int32)
    k2, v2 = k.view(-1, D), v.view(-1, D)

    def hand(tma, fused, zero_per_call, bn=128, st=3):
        kd = TensorDescriptor.from_tensor(k2, [bn, D]) if tma else k2
        vd = TensorDescriptor.from_tensor(v2, [bn, D]) if tma else v2

        def f():
            c = torch.zeros(B * HKV, device="cuda", dtype=torch.int32) if zero_per_call else counter
            E.hand_split[(splits, B * HKV, 1)](q, k, v, kd, vd, opart, lpart, out, c, Skv, HKV=HKV, GROUP=GROUP,
                                              ROWS=16, D=D, BLOCK_N=bn, TMA=tma, FUSED=fused, STAGES=st,
                                              SLOTS=slots, SPLITS_P2=max(2, splits), num_warps=4, num_stages=st)
            if not fused and splits > 1:
                E.G64.decode_split_kv_combine[(1, B * HQ, 1)](opart, *opart.stride(), lpart, *lpart.stride(), out,
                                                              *out.stride(), lse, *lse.stride(), 1, splits,
                                                              num_warps=4, num_stages=2)
        return f

    variants = {
        "gen_wide": gen(NEW, "decode_split_kv_wide"), "gen_wide_noloop": gen(NOLOOP, "decode_split_kv_wide"),
        "gen_small": gen(NEW, "decode_split_kv_small"),
        "hand_ptr": hand(False, False, False), "hand_ptr_fused": hand(False, True, False),
        "hand_ptr_fused_memset": hand(False, True, True), "hand_tma_fused": hand(True, True, False),
        "hand_tma_fused_memset": hand(True, True, True), "hand_ptr_fused_n64": hand(False, True, False, 64, 3),
        "memset_alone": lambda: torch.zeros(B * HKV, device="cuda", dtype=torch.int32),
    }
    for name, f in variants.items():
        try:
            out.zero_()
            f()
            torch.cuda.synchronize()
            if name != "memset_alone" and (splits > 1 or not name.startswith("hand")):
                row[name + "_diff"] = float((out.float() - ref.float()).abs().max())
            row[name] = E.graph_us(f)
        except Exception as e:  # noqa: BLE001
            row[name + "_err"] = (type(e).__name__ + ": " + str(e))[-300:]
    results.append(row)
    print(json.dumps({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}), flush=True)
    json.dump(results, open(os.path.join(OUT, "exp2.json"), "w"), indent=1)
