"""One rank of the ring-attention tests (run by tests/distributed/test_ring.py under torchrun, gloo).

For every case: the same seeded full q, k, v, operands and output gradient on every rank;
the context-parallel run on this rank's zigzag shards (forward, backward, outputs and
gradients all-gathered); on rank 0 the single-process run of the program on the full
sequence, the float64 reference (`attnfuse.reference`) and PyTorch's own error in that
dtype (SDPA with the same mask and heads, against SDPA in float64). The loss is
`(out * g).sum()`, plus `(lse * g_lse).sum()` for a program that returns its lse. Rank 0
writes the largest absolute errors to OUT/ring_<world>.json.

    python -m torch.distributed.run --nproc-per-node 2 tests/distributed/ring_worker.py OUT [CASE ...]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import attnfuse
import attnfuse.reference
from attnfuse.distributed import RingAttention, RingSplitError

B, H, HKV, D = 1, 4, 2, 16


def _cases() -> dict[str, tuple[Any, bool, Callable[[int], list[torch.Tensor]]]]:
    """name: (builder, causal, extra operands for a full length S)."""
    base = attnfuse.attention(H, D, kv_heads=HKV, dtype="f32", name="cp")
    half = attnfuse.attention(H, D, kv_heads=HKV, dtype="f16", name="cp_f16")
    mha = attnfuse.attention(H, D, dtype="f32", name="cp_mha")
    none: Callable[[int], list[torch.Tensor]] = lambda s: []  # noqa: E731

    def documents(s: int) -> list[torch.Tensor]:
        """Position ids restarting at every document, and the document ids (three documents)."""
        doc = torch.bucketize(torch.arange(s), torch.tensor([s // 3, s - 5]), right=True).to(torch.int32)
        starts = torch.tensor([0, s // 3, s - 5])[doc.long()]
        return [(torch.arange(s) - starts).to(torch.int32).expand(B, s), doc.expand(B, s)]

    return {
        "causal_gqa": (base.causal(), True, none),
        "noncausal_gqa": (base, False, none),
        "causal_mha_softcap": (mha.softcap(2.0).causal(), True, none),
        "rope_causal": (base.rope(theta=10000.0, offset=3).causal(), True, none),
        "causal_lse": (base.causal().lse(), True, none),
        "rope_causal_f16": (half.rope(theta=10000.0).causal(), True, none),
        "rope_positions_qknorm": (base.qk_norm().rope(theta=500.0, positions=True).causal(), True,
                                  lambda s: [torch.rand(D) + 0.5, torch.rand(D) + 0.5,
                                             torch.arange(s, dtype=torch.int32).flip(0).expand(B, s) * 2]),
        "document_rope_positions": (base.rope(theta=100.0, positions=True).causal().document(), True, documents),
        "sinks_causal_lse": (base.causal().sinks().lse(), True, lambda s: [torch.randn(H)]),
        "document_separate_noncausal": (base.document(separate_kv=True), False, lambda s: documents(s)[1:] * 2),
    }


def _max(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _torch_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, causal: bool
                 ) -> dict[str, float]:
    """PyTorch's own error in q's dtype: SDPA's output and q/k/v gradients against float64."""
    results = []
    for dtype in (q.dtype, torch.float64):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
        out.backward(g.to(dtype))
        results.append([out, *(t.grad for t in leaves)])
    return {name: _max(a, b) for name, a, b in zip(("out", "q", "k", "v"), *results)}


def _backward(result: tuple[torch.Tensor, ...], g: torch.Tensor, g_lse: torch.Tensor, with_lse: bool) -> None:
    """Backward of `(out * g).sum()`, plus `(lse * g_lse).sum()` for a program returning its lse."""
    loss = (result[0].float() * g.float()).sum()
    if with_lse:
        loss = loss + (result[1].float() * g_lse.float()).sum()
    loss.backward()


def _ring(builder: Any) -> RingAttention:
    """Rank 0 builds the RingAttention first (lowering its block programs into the disk
    cache), then the other ranks build theirs from the same text: cache hits instead of
    every rank lowering the same programs at once on the CI machine's two cores."""
    ring = RingAttention(builder) if dist.get_rank() == 0 else None
    dist.barrier()
    return RingAttention(builder) if ring is None else ring


def run_case(builder: Any, causal: bool, extra: Callable[[int], list[torch.Tensor]],
             seq: int) -> dict[str, Any]:
    ring = _ring(builder)
    rank = ring.rank
    dtype = {"f16": torch.float16}.get(str(builder.dtype), torch.float32)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, heads, seq, D, dtype=dtype) for heads in (H, builder.kv_heads, builder.kv_heads))
    operands = extra(seq)
    g, g_lse = torch.randn(B, H, seq, D, dtype=dtype), torch.randn(B, H, seq)
    names = ring.split.operands
    learn = [i for i, n in enumerate(names) if n in ("wq", "wk", "sinks")]

    local = [ring.shard(t).requires_grad_() for t in (q, k, v)]
    ids = ("pos", "doc", "q_doc", "kv_doc")  # sharded like the sequence; weights are replicated
    local_ops = [ring.shard(t, dim=t.dim() - 1) if n in ids else t.clone().requires_grad_()
                 for n, t in zip(names, operands)]
    result = ring(*local, *local_ops, return_lse=True)
    _backward(result, ring.shard(g), ring.shard(g_lse), builder.returns_lse)
    cp = {"out": ring.unshard(result[0].detach())}
    if builder.returns_lse:
        cp["lse"] = ring.unshard(result[1].detach())
    cp.update({n: ring.unshard(t.grad) for n, t in zip("qkv", local)})
    for i in learn:
        grad = local_ops[i].grad.clone()
        dist.all_reduce(grad)  # each rank holds its share of a replicated operand's gradient
        cp[names[i]] = grad
    if rank:
        return {}

    def autograd_run(fn: Callable[..., torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        extras = [t.detach().to(dtype).requires_grad_() if i in learn else t for i, t in enumerate(operands)]
        result = fn(*leaves, *extras)
        result = result if isinstance(result, tuple) else (result,)
        _backward(result, g.to(dtype), g_lse.to(result[-1].dtype), builder.returns_lse)
        values = {"out": result[0].detach(), **({"lse": result[1].detach()} if builder.returns_lse else {})}
        values.update({n: t.grad for n, t in zip("qkv", leaves)})
        values.update({names[i]: extras[i].grad for i in learn})
        return values

    program = builder.build()
    single = autograd_run(attnfuse.compile(program), dtype)
    reference = autograd_run(lambda *a: attnfuse.reference.run(program.text(), *a), torch.float64)
    return {
        "cp_vs_reference": {n: _max(cp[n], reference[n]) for n in cp},
        "single_vs_reference": {n: _max(single[n], reference[n]) for n in cp},
        "cp_vs_single": {n: _max(cp[n], single[n]) for n in cp},
        "torch": _torch_error(q, k, v, g, causal),
    }


def main(out_dir: str, names: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from interpreter_checks import set_overflow_checks

    set_overflow_checks(False)  # as in the pytest process (tests/conftest.py)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    seq = 8 * world
    results: dict[str, Any] = {"world": world, "seq": seq, "cases": {}}
    cases = _cases()
    for name in names or list(cases):
        builder, causal, extra = cases[name]
        results["cases"][name] = run_case(builder, causal, extra, seq)
    try:
        RingAttention(attnfuse.attention(H, D, dtype="f32").sliding_window(left=3))
    except RingSplitError as error:
        results["error"] = str(error)
    if dist.get_rank() == 0:
        Path(out_dir, f"ring_{world}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
