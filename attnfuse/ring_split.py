"""Split an attention program into the block programs of ring attention (compile time).

Context parallelism (`attnfuse.distributed`) computes attention block by block: the
queries of one sequence shard against the keys of another. `split_for_ring` derives,
from the user's program, the program such a block runs, by one documented rule:

- Every `attn.rope` reads explicit positions: Q-side ropes a new `q_pos` argument, K-side
  ropes a new `kv_pos` argument (rank 1 `[S]` int32, or the rank of the user's positions
  operand). A rope on implicit positions (`index + offset`) gets the global positions
  plus its `offset` from the wrapper; a rope on a positions operand gets that operand's
  shard (the K side's travels with K). All ropes of one side must read one source.
- `attn.mask causal` (either alignment: the blocks it is kept in are square) is kept in
  the *diagonal* variant and removed in the *unmasked* one; a program without it needs
  the unmasked variant only.
- `attn.mask document` reads `q_doc` and `kv_doc` arguments (`[B, S]` int32): the
  shards of the user's document ids (one operand for both sides, or `q_doc` and
  `kv_doc`); the K side's travel with K. It is kept in both variants.
- `attn.qk_norm` (its weights are passed through), `attn.scores`, `attn.softcap`,
  `attn.softmax` and `attn.weighted_sum` are position-free and kept; softmax sinks are
  removed from the blocks (they would count once per block): the wrapper adds them to the
  merged lse once (`RingSplit.sinks`).
- Everything else depends on global positions or on the whole row and is refused with a
  `RingSplitError`: other masks (windows, prefix-LM, `mask_mod`), `attn.bias`
  (ALiBi, `[S, S]` tensors), `attn.score_mod`, `attn.dropout`.

Block programs take `(q, k, v, <the user's other operands>, [q_pos], [q_doc], [kv_pos],
[kv_doc])`: the Q side's extra operands, then the K side's (which travel with K).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerType, ModuleOp, TensorType, i32
from xdsl.ir import BlockArgument, Operation, Region

from attnfuse.builder import Program, ProgramBuilder
from attnfuse.dialects.attn import (
    MaskOp,
    QKNormOp,
    RopeOp,
    ScoresOp,
    SoftcapOp,
    SoftmaxOp,
    WeightedSumOp,
)
from attnfuse.dialects.attn_types import DYNAMIC
from attnfuse.program import analyze, find_functions

__all__ = ["PositionSource", "RingSplit", "RingSplitError", "split_for_ring"]

_WHY = {
    "attn.bias": "adds a bias indexed by global positions (ALiBi) or a [B, H, Sq, Skv] tensor",
    "attn.score_mod": "may read q_idx / kv_idx, which a block sees as local indices",
    "attn.dropout": "draws its random numbers by global position",
}
_KEPT = (QKNormOp, RopeOp, ScoresOp, SoftcapOp, SoftmaxOp, WeightedSumOp, func.ReturnOp)


class RingSplitError(ValueError):
    """A program that cannot be split into ring-attention blocks."""


@dataclass(frozen=True)
class PositionSource:
    """Where the positions of one side's ropes come from."""

    operand: int | None
    """Index of the user's positions argument, or None for `global index + offset`."""
    offset: int
    """The ropes' `offset` (implicit positions only)."""
    rank: int
    """Rank of the block program's positions argument: 1 (`[S]`) or 2 (`[B, S]`)."""


@dataclass(frozen=True)
class RingSplit:
    """The block programs of one user program (see the module docstring)."""

    name: str
    diagonal: str | None
    """Text of the block program with its causal mask; None for a program without one."""
    unmasked: str
    """Text of the block program without its causal mask."""
    operands: tuple[str, ...]
    """The names of the user's arguments after q, k, v."""
    passed: tuple[int, ...]
    """The user's arguments (indices) the block programs take after q, k, v, in order."""
    returns_lse: bool
    """Whether the user's program returns (out, lse)."""
    q_positions: PositionSource | None
    kv_positions: PositionSource | None
    """None where the side has no rope."""
    q_doc: int | None = None
    kv_doc: int | None = None
    """The user's document-ids arguments (indices) of each side; None without a document mask."""
    sinks: int | None = None
    """The user's softmax-sinks argument (index), left out of the block programs."""

    @property
    def causal(self) -> bool:
        return self.diagonal is not None


def _read(program: Program | ProgramBuilder | str | os.PathLike[str], params: Mapping[str, object] | None) -> str:
    from attnfuse.api import _read_program
    from attnfuse.params import substitute

    if isinstance(program, ProgramBuilder):
        program = program.build()
    text, filename = _read_program(program)
    return substitute(text, params, filename)


def _parse(text: str) -> tuple[ModuleOp, func.FuncOp]:
    from attnfuse.reference import parse_program

    module = parse_program(text)
    functions = find_functions(module)
    if len(functions) != 1:
        raise RingSplitError(f"attnfuse.distributed: expected one attention function, found {len(functions)}")
    return module, functions[0]


def _refuse(name: str, op: Operation, why: str) -> RingSplitError:
    what = op.name + (f" {op.kind.data}" if isinstance(op, MaskOp) and op.kind is not None else "")
    return RingSplitError(
        f"attnfuse.distributed: @{name} cannot be split over a sequence ring: '{what}' {why}; supported: "
        "attn.rope (implicit positions or a positions operand), attn.qk_norm, attn.scores, attn.softcap, "
        "attn.mask causal, attn.mask document, attn.softmax (with or without sinks), attn.weighted_sum")


def _check(name: str, function: func.FuncOp) -> None:
    for op in function.body.block.ops:
        if isinstance(op, ScoresOp) and op.kv_lens is not None:
            cache = "a paged KV cache (block_table)" if op.block_table is not None else "a KV cache with kv_lens"
            raise _refuse(name, op, f"reads {cache}, which decoding reads whole on one rank")
        if isinstance(op, MaskOp) and op.kind is not None and op.kind.data in ("causal", "document"):
            continue
        if not isinstance(op, _KEPT) or isinstance(op, MaskOp):
            raise _refuse(name, op, _WHY.get(op.name, "depends on global positions (not split yet)"))


def _source(name: str, side: str, ropes: list[RopeOp]) -> PositionSource | None:
    sources = set()
    for rope in ropes:
        pos = rope.positions
        if pos is None:
            sources.add(PositionSource(None, int(rope.option("offset") or 0), 1))
        else:
            assert isinstance(pos, BlockArgument) and isinstance(pos.type, TensorType)
            sources.add(PositionSource(pos.index, 0, pos.type.get_num_dims()))
    if len(sources) > 1:
        raise RingSplitError(f"attnfuse.distributed: @{name}: the {side} ropes read different positions "
                             f"({len(sources)} sources); a split needs one per side")
    return next(iter(sources), None)


def _is(op: Operation, kind: str) -> bool:
    return isinstance(op, MaskOp) and op.kind is not None and op.kind.data == kind


def _documents(name: str, function: func.FuncOp) -> tuple[int | None, int | None]:
    """The user's (Q side, K side) document-ids arguments."""
    sources = set()
    for mask in [op for op in function.body.block.ops if _is(op, "document")]:
        ids = [a for a in mask.args if isinstance(a, BlockArgument)]
        if len(ids) != len(mask.args):
            raise RingSplitError(f"attnfuse.distributed: @{name}: document ids must be function arguments")
        sources.add((ids[0].index, ids[-1].index))
    if len(sources) > 1:
        raise RingSplitError(f"attnfuse.distributed: @{name}: document masks read different ids; "
                             "a split needs one pair")
    return next(iter(sources), (None, None))


def _variant(text: str, keep_causal: bool, split: RingSplit, dropped: set[int]) -> str:
    """The block program: explicit positions and document ids, the causal mask kept or not."""
    module, function = _parse(text)
    analyzed = analyze(function)
    block = function.body.block
    new_args = {}
    doc_rank = 2 if split.q_doc is not None else 0
    ranks = {"q_pos": split.q_positions.rank if split.q_positions else 0, "q_doc": doc_rank,
             "kv_pos": split.kv_positions.rank if split.kv_positions else 0, "kv_doc": doc_rank}
    for arg_name, rank in ranks.items():  # 0: the block program does not take it
        if rank:
            arg = block.insert_arg(TensorType(i32, [DYNAMIC] * rank), len(block.args))
            arg.name_hint = arg_name
            new_args[arg_name] = arg
    for positions, transforms in (("q_pos", analyzed.q.transforms), ("kv_pos", analyzed.k.transforms)):
        for rope in [t for t in transforms if isinstance(t, RopeOp)]:
            properties = {k: v for k, v in rope.properties.items() if k != "offset"}
            _replace(rope, RopeOp.build(operands=[rope.input, [new_args[positions]]],
                                        result_types=[rope.output.type], properties=properties))
    for mask in [op for op in block.ops if _is(op, "document")]:
        _replace(mask, MaskOp.build(operands=[mask.input, [new_args["q_doc"], new_args["kv_doc"]]],
                                    result_types=[mask.output.type], properties=dict(mask.properties),
                                    regions=[Region()]))
    for softmax in [op for op in block.ops if isinstance(op, SoftmaxOp)]:
        softmax.operands = [softmax.input]  # the wrapper adds the sinks once, after the merge
    if not keep_causal:
        for mask in [op for op in block.ops if _is(op, "causal")]:
            mask.output.replace_all_uses_with(mask.input)
            mask.detach()
            mask.erase()
    for index in sorted(dropped, reverse=True):
        block.erase_arg(block.args[index])
    function.update_function_type()
    module.verify()
    return str(module)


def _replace(old: Operation, new: Operation) -> None:
    old.parent_block().insert_op_before(new, old)  # type: ignore[union-attr]
    new.results[0].name_hint = old.results[0].name_hint
    old.results[0].replace_all_uses_with(new.results[0])
    old.detach()
    old.erase()


def split_for_ring(program: Program | ProgramBuilder | str | os.PathLike[str],
                   params: Mapping[str, object] | None = None) -> RingSplit:
    """The block programs of `program` (a built program, a builder, text or a path, with
    `params` for its placeholders); a `RingSplitError` for a program that cannot be split."""
    text = _read(program, params)
    _, function = _parse(text)
    name = function.sym_name.data
    analyzed = analyze(function)
    if analyzed.softmax is None:
        raise RingSplitError(f"attnfuse.distributed: @{name} is already lowered (attn.online_softmax); "
                             "pass the attn-level program")
    if (analyzed.q.arg_index, analyzed.k.arg_index, analyzed.v_arg) != (0, 1, 2):
        raise RingSplitError(f"attnfuse.distributed: @{name}: q, k, v must be the first three arguments")
    _check(name, function)
    for arg in function.args[3:]:
        if isinstance(arg.type, IntegerType):
            raise RingSplitError(f"attnfuse.distributed: @{name}: scalar argument '{arg.name_hint}' not supported")
    q_src = _source(name, "Q", [t for t in analyzed.q.transforms if isinstance(t, RopeOp)])
    kv_src = _source(name, "K", [t for t in analyzed.k.transforms if isinstance(t, RopeOp)])
    q_doc, kv_doc = _documents(name, function)
    dropped = {s.operand for s in (q_src, kv_src) if s is not None and s.operand is not None}
    sinks = analyzed.softmax.sinks
    if sinks is not None and not isinstance(sinks, BlockArgument):
        raise RingSplitError(f"attnfuse.distributed: @{name}: the sinks must be a function argument")
    sinks_index = None if sinks is None else sinks.index
    dropped |= {i for i in (q_doc, kv_doc, sinks_index) if i is not None}
    shape = RingSplit(name=name, diagonal=None, unmasked="",
                      operands=tuple(a.name_hint or f"arg{a.index}" for a in function.args[3:]),
                      passed=tuple(a.index for a in function.args[3:] if a.index not in dropped),
                      returns_lse=analyzed.lse_index is not None, q_positions=q_src, kv_positions=kv_src,
                      q_doc=q_doc, kv_doc=kv_doc, sinks=sinks_index)
    causal = any(_is(op, "causal") for op in function.body.block.ops)
    return replace(shape, unmasked=_variant(text, False, shape, dropped),
                   diagonal=_variant(text, True, shape, dropped) if causal else None)
