"""The ``.attn`` input frontend.

An ``.attn`` file is MLIR text (``func.func`` of ``attn.*`` ops, plus builtin, arith,
math, scf, tensor and tile). The frontend parses it with the location-recording parser
from :mod:`attnfuse.diagnostics`, so verifier errors can be reported at
``file:line:col`` of the offending op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.frontend import Frontend

from attnfuse.diagnostics import parse_module_with_locations

__all__ = ["AttnFrontend"]


@dataclass(frozen=True)
class AttnFrontend(Frontend):
    """Parse ``.attn`` (MLIR syntax) input, recording each op's source location."""

    name = "attn"

    no_implicit_module: bool = False
    """Require an explicit top-level ``builtin.module``."""

    def parse(
        self, ctx: Context, input: IO[bytes], input_name: str = "<input>"
    ) -> ModuleOp:
        module, _ = parse_module_with_locations(
            ctx,
            input.read(),
            input_name,
            allow_implicit_module=not self.no_implicit_module,
        )
        return module
