"""The pass listings of ``attnfuse-opt --help`` and ``attnfuse-opt --list-passes``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from attnfuse.passes import DEFAULT_PIPELINE, PASSES, PassFactory
from attnfuse.pass_manager import pass_summary

__all__ = ["ListPassesAction", "help_epilog"]


def _xdsl_pass_names() -> set[str]:
    from xdsl.transforms import get_all_passes

    return set(get_all_passes())


def help_epilog(passes: Mapping[str, PassFactory]) -> str:
    """AttnFuse's and plugin passes with their summaries, for ``--help``."""
    ours = [n for n in PASSES if n in passes]
    xdsl = _xdsl_pass_names()
    extra = sorted(n for n in passes if n not in PASSES and n not in xdsl)
    width = max((len(n) for n in [*ours, *extra]), default=10) + 2
    lines = ["AttnFuse passes:"]
    lines += [f"  {n:<{width}}{pass_summary(passes[n])}" for n in ours]
    if extra:
        lines += ["", "Plugin and user passes:"]
        lines += [f"  {n:<{width}}{pass_summary(passes[n])}" for n in extra]
    lines += [
        "",
        f"Default pipeline for -t triton: {DEFAULT_PIPELINE}",
        f"xDSL's {len(xdsl)} generic passes (canonicalize, cse, dce, ...) also work "
        "in -p; --list-passes shows them all.",
        "Docs: docs/driver.md (flags, pipeline syntax, diagnostics), "
        "docs/extending.md (writing passes).",
    ]
    return "\n".join(lines)


class ListPassesAction(argparse.Action):
    """``--list-passes``: print every pass with its one-line summary, then exit."""

    def __init__(
        self, *args: Any, passes: Mapping[str, PassFactory], **kwargs: Any
    ) -> None:
        super().__init__(*args, nargs=0, **kwargs)
        self.passes = passes

    def __call__(
        self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any
    ) -> None:
        passes = self.passes
        xdsl = _xdsl_pass_names()
        groups = {
            "AttnFuse": [n for n in PASSES if n in passes],
            "Plugin and user": sorted(
                n for n in passes if n not in PASSES and n not in xdsl
            ),
            "xDSL": sorted(n for n in passes if n in xdsl and n not in PASSES),
        }
        width = max(len(n) for n in passes) + 2
        for title, names in groups.items():
            if names:
                print(f"{title} passes:")
                for n in names:
                    print(f"  {n:<{width}}{pass_summary(passes[n])}".rstrip())
        parser.exit()
