"""Structured control flow for `TileBuilder`: `scf.for` loops that carry values and
`scf.if` branches, used as context managers.

```python
with b.for_(0, n, 64, inits=[m_i, l_i]) as loop:
    m, l = loop.carried
    loop.yield_(m_new, l_new)
m_i, l_i = loop.results
```
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from xdsl.builder import InsertPoint
from xdsl.dialects import scf
from xdsl.dialects.builtin import UnitAttr, i1
from xdsl.ir import Attribute, Block, Region, SSAValue

from attnfuse.dialects.tile import FLATTEN
from attnfuse.dialects.tile_types import is_int_type

if TYPE_CHECKING:
    from attnfuse.dialects.tile_builder import TileBuilder, Value


class ForLoop:
    """Handle of an `scf.for` under construction (see `TileBuilder.for_`)."""

    def __init__(self, builder: TileBuilder, op: scf.ForOp):
        self._builder = builder
        self.op = op
        self.yielded = False

    @property
    def iv(self) -> SSAValue:
        """The induction variable."""
        return self.op.body.block.args[0]

    @property
    def carried(self) -> tuple[SSAValue, ...]:
        """The loop-carried values inside the body (one per init)."""
        return tuple(self.op.body.block.args[1:])

    @property
    def results(self) -> tuple[SSAValue, ...]:
        """The carried values after the last iteration."""
        return tuple(self.op.results)

    def yield_(self, *values: Value) -> None:
        """End the body, passing `values` to the next iteration (coerced to the
        carried types: literals become constants, shapes broadcast)."""
        if self.yielded:
            raise ValueError("loop body already yielded")
        if len(values) != len(self.carried):
            raise ValueError(
                f"yield_ expects {len(self.carried)} values, got {len(values)}"
            )
        coerced = [
            self._builder.coerce(v, c.type) for v, c in zip(values, self.carried)
        ]
        self._builder.insert(scf.YieldOp(*coerced))
        self.yielded = True


class IfBranches:
    """Handle of an `scf.if` under construction (see `TileBuilder.if_`)."""

    def __init__(self, builder: TileBuilder, op: scf.IfOp):
        self._builder = builder
        self.op = op

    @property
    def results(self) -> tuple[SSAValue, ...]:
        return tuple(self.op.results)

    @contextmanager
    def then_(self) -> Iterator[None]:
        """Build the then-branch; end it with `yield_` when the `if` has results."""
        with self._branch(self.op.true_region):
            yield

    @contextmanager
    def else_(self) -> Iterator[None]:
        """Build the else-branch (required when the `if` has results)."""
        with self._branch(self.op.false_region):
            yield

    def yield_(self, *values: Value) -> None:
        types = [r.type for r in self.op.results]
        if len(values) != len(types):
            raise ValueError(f"yield_ expects {len(types)} values, got {len(values)}")
        self._builder.insert(
            scf.YieldOp(*(self._builder.coerce(v, t) for v, t in zip(values, types)))
        )

    @contextmanager
    def _branch(self, region: Region) -> Iterator[None]:
        if region.blocks:
            raise ValueError("branch already built")
        block = Block()
        region.add_block(block)
        with self._builder.at(InsertPoint.at_end(block)):
            yield
        if not isinstance(block.last_op, scf.YieldOp):
            if self.op.results:
                raise ValueError("a branch of an scf.if with results must call yield_")
            self._builder.insert(scf.YieldOp(), InsertPoint.at_end(block))


class ControlFlow:
    """The control-flow methods of `TileBuilder`."""

    @contextmanager
    def for_(
        self: TileBuilder,
        lower: Value,
        upper: Value,
        step: Value,
        inits: Sequence[SSAValue] = (),
        *,
        iv_name: str = "i",
        names: Sequence[str] | None = None,
        flatten: bool = False,
    ) -> Iterator[ForLoop]:
        """`scf.for` over [lower, upper) by `step` (integers, widened to a common
        type; literals are i32) carrying `inits`; `flatten` marks it `tile.flatten`
        (`FLATTEN`: one loop with the loops nested in it, pipelined across them). Use as

        ```python
        with b.for_(0, n, 64, inits=[m_i, l_i]) as loop:
            m, l = loop.carried
            ...
            loop.yield_(m_new, l_new)
        m_i, l_i = loop.results
        ```

        Carried values keep the names of their inits unless `names` is given."""
        lb, ub, st = self._unify(lower, upper, step)
        if not is_int_type(lb.type):
            raise TypeError(f"loop bounds must be integers, got {lb.type}")
        body = Block(arg_types=[lb.type, *(v.type for v in inits)])
        op = scf.ForOp(lb, ub, st, list(inits), body)
        if flatten:
            op.attributes[FLATTEN] = UnitAttr()
        self.insert(op)
        body.args[0].name_hint = SSAValue.extract_valid_name(iv_name)
        hints = names if names is not None else [v.name_hint for v in inits]
        for arg, res, hint in zip(body.args[1:], op.results, hints):
            arg.name_hint = res.name_hint = hint and SSAValue.extract_valid_name(hint)
        loop = ForLoop(self, op)
        with self.at(InsertPoint.at_end(body)):
            yield loop
        if not loop.yielded:
            if inits:
                raise ValueError("a loop with carried values must call loop.yield_")
            self.insert(scf.YieldOp(), InsertPoint.at_end(body))

    def if_(self: TileBuilder, cond: SSAValue, result_types: Sequence[Attribute] = ()) -> IfBranches:
        """`scf.if` on a scalar i1. Use as

        ```python
        br = b.if_(c, [f32])
        with br.then_():
            br.yield_(x)
        with br.else_():
            br.yield_(y)
        (r,) = br.results
        ```"""
        if cond.type != i1:
            raise TypeError(f"if_ needs a scalar i1 condition, got {cond.type}")
        op = scf.IfOp(cond, list(result_types), Region(), Region())
        self.insert(op)
        return IfBranches(self, op)


__all__ = ["ControlFlow", "ForLoop", "IfBranches"]
