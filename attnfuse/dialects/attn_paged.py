"""The paged KV cache operand form of `attn.scores`: types and their verification.

A paged program reads K and V from *page pools*, `[num_pages, Hkv, page_size, D]` (the
dialect's `[batch, heads, seq, head_dim]` convention, with pages as the batch dim), through
a block table and per-sequence key counts:

```mlir
%s = attn.scores %q, %kc block_table %bt kv_lens %lens
       : tensor<?x32x?x128xbf16>, tensor<?x8x16x128xbf16>, tensor<?x?xi32>, tensor<?xi32>
       -> !attn.scores<?x32x?x?xf32>
```

Sequence `b` has `kv_lens[b]` keys; key `j` is row `j % page_size` of page
`block_table[b, j / page_size]`. Without a block table, `kv_lens` says how many keys of
a contiguous cache `[B, Hkv, capacity, D]` each sequence holds (its first ones):

```mlir
%s = attn.scores %q, %kc kv_lens %lens
       : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
```

The page size is a page pool's static dim 2; the page count is
dynamic (a pool grows with the serving engine's memory). The V pool is checked against
K's by the program analysis (`attnfuse.analysis.paging`): `attn.weighted_sum` reads it.
"""

from __future__ import annotations

from xdsl.dialects.builtin import IntegerType, TensorType
from xdsl.ir import Attribute
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn_types import DYNAMIC, dims_compatible, format_dims


def _i32_tensor(value_type: Attribute, what: str, shape: str, rank: int) -> tuple[int, ...]:
    if (
        not isinstance(value_type, TensorType)
        or len(value_type.get_shape()) != rank
        or not isinstance(value_type.element_type, IntegerType)
        or value_type.element_type.width.data != 32
    ):
        raise VerifyException(f"{what} must be an int32 {shape} tensor, got {value_type}")
    return tuple(value_type.get_shape())


def verify_page_pool(pool: Attribute, what: str) -> int:
    """Check a page pool type `[?, heads, page_size, head_dim]`; return its page size."""
    assert isinstance(pool, TensorType)
    pages, _, page_size, _ = pool.get_shape()
    if pages != DYNAMIC:
        raise VerifyException(
            f"{what} page pool has a dynamic page count ([?, heads, page_size, head_dim]), "
            f"got {format_dims(pool.get_shape())}")
    if page_size == DYNAMIC:
        raise VerifyException(f"{what} page pool needs a static page size (dim 2), got {format_dims(pool.get_shape())}")
    return page_size


def verify_paged_operands(q: Attribute, k: Attribute, block_table: Attribute, kv_lens: Attribute,
                          kv_len_dim: int) -> None:
    """The checks of a paged `attn.scores` (see the module docstring); `kv_len_dim` is
    the result's kv_len dim, dynamic (one length per sequence)."""
    assert isinstance(q, TensorType)
    batch = q.get_shape()[0]
    verify_page_pool(k, "attn.scores k")
    table = _i32_tensor(block_table, "attn.scores block_table", "[batch, max_pages]", 2)
    lens = _i32_tensor(kv_lens, "attn.scores kv_lens", "[batch]", 1)
    if not dims_compatible(table[0], batch) or not dims_compatible(lens[0], batch):
        raise VerifyException(
            f"attn.scores: block_table {format_dims(table)} and kv_lens {format_dims(lens)} have one row per "
            f"sequence of q (batch {format_dims((batch,))})")
    if kv_len_dim != DYNAMIC:
        raise VerifyException("attn.scores: paged scores have a dynamic kv_len dim (kv_lens[b] keys per sequence)")


def verify_cache_lengths(q: Attribute, kv_lens: Attribute) -> None:
    """The check of `kv_lens` on a contiguous cache: int32, one entry per sequence of q."""
    assert isinstance(q, TensorType)
    lens = _i32_tensor(kv_lens, "attn.scores kv_lens", "[batch]", 1)
    if not dims_compatible(lens[0], q.get_shape()[0]):
        raise VerifyException(f"attn.scores: kv_lens {format_dims(lens)} has one entry per sequence of q "
                              f"(batch {format_dims((q.get_shape()[0],))})")


__all__ = ["verify_cache_lengths", "verify_page_pool", "verify_paged_operands"]
