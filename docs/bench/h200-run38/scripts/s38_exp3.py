"""Session 38 call D: the wide kernel's masked loop: as generated; one masked loop; the
masked loop guarded (skipped when empty) and/or unpipelined; aligned and unaligned caches."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s38_exp as E  # noqa: E402


def masked_loop(src_path, name, guard, stages1):
    text = open(src_path).read()
    start = text.index("def decode_split_kv_wide")
    end = text.index("# kernel decode_split_kv_small")
    body = text[start:end].split("\n")
    i = next(j for j, line in enumerate(body) if line.startswith("    for start_n_1 in range("))
    k = i + 1
    while body[k].startswith("        "):
        k += 1
    head = body[i]
    lo, hi = head[head.index("range(") + 6:].split(",")[:2]
    hi = hi.strip()
    loop = f"for start_n_1 in tl.range({lo}, {hi}, 128, num_stages=1):" if stages1 else head.strip()
    if guard:
        new = [f"    if {lo} < {hi}:", "        " + loop] + ["    " + line for line in body[i + 1:k]]
    else:
        new = ["    " + loop] + body[i + 1:k]
    body = body[:i] + new + body[k:]
    text = text[:start] + "\n".join(body) + text[end:]
    path = f"/tmp/{name}.py"
    open(path, "w").write(text)
    return E.load(path, name)


src = os.path.join(E.HERE, "gen_new.py")
MODS = {"gen": E.load(src, "g_new"), "oneloop": E.load(os.path.join(E.HERE, "gen_oneloop.py"), "g_one"),
        "guard_st1": masked_loop(src, "g_gs", True, True), "guard": masked_loop(src, "g_g", True, False),
        "st1": masked_loop(src, "g_s", False, True)}
OUT = os.environ["OUT"]
results = []
for B, Skv in ((1, 8192), (1, 8229), (1, 32768), (1, 32805), (16, 1024), (16, 1061), (16, 8229)):
    HQ, HKV, D = 32, 8, 128
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
    for name, mod in MODS.items():
        def f(mod=mod):
            mod.decode_split_kv_wide[(splits, B * HKV, 1)](
                q, *q.stride(), k, *k.stride(), v, *v.stride(), out, *out.stride(), lse, *lse.stride(), B, 1, Skv,
                opart, *opart.stride(), lpart, *lpart.stride(), num_warps=4, num_stages=3)
            if splits > 1:
                mod.decode_split_kv_combine[(1, B * HQ, 1)](opart, *opart.stride(), lpart, *lpart.stride(), out,
                                                            *out.stride(), lse, *lse.stride(), 1, splits,
                                                            num_warps=4, num_stages=2)
        try:
            out.zero_()
            f()
            torch.cuda.synchronize()
            row[name + "_diff"] = float((out.float() - ref.float()).abs().max())
            row[name] = E.graph_us(f)
        except Exception as e:  # noqa: BLE001
            row[name + "_err"] = (type(e).__name__ + ": " + str(e))[-300:]
    results.append(row)
    print(json.dumps({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}), flush=True)
    json.dump(results, open(os.path.join(OUT, "exp3.json"), "w"), indent=1)
