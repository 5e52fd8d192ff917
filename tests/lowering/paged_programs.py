"""Paged attention programs and their inputs, for the paged KV cache tests.

`paged(...)` writes a program reading K and V from page pools through a block table
(`attn.scores ... block_table %bt kv_lens %lens`), with optional Q transforms (RoPE at
the cache offset through a `[B, Sq]` positions operand, QK-norm), score ops (written
with `{s}` for the scores type and `{x}` for the input value) and sinks / lse.
`inputs(...)` draws fresh random pools, a shuffled block table (pages of a sequence are
neither contiguous nor in order; unused entries are -1) and lengths that are not
multiples of the page size. `torch_output` is PyTorch's eager attention in the inputs'
dtype on the reference's scores (the error a plain PyTorch implementation makes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnfuse import reference
from attnfuse.reference.paging import paging

BR = '{{align = "bottom_right"}}'
"""The bottom-right alignment option, escaped for the `{x}` / `{s}` templates of `score_ops`."""


@dataclass
class PagedProgram:
    text: str
    page_size: int
    extras: list[str] = field(default_factory=list)
    """Names of the arguments after (q, k_cache, v_cache, block_table, kv_lens)."""
    last_scores: str = "s"
    heads: int = 4


def paged(hq: int = 4, hkv: int = 2, d: int = 32, dv: int | None = None, dtype: str = "f16", page: int = 8, *,
          rope: str | None = None, qk_norm: bool = False, score_ops: Sequence[str] = (), captures: Sequence[str] = (),
          sinks: bool = False, lse: bool = False, k_rope: bool = False) -> PagedProgram:
    dv = dv or d
    q_t, o_t = f"tensor<?x{hq}x?x{d}x{dtype}>", f"tensor<?x{hq}x?x{dv}x{dtype}>"
    k_t, v_t = f"tensor<?x{hkv}x{page}x{d}x{dtype}>", f"tensor<?x{hkv}x{page}x{dv}x{dtype}>"
    s_t, p_t = f"!attn.scores<?x{hq}x?x?xf32>", f"!attn.probs<?x{hq}x?x?xf32>"
    args = [f"%q: {q_t}", f"%kc: {k_t}", f"%vc: {v_t}", "%bt: tensor<?x?xi32>", "%lens: tensor<?xi32>"]
    extras: list[str] = []
    body: list[str] = []
    q, k = "%q", "%kc"
    if qk_norm:
        body.append(f"%qn = attn.qk_norm %q {{eps = 1.0e-06}} : {q_t}")
        q = "%qn"
    if rope is not None:
        args.append("%pos: tensor<?x?xi32>")
        extras.append("pos")
        body.append(f"%qr = attn.rope {q} positions %pos {rope} : {q_t}, tensor<?x?xi32>")
        q = "%qr"
    if k_rope:
        body.append(f"%kr = attn.rope %kc : {k_t}")
        k = "%kr"
    for name in captures:
        args.append(f"%{name}: tensor<{hq}xf32>")
        extras.append(name)
    body.append(f"%s = attn.scores {q}, {k} block_table %bt kv_lens %lens : {q_t}, {k_t}, tensor<?x?xi32>, "
                f"tensor<?xi32> -> {s_t}")
    last = "%s"
    for n, op in enumerate(score_ops):
        body.append(f"%s{n} = " + op.format(x=last, s=s_t))
        last = f"%s{n}"
    sink = ""
    if sinks:
        args.append(f"%sinks: tensor<{hq}xf32>")
        extras.append("sinks")
        sink = f" sinks %sinks : {s_t}, tensor<{hq}xf32>"
    results = f"{p_t}, tensor<?x{hq}x?xf32>" if lse else p_t
    body.append(f"%p{', %lse' if lse else ''} = attn.softmax {last}{sink or ' : ' + s_t} -> {results}")
    body.append(f"%o = attn.weighted_sum %p, %vc : {p_t}, {v_t} -> {o_t}")
    ret = f"%o, %lse : {o_t}, tensor<?x{hq}x?xf32>" if lse else f"%o : {o_t}"
    out_t = f"({o_t}, tensor<?x{hq}x?xf32>)" if lse else o_t
    text = (f"func.func @f({', '.join(args)}) -> {out_t} {{\n  " + "\n  ".join(body)
            + f"\n  func.return {ret}\n}}\n")
    return PagedProgram(text, page, extras, last[1:], hq)


def block_table(lens: Sequence[int], page: int, max_pages: int, pages: int, g: torch.Generator) -> torch.Tensor:
    """Shuffled pages: sequence b owns cdiv(lens[b], page) distinct random pages of the
    pool, in random order; entries past them are -1 (never read)."""
    perm = torch.randperm(pages, generator=g).tolist()
    table = torch.full((len(lens), max_pages), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        used = -(-n // page)
        table[b, :used] = torch.tensor([perm.pop() for _ in range(used)], dtype=torch.int32)
    return table


def inputs(program: PagedProgram, lens: Sequence[int], q_len: int, *, seed: int = 0, dtype: torch.dtype = torch.float16,
           spare_pages: int = 5) -> list[Any]:
    """Random arguments: pools of `sum(pages used) + spare_pages` pages, a shuffled block
    table with one spare column, the new queries' positions `lens[b] - Sq + i`."""
    g = torch.Generator().manual_seed(seed)
    page = program.page_size
    used = sum(-(-n // page) for n in lens)
    pages = used + spare_pages
    max_pages = max(-(-n // page) for n in lens) + 1
    parsed = reference.parse_program(program.text)
    arg_types = [a.type for a in next(iter(parsed.ops)).args]  # type: ignore[attr-defined]
    shapes = [t.get_shape() for t in arg_types[:3]]
    q = torch.randn(len(lens), shapes[0][1], q_len, shapes[0][3], generator=g).to(dtype)
    kc = torch.randn(pages, *shapes[1][1:], generator=g).to(dtype)
    vc = torch.randn(pages, *shapes[2][1:], generator=g).to(dtype)
    table = block_table(lens, page, max_pages, pages, g)
    return [q, kc, vc, table, torch.tensor(lens, dtype=torch.int32), *extra_args(program, lens, q_len, g)]


def extra_args(program: PagedProgram, lens: Sequence[int], q_len: int, g: torch.Generator) -> list[Any]:
    """The arguments after the cache's: the new queries' positions `lens[b] - Sq + i`,
    per-head tables (sinks, slopes, captures) drawn from `g`."""
    args: list[Any] = []
    for name in program.extras:
        if name == "pos":
            args.append((torch.tensor(lens).view(-1, 1) - q_len + torch.arange(q_len)).to(torch.int32))
        else:
            args.append(torch.randn(program.heads, generator=g))
    return args


def torch_output(program: PagedProgram, args: Sequence[Any]) -> torch.Tensor:
    """PyTorch's eager attention in the inputs' dtype, from the reference's scores. A
    program without a block table reads a contiguous cache with lengths (arguments q, k,
    v, kv_lens, extras): one page of its whole capacity per sequence."""
    scores = reference.run(program.text, *args, return_all=True)[program.last_scores]
    dtype = args[0].dtype
    if "block_table" in program.text:
        q, _, vc, table, lens = args[:5]
    else:
        q, _, vc, lens = args[:4]
        table = torch.arange(vc.shape[0]).view(-1, 1)
    first_extra = 5 if "block_table" in program.text else 4
    pages = paging(table.long(), lens.long(), q.shape[2], vc.shape[0], vc.shape[2])
    s = torch.where(pages.same_sequence(), scores, float("-inf")).to(dtype)
    if "sinks" in program.extras:
        sinks = args[first_extra + program.extras.index("sinks")].to(dtype).view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        p = torch.softmax(torch.cat([s, sinks], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    v = pages.gather(vc.double()).to(dtype)
    v = v.repeat_interleave(s.shape[1] // v.shape[1], 1)
    return p.nan_to_num(0.0) @ v


def assert_matches_reference(program: PagedProgram, args: Sequence[Any], result: Any) -> torch.Tensor:
    """`result` (out, or (out, lse)) against the float64 reference: out within
    `FACTOR` x PyTorch's own error in the dtype, no NaN; the lse finite where the
    reference's is and within 1e-2 of it. Returns out."""
    from split_kv_check import FACTOR, relative_error

    out = result[0] if isinstance(result, tuple) else result
    want = reference.run(program.text, *args)
    want = want[0] if isinstance(want, tuple) else want
    dtype = args[0].dtype
    assert out.dtype == dtype and not torch.isnan(out).any()
    ours, theirs = relative_error(out, want), relative_error(torch_output(program, args), want)
    bound = FACTOR[dtype] * max(theirs, torch.finfo(dtype).eps)
    assert ours <= bound, f"relative error {ours:.2e} > {bound:.2e} ({FACTOR[dtype]} x PyTorch's {theirs:.2e})"
    if isinstance(result, tuple):
        lse = reference.run(program.text, *args)[1]
        finite = torch.isfinite(lse)
        assert torch.equal(torch.isfinite(result[1]), finite)
        assert (result[1].double()[finite] - lse[finite]).abs().max() < 1e-2
    return out


__all__ = ["BR", "PagedProgram", "assert_matches_reference", "block_table", "extra_args", "inputs", "paged",
           "torch_output"]
