"""The command-line options ``attnfuse-opt`` adds to ``xdsl-opt``'s.

`add_arguments` declares them on the parser `AttnfuseOptMain.register_all_arguments`
builds (after xDSL's own) and shortens xDSL's help of ``-p``; docs/driver.md describes
each option.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from attnfuse import examples
from attnfuse.cost.target import known_targets
from attnfuse.pass_listing import ListPassesAction, help_epilog
from attnfuse.passes import PassFactory

__all__ = ["PROG", "add_arguments"]

PROG = "attnfuse-opt"


def add_arguments(
    arg_parser: argparse.ArgumentParser, available_passes: Mapping[str, PassFactory], *, with_pass_help: bool
) -> None:
    """Declare AttnFuse's options on `arg_parser`; `with_pass_help` (``--help`` was asked
    for) lists every pass in the help's epilog, which imports the pass modules."""
    arg_parser.prog = PROG
    arg_parser.set_defaults(passes=None)
    for action in arg_parser._actions:  # noqa: SLF001 (shorten xDSL's huge help)
        if action.dest == "passes":
            action.help = (
                "pass pipeline, e.g. 'attn-canonicalize,rope-fusion{strategy=auto}' "
                "(passes are listed below; default with -t triton: the default "
                "pipeline)"
            )
    arg_parser.add_argument(
        "--print-ir-after-all",
        action="store_true",
        help="print the IR to stderr after every pass, headed "
        "'// -----// IR Dump After <pass> //----- //'",
    )
    arg_parser.add_argument(
        "--example",
        metavar="NAME",
        help="read a shipped example program instead of an input file: "
        f"{', '.join(examples.names())} (attnfuse.examples)",
    )
    arg_parser.add_argument(
        "--device",
        "--gpu",
        metavar="NAME",
        help="GPU the cost model plans for (" + ", ".join(known_targets()) + ", or a profile "
        "written by attnfuse-calibrate, FILE.json); "
        "fills the unset 'target' option of passes (rope-fusion{strategy=auto})",
    )
    arg_parser.add_argument(
        "--seq-len",
        type=int,
        default=0,
        metavar="N",
        help="sequence length the cost model plans for (default: the program's "
        "static S, else 4096); fills the unset 'seq-len' option of passes",
    )
    arg_parser.add_argument(
        "--f32-dot",
        default="",
        choices=("ieee", "tf32x3", "tf32"),
        help="precision of the dots of f32 programs (default tf32x3: three TF32 "
        "tensor-core products, about fp32 accuracy; ieee: FMA units); fills the "
        "unset 'f32-dot' option of passes",
    )
    arg_parser.add_argument(
        "--batch",
        type=int,
        default=0,
        metavar="N",
        help="batch for --cost-report (default: 16384 tokens / S)",
    )
    arg_parser.add_argument(
        "--cost-report",
        action="store_true",
        help="print each RoPE placement's predicted time on --device, the choice "
        "and the crossover, instead of running the pipeline (no GPU needed)",
    )
    arg_parser.add_argument(
        "--pass-plugin",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="load passes from a .py file or Python module (repeatable); every "
        "ModulePass it defines becomes usable in -p",
    )
    arg_parser.add_argument(
        "--list-passes",
        action=ListPassesAction,
        passes=available_passes,
        help="list every available pass (AttnFuse, plugins and xDSL) and exit",
    )
    if with_pass_help:  # imports pass modules for their docstrings: help only
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        arg_parser.epilog = help_epilog(available_passes)
