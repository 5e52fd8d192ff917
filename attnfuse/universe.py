"""The AttnFuse ``Universe``: what stock ``xdsl-opt`` sees once AttnFuse is installed.

Published through the ``xdsl.universe`` entry point in ``pyproject.toml``. Every entry
is a zero-argument factory, so nothing heavy (dialects, passes, the Triton backend) is
imported until it is used.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import Dialect
from xdsl.universe import Universe
from xdsl.utils.frontend import Frontend
from xdsl.utils.target import Target

from attnfuse.passes import get_all_passes

__all__ = [
    "ATTNFUSE_DIALECTS",
    "ATTNFUSE_FRONTENDS",
    "ATTNFUSE_TARGETS",
    "ATTNFUSE_UNIVERSE",
]


def _attn_dialect() -> Dialect:
    from attnfuse.dialects.attn import Attn

    return Attn


def _host_dialect() -> Dialect:
    from attnfuse.dialects.host import Host

    return Host


def _tile_dialect() -> Dialect:
    from attnfuse.dialects.tile import Tile

    return Tile


def _tile_hopper_dialect() -> Dialect:
    from attnfuse.dialects.tile_hopper import TileHopper

    return TileHopper


def _triton_target() -> type[Target]:
    from attnfuse.backends.triton.target import TritonTarget

    return TritonTarget


def _attn_frontend() -> type[Frontend]:
    from attnfuse.frontend import AttnFrontend

    return AttnFrontend


ATTNFUSE_DIALECTS: dict[str, Callable[[], Dialect]] = {
    "attn": _attn_dialect,
    "tile": _tile_dialect,
    "tile_hopper": _tile_hopper_dialect,
    "host": _host_dialect,
}
"""Dialect name -> factory."""

ATTNFUSE_TARGETS: dict[str, Callable[[], type[Target]]] = {"triton": _triton_target}
"""Output target name -> factory (``-t triton``)."""

ATTNFUSE_FRONTENDS: dict[str, Callable[[], type[Frontend]]] = {"attn": _attn_frontend}
"""Input file extension -> frontend factory."""

ATTNFUSE_UNIVERSE = Universe(
    all_dialects=dict(ATTNFUSE_DIALECTS),
    all_passes=get_all_passes(),
    all_targets=dict(ATTNFUSE_TARGETS),
    all_frontends=dict(ATTNFUSE_FRONTENDS),
)
