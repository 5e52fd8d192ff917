"""Small passes for the driver and pass-manager tests (``--pass-plugin`` this file).

They work on builtin/func/arith IR only, so the tests do not depend on the attn
dialect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import FunctionType, ModuleOp, StringAttr, UnitAttr, i32, i64
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from attnfuse.diagnostics import error_at


def _funcs(module: ModuleOp) -> list[func.FuncOp]:
    return [op for op in module.walk() if isinstance(op, func.FuncOp)]


@dataclass(frozen=True)
class TagFuncsPass(ModulePass):
    """Tag every func.func with a unit attribute."""

    name = "test-tag-funcs"
    tag: str = "tagged"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in _funcs(op):
            f.attributes[self.tag] = UnitAttr()


@dataclass(frozen=True)
class RequiresTagPass(ModulePass):
    """Check that test-tag-funcs ran (declares it as a prerequisite)."""

    name = "test-requires-tag"
    requires: ClassVar[tuple[str, ...]] = ("test-tag-funcs",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in _funcs(op):
            if "tagged" not in f.attributes:
                raise PassFailedException(f"@{f.sym_name.data} is not tagged")
            f.attributes["checked"] = UnitAttr()


@dataclass(frozen=True)
class UntagPass(ModulePass):
    """Remove the tags again (invalidates test-tag-funcs)."""

    name = "test-untag"
    invalidates: ClassVar[tuple[str, ...]] = ("test-tag-funcs",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in _funcs(op):
            f.attributes.pop("tagged", None)


@dataclass(frozen=True)
class BreakIRPass(ModulePass):
    """Make the IR invalid: retype function results, or insert a bad arith.addi."""

    name = "test-break-ir"
    mode: str = "retype"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in _funcs(op):
            if self.mode == "retype":
                inputs = f.function_type.inputs.data
                f.function_type = FunctionType.from_lists(inputs, [i64])
            else:
                lhs = arith.ConstantOp.from_int_and_width(1, i32)
                rhs = arith.ConstantOp.from_int_and_width(2, i64)
                bad = arith.AddiOp(lhs, rhs, result_type=i32)
                entry = f.body.blocks[0]
                Rewriter.insert_op([lhs, rhs, bad], InsertPoint.at_start(entry))


@dataclass(frozen=True)
class RejectPass(ModulePass):
    """Fail with a diagnostic located at the first arith.addi."""

    name = "test-reject"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for inner in op.walk():
            if isinstance(inner, arith.AddiOp):
                raise error_at(inner, "rejected by test-reject")


@dataclass(frozen=True)
class CrashPass(ModulePass):
    """Raise a plain Python exception (a simulated compiler bug)."""

    name = "test-crash"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        raise RuntimeError("boom")


@dataclass(frozen=True)
class CycleAPass(ModulePass):
    """Half of a prerequisite cycle."""

    name = "test-cycle-a"
    requires: ClassVar[tuple[str, ...]] = ("test-cycle-b",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pass


@dataclass(frozen=True)
class CycleBPass(ModulePass):
    """The other half of a prerequisite cycle."""

    name = "test-cycle-b"
    requires: ClassVar[tuple[str, ...]] = ("test-cycle-a",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pass


@dataclass(frozen=True)
class TargetPass(ModulePass):
    """Record the `target` and `seq_len` options that --device / --seq-len fill."""

    name = "test-target"
    target: str | None = None
    seq_len: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        op.attributes["test.target"] = StringAttr(self.target or "none")
        op.attributes["test.seq_len"] = StringAttr(str(self.seq_len))
