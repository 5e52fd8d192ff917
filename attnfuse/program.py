"""The structure of an attention program, read off a `func.func` of attn ops.

Every pass after parsing needs the same view of a program: which function arguments are
Q, K and V, which transforms run on each side before `attn.scores`, the chain of score
ops, and how the probabilities become the output. `analyze` computes it once and says
clearly (with the offending op) when a function is not an attention program the
compiler can lower.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import BlockArgument, Operation, SSAValue

from attnfuse.dialects.attn import (
    SCORE_OPS,
    DropoutOp,
    OnlineSoftmaxOp,
    QKNormOp,
    RopeOp,
    ScoresOp,
    SoftmaxOp,
    WeightedSumOp,
)
from attnfuse.dialects.attn_types import qkv_shape
from attnfuse.diagnostics import OpError


class ProgramError(OpError):
    """A function that is not a lowerable attention program (located at `op`)."""


@dataclass
class Side:
    """One operand side of `attn.scores` (Q or K): its argument and its transforms."""

    arg_index: int
    transforms: list[RopeOp | QKNormOp] = field(default_factory=list)

    def placements(self) -> list[str]:
        return [t.str_option("placement") for t in self.transforms]


@dataclass
class AttentionProgram:
    """The parts of one attention function, in dataflow order."""

    func: func.FuncOp
    q: Side
    k: Side
    v_arg: int
    scores: ScoresOp
    score_ops: list[Operation]
    softmax: SoftmaxOp | None
    dropout: DropoutOp | None
    weighted_sum: WeightedSumOp | None
    online: OnlineSoftmaxOp | None
    output_index: int
    lse_index: int | None

    @property
    def heads(self) -> tuple[int, int, int]:
        """(query heads, kv heads, v heads)."""
        hq = qkv_shape(self.scores.q.type, "q")[1]
        hk = qkv_shape(self.scores.k.type, "k")[1]
        return hq, hk, qkv_shape(self.v_type, "v")[1]

    @property
    def v_type(self) -> TensorType:
        ty = self.func.args[self.v_arg].type
        assert isinstance(ty, TensorType)
        return ty

    def arg(self, value: SSAValue) -> int:
        """The function-argument index of an operand, or an error naming it."""
        if isinstance(value, BlockArgument) and value.owner is self.func.body.block:
            return value.index
        raise ProgramError(
            f"operand {value.name_hint or value} must be a function argument", _owner(value)
        )


def _owner(value: SSAValue) -> Operation | None:
    owner = value.owner
    return owner if isinstance(owner, Operation) else None


def _single_use(value: SSAValue, what: str) -> Operation:
    uses = list(value.uses)
    if len(uses) != 1:
        raise ProgramError(
            f"{what} must have exactly one use (fused attention computes it once), "
            f"found {len(uses)}",
            _owner(value),
        )
    return uses[0].operation


def _side(program_func: func.FuncOp, value: SSAValue, what: str) -> Side:
    transforms: list[RopeOp | QKNormOp] = []
    while not isinstance(value, BlockArgument):
        op = value.owner
        if not isinstance(op, (RopeOp, QKNormOp)):
            raise ProgramError(
                f"{what} of attn.scores must come from a function argument through "
                f"attn.rope / attn.qk_norm, found {getattr(op, 'name', op)}",
                op if isinstance(op, Operation) else None,
            )
        _single_use(value, f"result of {op.name}")
        transforms.append(op)
        value = op.input
    if value.owner is not program_func.body.block:
        raise ProgramError(f"{what} must be an argument of the attention function")
    transforms.reverse()
    return Side(value.index, transforms)


def find_functions(module: ModuleOp) -> list[func.FuncOp]:
    """The functions of a module that contain an `attn.scores` op."""
    return [
        op
        for op in module.ops
        if isinstance(op, func.FuncOp) and any(isinstance(o, ScoresOp) for o in op.walk())
    ]


def analyze(function: func.FuncOp) -> AttentionProgram:
    """Read the attention structure of `function` (see the module docstring)."""
    scores_ops = [op for op in function.walk() if isinstance(op, ScoresOp)]
    if len(scores_ops) != 1:
        raise ProgramError(
            f"@{function.sym_name.data} must contain exactly one attn.scores, found "
            f"{len(scores_ops)}",
            function,
        )
    scores = scores_ops[0]
    q = _side(function, scores.q, "q")
    k = _side(function, scores.k, "k")

    score_ops: list[Operation] = []
    value: SSAValue = scores.output
    user = _single_use(value, "attn.scores result")
    while isinstance(user, SCORE_OPS):
        score_ops.append(user)
        value = user.results[0]
        user = _single_use(value, f"result of {user.name}")

    softmax = dropout = weighted_sum = online = None
    if isinstance(user, OnlineSoftmaxOp):
        online = user
        out_value, lse_value, v_value = user.output, user.lse, user.v
    elif isinstance(user, SoftmaxOp):
        softmax = user
        lse_value = softmax.lse
        probs_user = _single_use(softmax.output, "attn.softmax probabilities")
        if isinstance(probs_user, DropoutOp):
            dropout = probs_user
            probs_user = _single_use(dropout.output, "attn.dropout result")
        if not isinstance(probs_user, WeightedSumOp):
            raise ProgramError(
                "attention probabilities must feed attn.weighted_sum (after an optional "
                f"attn.dropout), found {probs_user.name}",
                probs_user,
            )
        weighted_sum = probs_user
        out_value, v_value = weighted_sum.output, weighted_sum.v
    else:
        raise ProgramError(
            f"scores must flow through score ops into attn.softmax, found {user.name}", user
        )

    ret = function.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    returned = list(ret.arguments)
    if out_value not in returned:
        raise ProgramError("the attention output must be returned by the function", ret)
    lse_index = returned.index(lse_value) if lse_value is not None and lse_value in returned else None
    if len(returned) != 1 + (lse_index is not None):
        raise ProgramError("the function may return only the output and the lse", ret)

    program = AttentionProgram(
        func=function,
        q=q,
        k=k,
        v_arg=-1,
        scores=scores,
        score_ops=score_ops,
        softmax=softmax,
        dropout=dropout,
        weighted_sum=weighted_sum,
        online=online,
        output_index=returned.index(out_value),
        lse_index=lse_index,
    )
    program.v_arg = program.arg(v_value)
    for op in program.k.transforms:
        if isinstance(op, RopeOp) and op.bottom_right():
            raise ProgramError(
                'attn.rope align = "bottom_right" places queries at the end of the keys: it applies '
                "to Q's rope, not K's", op)
    return program


def symbolic_shapes(program: AttentionProgram) -> dict[int, tuple[str | int, ...]]:
    """The expected shape of each tensor argument, with `B`, `Sq`, `Skv` for dims that
    must equal q's batch, q's length or k's length (`1` stays a broadcast dim); with a
    paged KV cache `pages` (k's page count) and `max_pages` (the block table's width).

    Lets a caller check the dynamic dims of extra operands (position ids, document ids,
    bias tensors, prefix lengths) before a kernel reads them out of bounds.
    """
    from attnfuse.dialects.attn import BiasOp, MaskOp

    def dims(value: SSAValue) -> tuple[int, ...]:
        assert isinstance(value.type, TensorType)
        return tuple(value.type.get_shape())

    def resolve(static: tuple[int, ...], symbols: tuple[str | int, ...]) -> tuple[str | int, ...]:
        return tuple(s if d < 0 else d for d, s in zip(static, symbols))

    shapes: dict[int, tuple[str | int, ...]] = {}
    fn_args = program.func.args
    scores = program.scores
    paged = scores.block_table is not None and scores.kv_lens is not None
    for index, seq in ((program.q.arg_index, "Sq"), (program.k.arg_index, "Skv"), (program.v_arg, "Skv")):
        shape = dims(fn_args[index])
        pool = paged and index != program.q.arg_index  # [pages, heads, page_size, head_dim]
        shapes[index] = resolve(shape, ("pages" if pool else "B", shape[1], seq, shape[3]))
    for table, symbols in ((scores.block_table, ("B", "max_pages")), (scores.kv_lens, ("B",))):
        if isinstance(table, BlockArgument):
            shapes[table.index] = symbols
    head_dim = dims(fn_args[program.q.arg_index])[3]
    heads = dims(fn_args[program.q.arg_index])[1]
    for side, seq in ((program.q, "Sq"), (program.k, "Skv")):
        for op in side.transforms:
            weight = getattr(op, "weight", None)
            if weight is not None and isinstance(weight, BlockArgument):
                shapes[weight.index] = (head_dim,)
            positions = getattr(op, "positions", None)
            if positions is not None and isinstance(positions, BlockArgument):
                shape = dims(positions)
                shapes[positions.index] = resolve(shape, ("B", seq)[-len(shape):] if len(shape) == 2 else (seq,))
    sinks = program.online.sinks if program.online is not None else (
        program.softmax.sinks if program.softmax is not None else None)
    if sinks is not None and isinstance(sinks, BlockArgument):
        shapes[sinks.index] = (heads,)
    for op in program.score_ops:
        if isinstance(op, BiasOp) and op.slopes is not None and isinstance(op.slopes, BlockArgument):
            shapes[op.slopes.index] = (heads,)
        if isinstance(op, BiasOp) and op.kind_name == "tensor" and isinstance(op.bias[0], BlockArgument):
            shape = dims(op.bias[0])
            shapes[op.bias[0].index] = resolve(shape, ("B", shape[1], "Sq", "Skv"))
        elif isinstance(op, MaskOp) and op.kind_name == "document":
            seqs = ("Sq", "Skv") if len(op.args) == 2 else ("Sq",)
            for arg, seq in zip(op.args, seqs):
                if isinstance(arg, BlockArgument):
                    shapes[arg.index] = resolve(dims(arg), ("B", seq))
        elif isinstance(op, MaskOp) and op.kind_name == "prefix_lm" and op.args:
            arg = op.args[0]
            if isinstance(arg, BlockArgument):
                shapes[arg.index] = resolve(dims(arg), ("B",))
    return shapes


def shared_length_operand(program: AttentionProgram) -> int | None:
    """The argument index of an operand that serves both queries and keys (one
    document-ids operand, or one position-ids operand read by both Q's and K's RoPE),
    which therefore needs q and k of the same length; None when there is none."""
    from attnfuse.dialects.attn import MaskOp

    for op in program.score_ops:
        if isinstance(op, MaskOp) and op.kind_name == "document" and len(op.args) == 1:
            if isinstance(op.args[0], BlockArgument):
                return op.args[0].index
    q_pos = [getattr(t, "positions", None) for t in program.q.transforms]
    for t in program.k.transforms:
        positions = getattr(t, "positions", None)
        if positions is not None and positions in q_pos and isinstance(positions, BlockArgument):
            return positions.index
    return None
