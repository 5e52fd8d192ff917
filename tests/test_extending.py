"""The user-pass example from docs/extending.md (examples/passes/drop_dropout.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

import attnfuse.passes as registry
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.dialects.attn import DropoutOp, OnlineSoftmaxOp, WeightedSumOp
from attnfuse.driver import AttnfuseOptMain
from attnfuse.pass_manager import (
    PassManager,
    available_passes,
    load_pass_plugin,
    make_context,
    register_pass,
    unregister_pass,
)

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "passes" / "drop_dropout.py"
PROGRAM = ROOT / "examples" / "dropout.attn"
DOC = ROOT / "docs" / "extending.md"


@pytest.fixture
def drop_dropout() -> Iterator[type[ModulePass]]:
    """The example pass class, registered for one test."""
    assert load_pass_plugin(EXAMPLE) == ["drop-dropout"]
    yield available_passes()["drop-dropout"]()
    unregister_pass("drop-dropout")


def parse_program() -> ModuleOp:
    module, _ = parse_module_with_locations(
        make_context(), PROGRAM.read_text(), str(PROGRAM)
    )
    return module


def ops_of(module: ModuleOp, cls: type) -> list:
    return [op for op in module.walk() if isinstance(op, cls)]


def test_drop_dropout_removes_dropout(drop_dropout: type[ModulePass]) -> None:
    module = parse_program()
    assert len(ops_of(module, DropoutOp)) == 1
    PassManager("drop-dropout").run(module, make_context())
    assert ops_of(module, DropoutOp) == []
    (ws,) = ops_of(module, WeightedSumOp)
    assert ws.probs.owner.name == "attn.softmax"  # now reads the softmax directly
    module.verify()


def test_drop_dropout_before_online_softmax(drop_dropout: type[ModulePass]) -> None:
    module = parse_program()
    PassManager("drop-dropout,online-softmax").run(module, make_context())
    (online,) = ops_of(module, OnlineSoftmaxOp)
    assert "dropout_p" not in online.properties

    module = parse_program()  # without it, the dropout is folded into the kernel
    PassManager("online-softmax").run(module, make_context())
    (online,) = ops_of(module, OnlineSoftmaxOp)
    assert "dropout_p" in online.properties


def test_registered_by_python_call(drop_dropout: type[ModulePass]) -> None:
    unregister_pass("drop-dropout")
    register_pass(drop_dropout)
    assert PassManager("drop-dropout").passes[0].name == "drop-dropout"


def test_registered_by_entry_point(
    drop_dropout: type[ModulePass], monkeypatch: pytest.MonkeyPatch
) -> None:
    unregister_pass("drop-dropout")
    ep = EntryPoint(
        "drop-dropout",
        f"{drop_dropout.__module__}:DropDropoutPass",
        registry.ENTRY_POINT_GROUP,
    )
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep])
    assert PassManager("drop-dropout").passes[0].__class__ is drop_dropout


def test_driver_with_pass_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        AttnfuseOptMain(
            args=[str(PROGRAM), "--pass-plugin", str(EXAMPLE), "-p", "drop-dropout"]
        ).run()
    finally:
        unregister_pass("drop-dropout")
    out = capsys.readouterr().out
    assert "attn.weighted_sum %p, %v" in out and "attn.dropout" not in out


def test_docs_show_the_real_example() -> None:
    """Every line of the pass shown in docs/extending.md is in the tested file."""
    doc = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    example = EXAMPLE.read_text()
    shown = next(b for b in blocks if "class DropDropoutPass" in b)
    for line in shown.splitlines():
        assert line in example.splitlines(), f"docs/extending.md drifted: {line!r}"
