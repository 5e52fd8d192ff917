"""Serving helpers: appending new keys and values to a paged KV cache.

A paged attention program (`attn.scores %q, %k_cache block_table %bt kv_lens %lens`)
reads keys as the cache stores them. `append_paged_kv` writes a step's new keys (rotated
by RoPE at their positions in the sequence) and values into the pages of each sequence,
then the attention call reads them:

```python
from attnfuse.inference import append_paged_kv

rope = {"theta": 500000.0, "scaling": "llama3", "factor": 8.0}   # attn.rope options
kv_lens = append_paged_kv(k_cache, v_cache, block_table, kv_lens, k_new, v_new, rope=rope)
out = attention(q, k_cache, v_cache, block_table, kv_lens, positions)
```

It is a kernel of its own, not fused into the attention call: the attention op stays a
pure function of its inputs (a `torch.library` op, CUDA-graph capturable, the same
kernels for prefill chunks and decode steps), the append moves `Sn` rows per sequence
against the whole cache the attention reads, and serving engines schedule the two
apart (vLLM's `reshape_and_cache`, FlashInfer's `append_paged_kv_cache`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType, bf16, f16, f32
from xdsl.ir import Attribute
from xdsl.utils.exceptions import DiagnosticException, ParseError

from attnfuse.backends.triton.emitter import emit_module, kernel_metadata
from attnfuse.dialects.attn import RopeOp
from attnfuse.dialects.tile import KernelOp
from attnfuse.lowering.append import build_append
from attnfuse.reference import parse_program
from attnfuse.runtime.checks import AttnfuseArgumentError, check_int32_layout
from attnfuse.runtime.host import HostProgram, call_signature

__all__ = ["append_paged_kv"]

_ELEMENT: dict[torch.dtype, Attribute] = {torch.float16: f16, torch.bfloat16: bf16, torch.float32: f32}
_COMPILED: dict[tuple[Any, ...], HostProgram] = {}
_LOCK = threading.Lock()


def append_paged_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, kv_lens: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor, *, rope: Mapping[str, object] | None = None,
                    check_values: bool = False) -> torch.Tensor:
    """Write `k` (rotated by `rope`, options of `attn.rope`; None: stored as given) and
    `v` as keys `kv_lens[b] .. kv_lens[b] + Sn - 1` of every sequence `b`; return the
    new lengths `kv_lens + Sn` (a new tensor: `kv_lens` is not modified).

    Shapes: `k_cache` `[num_pages, Hkv, page_size, D]`, `v_cache`
    `[num_pages, Hkv, page_size, Dv]` (vLLM / FlashInfer `[num_pages, page_size, Hkv, D]`
    caches pass as `.transpose(1, 2)`, no copy), `block_table` int32 `[B, max_pages]`,
    `kv_lens` int32 `[B]`, `k` `[B, Hkv, Sn, D]`, `v` `[B, Hkv, Sn, Dv]`. Shapes, dtypes
    and devices are checked on every call; `check_values` also checks that every
    sequence's new keys fit its block table and lie in pages of the pool (a copy to the
    host: a synchronisation). Without it, rows that do not are not written.
    """
    args = [k_cache, v_cache, block_table, kv_lens, k, v]
    _check_shapes(*args)
    if check_values:
        _check_values(k_cache, block_table, kv_lens, k.shape[2])
    options = _rope_key(rope)
    key = (k_cache.dtype, v_cache.dtype, *k_cache.shape[1:], v_cache.shape[3], options)
    with _LOCK:
        host = _COMPILED.get(key)
        if host is None:
            host = _COMPILED[key] = _compile(k_cache, v_cache, options)
    signature = call_signature(args)
    plan = host.plan(signature)
    if plan is None:
        host.build(args, signature, k_cache.device)
    else:
        plan.run(args)
    return kv_lens + k.shape[2]


def _tensor(name: str, value: object, rank: int, shape: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dim() != rank or value.layout != torch.strided:
        got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise AttnfuseArgumentError(f"append_paged_kv: argument '{name}': expected a {shape} tensor, got {got}")
    return value


def _check_shapes(k_cache: Any, v_cache: Any, block_table: Any, kv_lens: Any, k: Any, v: Any) -> None:
    """Shapes, dtypes and devices of `append_paged_kv`'s arguments (no synchronisation)."""
    k_cache = _tensor("k_cache", k_cache, 4, "[num_pages, Hkv, page_size, D]")
    pages, heads, page_size, dim = k_cache.shape
    v_cache = _tensor("v_cache", v_cache, 4, "[num_pages, Hkv, page_size, Dv]")
    v_dim = v_cache.shape[3]
    block_table = _tensor("block_table", block_table, 2, "[B, max_pages]")
    batch = block_table.shape[0]
    kv_lens = _tensor("kv_lens", kv_lens, 1, "[B]")
    k = _tensor("k", k, 4, "[B, Hkv, Sn, D]")
    new = k.shape[2]
    v = _tensor("v", v, 4, "[B, Hkv, Sn, Dv]")
    expected = {
        "k_cache": (k_cache, (pages, heads, page_size, dim), "[num_pages, Hkv, page_size, D]"),
        "v_cache": (v_cache, (pages, heads, page_size, v_dim),
                    f"[num_pages={pages}, Hkv={heads}, page_size={page_size}, Dv] (as k_cache)"),
        "kv_lens": (kv_lens, (batch,), f"[B={batch}] (rows of block_table)"),
        "k": (k, (batch, heads, new, dim), f"[B={batch}, Hkv={heads}, Sn, D={dim}]"),
        "v": (v, (batch, heads, new, v_dim), f"[B={batch}, Hkv={heads}, Sn={new}, Dv={v_dim}]"),
    }
    for name, (tensor, shape, text) in expected.items():
        if tuple(tensor.shape) != shape:
            raise AttnfuseArgumentError(f"append_paged_kv: argument '{name}': expected shape {text}, "
                                        f"got {tuple(tensor.shape)}")
    if pages == 0:
        raise AttnfuseArgumentError("append_paged_kv: argument 'k_cache': a page pool needs at least one page")
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache)):
        if tensor.dtype not in _ELEMENT:
            raise AttnfuseArgumentError(f"append_paged_kv: argument '{name}': expected dtype float16, bfloat16 "
                                        f"or float32, got {tensor.dtype}")
    for name, tensor, dtype in (("block_table", block_table, torch.int32), ("kv_lens", kv_lens, torch.int32),
                                ("k", k, k_cache.dtype), ("v", v, v_cache.dtype), ("v_cache", v_cache, v_cache.dtype)):
        if tensor.dtype != dtype:
            raise AttnfuseArgumentError(
                f"append_paged_kv: argument '{name}': expected dtype {dtype}, got {tensor.dtype}")
        if tensor.device != k_cache.device:
            raise AttnfuseArgumentError(f"append_paged_kv: argument '{name}': on {tensor.device}, but k_cache "
                                        f"is on {k_cache.device}")
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        check_int32_layout(tensor, f"append_paged_kv: argument '{name}'")


def _check_values(k_cache: torch.Tensor, block_table: torch.Tensor, kv_lens: torch.Tensor, new: int) -> None:
    """Every sequence's new keys fit its block table and lie in pages of the pool."""
    table, lens = block_table.cpu().long(), kv_lens.cpu().long()
    capacity = table.shape[1] * k_cache.shape[2]
    bad = ((lens < 0) | (lens + new > capacity)).nonzero()
    if bad.numel():
        b = int(bad[0])
        raise AttnfuseArgumentError(
            f"append_paged_kv: argument 'kv_lens': kv_lens[{b}] = {int(lens[b])} plus {new} new keys is not in "
            f"[0, {capacity}] (max_pages {table.shape[1]} x page_size {k_cache.shape[2]})")
    first = torch.arange(table.shape[1]).view(1, -1) * k_cache.shape[2]
    written = (first + k_cache.shape[2] > lens.view(-1, 1)) & (first < lens.view(-1, 1) + new)
    bad = (written & ((table < 0) | (table >= k_cache.shape[0]))).nonzero()
    if bad.numel():
        b, p = (int(i) for i in bad[0])
        raise AttnfuseArgumentError(
            f"append_paged_kv: argument 'block_table': block_table[{b}, {p}] = {int(table[b, p])} is not a page "
            f"of the pool (0 <= page < {k_cache.shape[0]})")


def _rope_key(rope: Mapping[str, object] | None) -> str | None:
    """The `attn.rope` option text of `rope` (a hashable key), or None."""
    if rope is None:
        return None
    items = []
    for name, value in rope.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"append_paged_kv: rope option {name!r} must be an int, float or str, got {value!r}")
        if isinstance(value, float):
            text = repr(value)
            value_text = text if "." in text and "e" not in text else f"{value:.6e}"
        else:
            value_text = json.dumps(value) if isinstance(value, str) else str(value)
        items.append(f"{name} = {value_text}")
    return "{" + ", ".join(items) + "}"


def _rope_op(options: str, k_cache: torch.Tensor) -> RopeOp:
    """The `attn.rope` of `options` on keys of `k_cache`'s heads, head dim and dtype."""
    _, heads, _, dim = k_cache.shape
    ty = str(TensorType(_ELEMENT[k_cache.dtype], [DYNAMIC_INDEX, heads, DYNAMIC_INDEX, dim]))
    text = f"func.func @rope(%k: {ty}) -> {ty} {{\n  %r = attn.rope %k {options} : {ty}\n  func.return %r : {ty}\n}}"
    try:
        module = parse_program(text, "<append_paged_kv rope>")
    except (DiagnosticException, ParseError, ValueError) as err:
        reason = str(err).strip().splitlines()[-1].strip()
        raise ValueError(f"append_paged_kv: bad rope options {options}: {reason}") from None
    return next(op for op in module.walk() if isinstance(op, RopeOp))


def _compile(k_cache: torch.Tensor, v_cache: torch.Tensor, options: str | None) -> HostProgram:
    rope = _rope_op(options, k_cache) if options is not None else None
    _, heads, page_size, dim = k_cache.shape
    pool = TensorType(_ELEMENT[k_cache.dtype], [DYNAMIC_INDEX, heads, page_size, dim])
    v_pool = TensorType(_ELEMENT[v_cache.dtype], [DYNAMIC_INDEX, heads, page_size, v_cache.shape[3]])
    module = build_append("append_paged_kv", pool, v_pool, rope)
    kernels = [op for op in module.ops if isinstance(op, KernelOp)]
    function = next(op for op in module.ops if isinstance(op, func.FuncOp))
    return HostProgram(function, emit_module(kernels), {k.sym_name.data: kernel_metadata(k) for k in kernels})

