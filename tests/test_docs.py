"""docs/dialect.md matches the code.

* every ```mlir block is a complete `func.func` program that parses, verifies and runs on
  the reference interpreter;
* every op of the dialect has a section, and every option of every op appears in that
  section's table with its default and choices;
* every error message the page quotes is one the dialect really prints (it is checked in
  `tests/filecheck/dialects/attn_invalid.mlir`);
* the list of ops allowed in regions is the reference interpreter's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from xdsl.dialects.builtin import IntegerType, ModuleOp, TensorType
from xdsl.dialects.func import FuncOp
from xdsl.parser import Parser

from attnfuse.dialects.attn import Attn
from attnfuse.dialects.attn_syntax import AttnSyntaxOp
from attnfuse.dialects.attn_types import (
    DYNAMIC,
    ProbsType,
    ScoresType,
    format_option_value,
)
from attnfuse.pass_manager import make_context
from attnfuse.reference import regions, run

REPO = Path(__file__).resolve().parent.parent
DOC = (REPO / "docs" / "dialect.md").read_text()
INVALID = (REPO / "tests" / "filecheck" / "dialects" / "attn_invalid.mlir").read_text()

MLIR_BLOCKS = re.findall(r"```mlir\n(.*?)```", DOC, re.DOTALL)


def _program_name(index: int, block: str) -> str:
    found = re.search(r"func\.func @(\w+)", block)
    return found.group(1) if found else f"block{index}"


PROGRAMS: dict[str, str] = {_program_name(i, b): b for i, b in enumerate(MLIR_BLOCKS)}


def parse(text: str) -> ModuleOp:
    module = Parser(make_context(), text, "docs/dialect.md").parse_module()
    module.verify()
    return module


def section(op_name: str) -> str:
    """The text of `## attn.<op>` up to the next `## ` heading."""
    match = re.search(
        rf"^## {re.escape(op_name)}\n(.*?)(?=^## |\Z)", DOC, re.DOTALL | re.MULTILINE
    )
    assert match, f"docs/dialect.md has no section '## {op_name}'"
    return match.group(1)


def test_there_are_examples() -> None:
    assert len(MLIR_BLOCKS) >= 12
    assert len(PROGRAMS) == len(MLIR_BLOCKS), "two doc examples share a function name"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_example_parses_and_verifies(name: str) -> None:
    block = PROGRAMS[name]
    assert block.lstrip().startswith("func.func @"), (
        f"```mlir block {name} is not a complete func.func (use ```text for fragments)"
    )
    module = parse(block)
    assert str(parse(str(module))) == str(module)


def _argument(
    name: str, ty: object, rng: torch.Generator, batch: int, seq: int
) -> object:
    """A random call argument for a func argument type.

    Dynamic dims are `batch` in front of rank >= 2 tensors and for `[B]` prefix lengths
    (named `prefix...`), `seq` otherwise; cu_seqlens (named `cu_seqlens...`) cut `seq`
    tokens into three sequences; a paged cache's `kv_lens` are `seq` keys per sequence
    and its `block_table` names pages of a pool of `batch` pages.
    """
    if isinstance(ty, IntegerType):
        return 1234
    if name.startswith("cu_seqlens"):
        return torch.tensor([0, 1, seq // 2, seq], dtype=torch.int32)
    if name == "kv_lens":
        return torch.full((batch,), seq, dtype=torch.int32)
    if name == "block_table":
        return torch.randint(0, batch, (batch, seq), generator=rng, dtype=torch.int32)
    if isinstance(ty, (ScoresType, ProbsType)):
        shape = [
            batch if i == 0 else (seq if d == DYNAMIC else d)
            for i, d in enumerate(ty.dims)
        ]
        data = torch.rand(shape, dtype=torch.float64, generator=rng)
        return data / data.sum(-1, keepdim=True) if isinstance(ty, ProbsType) else data
    assert isinstance(ty, TensorType)
    dims = list(ty.get_shape())
    leading_batch = len(dims) > 1 or name.startswith("prefix")
    shape = [
        (batch if i == 0 and leading_batch else seq) if d == DYNAMIC else d
        for i, d in enumerate(dims)
    ]
    if isinstance(ty.element_type, IntegerType):
        # ids, positions, prefix lengths, chunk sizes: small positive integers
        return torch.randint(1, 4, shape, generator=rng, dtype=torch.int64)
    return torch.randn(shape, dtype=torch.float64, generator=rng)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_example_runs_on_the_reference(name: str) -> None:
    module = parse(PROGRAMS[name])
    fn = next(op for op in module.walk() if isinstance(op, FuncOp))
    rng = torch.Generator().manual_seed(0)
    args = [_argument(a.name_hint or "", a.type, rng, batch=2, seq=6) for a in fn.args]
    out = run(PROGRAMS[name], *args)
    results = out if isinstance(out, tuple) else (out,)
    assert len(results) == len(fn.function_type.outputs.data)
    for r in results:
        assert isinstance(r, torch.Tensor) and not torch.isnan(r).any()


def _syntax_ops() -> list[type[AttnSyntaxOp]]:
    return [op for op in Attn.operations if issubclass(op, AttnSyntaxOp)]


INTERNAL_OPS = {"attn.online_softmax"}
"""Ops produced by passes, documented briefly (not written by users)."""


def test_every_op_has_a_section() -> None:
    names = {op.name for op in Attn.operations}
    assert {"attn.rope", "attn.yield", "attn.weighted_sum"} <= names
    for name in names:
        body = section(name)
        if name not in INTERNAL_OPS:
            assert "**Errors.**" in body, f"{name}: no common errors listed"


@pytest.mark.parametrize(
    "op",
    [op for op in _syntax_ops() if op.name not in INTERNAL_OPS],
    ids=lambda op: op.name,
)
def test_every_option_is_documented(op: type[AttnSyntaxOp]) -> None:
    body = section(op.name)
    for option in op.OPTIONS:
        row = re.search(rf"^\| `{option.name}` \|.*$", body, re.MULTILINE)
        assert row, f"{op.name}: option '{option.name}' is not in the options table"
        text = row.group(0)
        if option.default is not None:
            shown = format_option_value(option.default)
            assert shown in text or repr(option.default) in text, (
                f"{op.name}.{option.name}: default {shown} not shown in: {text}"
            )
        for choice in option.choices:
            assert f'"{choice}"' in text, (
                f"{op.name}.{option.name}: choice {choice} missing"
            )
    for kind in op.KINDS:
        assert re.search(rf"attn\.\w+ {kind}\b", body), (
            f"{op.name}: kind {kind} has no syntax line"
        )


QUOTED_ERRORS = re.findall(r"`error: ([^`]+)`", DOC)


def test_quoted_errors_exist() -> None:
    assert len(QUOTED_ERRORS) >= 40
    checked = INVALID.replace("// CHECK:", "").replace("// CHECK-NEXT:", "")
    missing = [e for e in QUOTED_ERRORS if f"error: {e}" not in checked]
    assert not missing, (
        "quoted in docs/dialect.md but not checked in attn_invalid.mlir:\n"
        + "\n".join(missing)
    )


def test_region_op_list_matches_the_reference() -> None:
    body = section("attn.score_mod")
    listed = re.search(r"The ops allowed in .*?are:\n\n(.*?)\n\n", body, re.DOTALL)
    assert listed
    documented = re.findall(r"`([a-z]+\.[a-z_0-9]+)`", listed.group(1))
    assert documented == regions.supported_ops()
