"""The `triton` output target: `attnfuse-opt x.mlir -t triton`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from attnfuse.backends.gluon.emitter import emit_gluon
from attnfuse.backends.triton.emitter import emit_module


@dataclass(frozen=True)
class TritonTarget(Target):
    """
    Prints one Python module with the Triton source of every `tile.kernel` in the
    input, each preceded by a comment with its launch metadata (name, num_warps,
    num_stages, the `launch` dictionary, the argument signature), then the Gluon
    kernels of `tile_hopper` ops (the Hopper forward schedule), as the runtime loads it.
    """

    name = "triton"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(emit_module(module) + emit_gluon(module))
