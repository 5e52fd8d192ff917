"""IR checks that xDSL 0.75's verifier does not make.

* **Dominance**: every operand must be defined before its use, as in MLIR: earlier in
  the same block, in a block that dominates the use's block, or in a region that
  encloses the use. xDSL's parser accepts forward references and its verifier never
  checks them, so ``%b = f(%a)`` before ``%a = ...`` would otherwise compile. The
  block-level relation is xDSL's :class:`~xdsl.irdl.dominance.DominanceInfo`; this
  module adds the value-level rules on top (order inside a block, nested regions,
  unreachable blocks, the module's graph region). Unlike MLIR, ``DominanceInfo`` also
  counts unreachable predecessors, which can only make the check stricter for a value
  defined in a non-entry block and used in a block that an unreachable block jumps to.
* **Symbol redefinition**: xDSL reports it on the symbol table op (often the implicit
  module, which has no location); :func:`first_redefined_symbol` names the second
  definition, so the error can point at it.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Block, BlockArgument, Operation, OpResult, Region, SSAValue
from xdsl.irdl.dominance import DominanceInfo
from xdsl.traits import SymbolTable

__all__ = [
    "DominanceChecker",
    "Violation",
    "first_dominance_violation",
    "first_redefined_symbol",
]


class DominanceChecker:
    """Answers "is this value available at this op?", caching per region and block."""

    def __init__(self) -> None:
        self._dominance: dict[Region, DominanceInfo] = {}
        self._reachable: dict[Region, set[Block]] = {}
        self._order: dict[Block, dict[Operation, int]] = {}

    def _index(self, op: Operation) -> int:
        block = op.parent_block()
        assert block is not None
        if (order := self._order.get(block)) is None:
            order = {o: i for i, o in enumerate(block.ops)}
            self._order[block] = order
        return order[op]

    def _is_reachable(self, block: Block, region: Region) -> bool:
        if (reachable := self._reachable.get(region)) is None:
            reachable = set[Block]()
            todo = [region.blocks.first] if region.blocks.first else []
            while todo:
                b = todo.pop()
                if b not in reachable:
                    reachable.add(b)
                    todo.extend(b.last_op.successors if b.last_op else ())
            self._reachable[region] = reachable
        return block in reachable

    def dominates(self, value: SSAValue, user: Operation) -> bool:
        """Whether ``value`` is defined before ``user`` on every path to it."""
        if isinstance(value, OpResult):
            def_op: Operation | None = value.op
            def_block = value.op.parent_block()
        elif isinstance(value, BlockArgument):
            def_op, def_block = None, value.block
        else:
            return True  # not part of the IR structure (an xDSL test value)
        region = def_block.parent if def_block is not None else None
        if region is None:
            return False  # defined by an op outside any block: never available
        ancestor: Operation | None = user
        while ancestor is not None and ancestor.parent_region() is not region:
            ancestor = ancestor.parent_op()
        if ancestor is None:
            return False  # defined in a region that does not enclose the use
        use_block = ancestor.parent_block()
        assert use_block is not None
        if isinstance(region.parent, ModuleOp):
            return True  # a graph region: no order among the module's ops
        if use_block is def_block:
            if def_op is None:
                return True
            return def_op is not ancestor and self._index(def_op) < self._index(
                ancestor
            )
        if not self._is_reachable(use_block, region):
            return True  # MLIR: anything dominates an unreachable block
        if def_block is region.blocks.first:
            return True  # the entry block dominates every reachable block
        if (info := self._dominance.get(region)) is None:
            info = self._dominance[region] = DominanceInfo(region)
        return info.dominates(def_block, use_block)


@dataclass(frozen=True)
class Violation:
    """An op that breaks a rule, and a related op (where the operand or symbol is)."""

    op: Operation
    message: str
    related: Operation | None = None
    related_message: str = ""


def first_dominance_violation(root: Operation) -> Violation | None:
    """The first op (in text order) using a value it is not dominated by."""
    checker = DominanceChecker()
    for op in root.walk():
        for index, operand in enumerate(op.operands):
            if checker.dominates(operand, op):
                continue
            name = f" (%{operand.name_hint})" if operand.name_hint else ""
            message = f"'{op.name}' op operand #{index}{name} does not dominate this use"
            if isinstance(operand, OpResult):
                return Violation(op, message, operand.op, "operand defined here")
            return Violation(op, message)
    return None


def _symbol_name(op: Operation) -> str | None:
    name = op.properties.get("sym_name") or op.attributes.get("sym_name")
    return name.data if isinstance(name, StringAttr) else None


def first_redefined_symbol(root: Operation) -> Violation | None:
    """The first redefinition of a name in any symbol table."""
    for op in root.walk():
        if not op.has_trait(SymbolTable):
            continue
        seen: dict[str, Operation] = {}
        for region in op.regions:
            for block in region.blocks:
                for child in block.ops:
                    if (name := _symbol_name(child)) is None:
                        continue
                    if name in seen:
                        message = f"'{child.name}' op redefinition of symbol named '{name}'"
                        earlier = "see existing symbol definition here"
                        return Violation(child, message, seen[name], earlier)
                    seen[name] = child
    return None
