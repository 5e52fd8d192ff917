"""Prototype (session 42, not run yet): does a paged decode split lose its ~0.7 us at
B = 1 to the dependent chain `kv_lens -> block table -> K`? Hand-written split kernels
of one 16-row tile (Llama-3-8B: 4 query heads per KV head, one query, D = 128, blocks
of 64 keys, pages of 16), one program per (split, KV head), partial results combined by
PyTorch (the same for every variant; the split kernel is what is timed):

* `contig`: a contiguous cache with a length, splits of consecutive blocks;
* `paged`: the block table read per tile, consecutive blocks (what AttnFuse does);
* `paged_rr`: blocks taken round-robin (split s walks s, s + splits, ...);
* `paged_rr_carried`: that with the first tile's block-table entries loaded before
  `kv_lens` (masked by the table's width: the first key of split s does not depend on
  the length) and each next tile's entries carried through the loop (`_deep`: at two
  more pipeline stages);
* `paged_rr_peeled`: the first tile peeled out of the loop with its prefetched entries.

    python bench/prototypes/paged_first_tile.py [--out DIR]   # writes DIR/paged_first_tile.json

Each variant's output is checked against SDPA (the max difference is recorded). Without
CUDA (`TRITON_INTERPRET=1`), it checks the variants in f16 on the CPU, untimed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

HKV, GROUP, D, BN, PAGE, ROWS = 8, 4, 128, 64, 16, 16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


@triton.jit
def _tile(q, k_base, v_base, offs, ok, d, m_i, l_i, acc, scale):
    k = tl.load(k_base + offs[:, None] + d[None, :], mask=ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    v = tl.load(v_base + offs[:, None] + d[None, :], mask=ok[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def split_kernel(Q, K, V, BT, LENS, OP, LP, cap, page_stride, head_stride,
                 PAGED: tl.constexpr, RR: tl.constexpr, PREFETCH: tl.constexpr,
                 BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr, DIM: tl.constexpr, G: tl.constexpr,
                 R: tl.constexpr, STAGES: tl.constexpr):
    split = tl.program_id(0)
    h = tl.program_id(1)
    splits = tl.num_programs(0)
    rows = tl.arange(0, R)
    d = tl.arange(0, DIM)
    n = tl.arange(0, BLOCK)
    q_ok = rows < G
    scale = 1.4426950408889634 / tl.sqrt(DIM * 1.0)
    first = split * BLOCK + n
    pages = tl.zeros([BLOCK], dtype=tl.int32)
    if PREFETCH > 0:  # issued before the length is known
        pages = tl.load(BT + first // PAGE_SIZE, mask=first < cap, other=0)
    kv_len = tl.load(LENS)
    q = tl.load(Q + (h * G + rows)[:, None] * DIM + d[None, :], mask=q_ok[:, None], other=0.0)
    k_base = K + h * head_stride
    v_base = V + h * head_stride
    if RR:
        lo = split * BLOCK
        step = splits * BLOCK
        hi = kv_len
    else:
        blocks = tl.cdiv(kv_len, BLOCK)
        per = tl.cdiv(blocks, splits) * BLOCK
        lo = split * per
        hi = tl.minimum(lo + per, kv_len)
        step = BLOCK
    m_i = tl.full([R], float("-inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, DIM], tl.float32)
    if PREFETCH == 2:  # the first tile, peeled
        ok = first < kv_len
        offs = pages.to(tl.int64) * page_stride + (first % PAGE_SIZE) * DIM
        m_i, l_i, acc = _tile(q, k_base, v_base, offs, ok, d, m_i, l_i, acc, scale)
        lo = lo + step
    for start in tl.range(lo, hi, step, num_stages=STAGES):
        keys = start + n
        ok = keys < kv_len
        if PAGED:
            if PREFETCH == 1:
                page = pages
                upcoming = keys + step
                pages = tl.load(BT + upcoming // PAGE_SIZE, mask=upcoming < cap, other=0)
            else:
                page = tl.load(BT + keys // PAGE_SIZE, mask=ok, other=0)
            offs = page.to(tl.int64) * page_stride + (keys % PAGE_SIZE) * DIM
        else:
            offs = keys.to(tl.int64) * DIM
        m_i, l_i, acc = _tile(q, k_base, v_base, offs, ok, d, m_i, l_i, acc, scale)
    out_rows = (split * tl.num_programs(1) + h) * G + rows
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    tl.store(OP + out_rows[:, None] * DIM + d[None, :], acc / l_safe[:, None], mask=q_ok[:, None])
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
    tl.store(LP + out_rows, lse, mask=q_ok)


VARIANTS = {"contig": (False, False, 0, 0), "paged": (True, False, 0, 2), "paged_rr": (True, True, 0, 2),
            "paged_rr_carried": (True, True, 1, 0), "paged_rr_carried_deep": (True, True, 1, 2),
            "paged_rr_peeled": (True, True, 2, 2), "contig_rr": (False, True, 0, 0)}
"""name -> (paged, round-robin, prefetch: 0 none, 1 carried, 2 peeled, pipeline stages beyond
3). A block-table load in the loop takes two stages of its own (two K/V buffers either
way, sm_90 compile: 70-71 KiB of shared memory); the carried entries do not, and at 5
stages the carried variant holds four K/V buffers (134 KiB)."""


def inputs(kv_len: int, gen: torch.Generator, table_keys: int) -> dict[str, torch.Tensor]:
    """Q, contiguous K and V, the same scattered over shuffled pages, a block table of
    `table_keys` keys (unused columns point at page 0, as an engine's spare ones may)."""
    q = torch.randn(1, HKV * GROUP, 1, D, device=DEVICE, dtype=DTYPE, generator=gen)
    k = torch.randn(1, HKV, kv_len, D, device=DEVICE, dtype=DTYPE, generator=gen)
    v = torch.randn_like(k)
    pages = kv_len // PAGE
    order = torch.randperm(pages, generator=gen, device=DEVICE)
    pools = []
    for x in (k, v):
        paged = x[0].view(HKV, pages, PAGE, D).permute(1, 0, 2, 3)
        pool = torch.empty_like(paged)
        pool[order] = paged
        pools.append(pool.contiguous())
    table = torch.zeros(table_keys // PAGE, device=DEVICE, dtype=torch.int32)
    table[:pages] = order.to(torch.int32)
    return {"q": q, "k": k, "v": v, "k_pool": pools[0], "v_pool": pools[1], "table": table,
            "lens": torch.tensor([kv_len], device=DEVICE, dtype=torch.int32)}


def runner(x: dict[str, torch.Tensor], variant: str, splits: int, stages: int) -> Any:
    paged, rr, prefetch, extra = VARIANTS[variant]
    o_part = torch.empty(splits * HKV * GROUP, D, device=DEVICE, dtype=torch.float32)
    lse_part = torch.empty(splits * HKV * GROUP, device=DEVICE, dtype=torch.float32)
    k, v = (x["k_pool"], x["v_pool"]) if paged else (x["k"][0], x["v"][0])
    page_stride, head_stride = (k.stride(0), k.stride(1)) if paged else (0, k.stride(0))
    cap = x["table"].numel() * PAGE

    def split() -> None:
        split_kernel[(splits, HKV)](x["q"], k, v, x["table"], x["lens"], o_part, lse_part, cap, page_stride,
                                    head_stride, PAGED=paged, RR=rr, PREFETCH=prefetch, BLOCK=BN,
                                    PAGE_SIZE=PAGE, DIM=D, G=GROUP, R=ROWS, STAGES=stages + extra,
                                    num_warps=4)

    def combine() -> torch.Tensor:
        lse = lse_part.view(splits, -1)
        w = torch.softmax(lse * math.log(2), 0)
        return (o_part.view(splits, -1, D) * w[..., None]).sum(0).view(1, HKV * GROUP, 1, D)

    return split, combine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if DEVICE == "cpu":  # the interpreter's tl.range with tensor bounds (AttnFuse's patch)
        from attnfuse.runtime.loader import _fix_triton_interpreter
        _fix_triton_interpreter()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    # (keys, splits, block-table width in keys): a table sized to the sequence, and one
    # sized for a longer one (a serving engine's max_model_len)
    shapes = (((1024, 16, 1024), (1024, 16, 8192), (8192, 16, 8192), (8192, 16, 32768), (32768, 16, 32768))
              if DEVICE == "cuda" else ((256, 2, 256), (448, 3, 1024)))
    for kv_len, splits, table_keys in shapes:
        x = inputs(kv_len, torch.Generator(device=DEVICE).manual_seed(kv_len), table_keys)
        want = torch.nn.functional.scaled_dot_product_attention(x["q"], x["k"], x["v"], enable_gqa=True)
        row: dict[str, Any] = {"kv_len": kv_len, "splits": splits, "table_keys": table_keys}
        for variant in VARIANTS:
            split, combine = runner(x, variant, splits, 3)
            try:
                split()
                row[f"{variant}_max_diff"] = float((combine().float() - want.float()).abs().max())
                if DEVICE == "cuda":
                    row[f"{variant}_us"] = 1e3 * float(triton.testing.do_bench_cudagraph(split, rep=200,
                                                                                         return_mode="median"))
            except Exception as exc:  # reported, never hidden
                row[f"{variant}_error"] = f"{type(exc).__name__}: {exc}"[:400]
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "paged_first_tile.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
