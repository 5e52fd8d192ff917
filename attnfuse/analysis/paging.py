"""Paged KV caches: the block table and lengths of a program, and what a paged program holds.

An `attn.scores` with `block_table` and `kv_lens` reads K and V from page pools
`[?, Hkv, page_size, D]`: sequence `b` has `kv_lens[b]` keys, key `j` is row
`j % page_size` of page `block_table[b, j / page_size]`. The program is then, for every
`b`, the same program on the contiguous keys of sequence `b` (bottom-right masks align
with `kv_lens[b]`). Lowering (`mask-tiling`, `split-kv`, `lower-to-tile`,
`lower-backward`) and the runtime's argument checks share this analysis.

```mlir
%s = attn.scores %q, %kc block_table %bt kv_lens %lens : ... -> !attn.scores<?x32x?x?xf32>
```
pages with `PagedCache(block_table=%bt, kv_lens=%lens, page_size=16)`.

An `attn.scores` with `kv_lens` alone reads a contiguous cache `[B, Hkv, capacity, D]`
of which sequence `b` holds its first `kv_lens[b]` keys (`cache_lengths`): a serving
loop's cache allocated once at its final size, so every decode step has the same shapes
(one launch plan, CUDA-graph capturable), as `flash_attn_with_kvcache`'s
`cache_seqlens`.

What a paged program, or one with a contiguous cache and lengths, cannot hold is
rejected with a `ProgramError` at the op:

* K transforms (`attn.rope`, `attn.qk_norm` on K): they would rotate the whole cache on
  every call; the cache holds keys as the model attends to them, rotated when appended
  (`attnfuse.inference.append_paged_kv`);
* operands indexed by a padded `[B, Skv]` key axis (document ids, bias tensors, per-row
  prefix lengths), as for packed batches;
* dropout (inference), and a packed batch (`cu_seqlens`).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue
from xdsl.utils.exceptions import VerifyException

from attnfuse.analysis.packing import reject_padded_batch_ops
from attnfuse.dialects.attn_paged import verify_page_pool
from attnfuse.program import AttentionProgram, ProgramError

NO_BACKWARD = "a paged KV cache (block_table) is for inference: lower-backward builds no backward for it"
"""Why a paged program has no gradient (`attnfuse.no_backward`)."""

NO_BACKWARD_LENS = "a KV cache with kv_lens is for inference: lower-backward builds no backward for it"
"""Why a program with a contiguous cache and lengths has no gradient."""


@dataclass(frozen=True)
class PagedCache:
    """The block table and key counts of a paged program, and its page size."""

    block_table: SSAValue
    kv_lens: SSAValue
    page_size: int

    def arguments(self, program: AttentionProgram) -> tuple[int, int]:
        """(argument index of the block table, of kv_lens)."""
        return program.arg(self.block_table), program.arg(self.kv_lens)


def paged_cache(program: AttentionProgram) -> PagedCache | None:
    """The paging of `program`, or None; a `ProgramError` for what a paged program
    cannot hold (see the module docstring)."""
    scores = program.scores
    if scores.block_table is None or scores.kv_lens is None:
        return None
    k_type = scores.k.type
    assert isinstance(k_type, TensorType)
    paged = PagedCache(scores.block_table, scores.kv_lens, k_type.get_shape()[2])
    paged.arguments(program)  # both must be function arguments
    user = program.weighted_sum or program.online
    try:
        if verify_page_pool(program.v_type, "v") != paged.page_size:
            raise ProgramError(f"v page size {program.v_type.get_shape()[2]} differs from k's {paged.page_size} "
                               "(one block table pages both)", user)
    except VerifyException as err:
        raise ProgramError(str(err), user) from None
    _reject_cache_misfits(program, "a paged KV cache")
    return paged


def cache_lengths(program: AttentionProgram) -> SSAValue | None:
    """`kv_lens` of a program that reads a contiguous cache with lengths (no block
    table), or None; a `ProgramError` for what it cannot hold (as a paged program)."""
    scores = program.scores
    if scores.kv_lens is None or scores.block_table is not None:
        return None
    program.arg(scores.kv_lens)  # a function argument
    _reject_cache_misfits(program, "a KV cache with kv_lens")
    return scores.kv_lens


def no_backward(program: AttentionProgram) -> str | None:
    """Why `program` has no backward (a KV cache read through `kv_lens`), or None."""
    if paged_cache(program) is not None:
        return NO_BACKWARD
    return NO_BACKWARD_LENS if cache_lengths(program) is not None else None


def _reject_cache_misfits(program: AttentionProgram, what: str) -> None:
    if program.k.transforms:
        op = program.k.transforms[0]
        raise ProgramError(
            f"{op.name} on K of {what} would transform the whole cache on every call: "
            "store keys transformed (attnfuse.inference.append_paged_kv rotates them)", op)
    reject_padded_batch_ops(program, f"with {what}", dropout_note=" (inference)")


__all__ = ["NO_BACKWARD", "NO_BACKWARD_LENS", "PagedCache", "cache_lengths", "no_backward", "paged_cache"]
