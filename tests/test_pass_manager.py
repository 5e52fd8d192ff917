"""Tests for the pass registry and the pass manager (attnfuse.passes, .pass_manager)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import ClassVar

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass

import attnfuse.passes as registry
from attnfuse.diagnostics import VerificationError, parse_module_with_locations
from attnfuse.pass_manager import (
    MissingPrerequisiteError,
    PassCrashError,
    PassDependencyCycleError,
    PassFailedError,
    PassManager,
    PipelineError,
    UnknownPassError,
    available_passes,
    load_pass_plugin,
    make_context,
    register_pass,
    unregister_pass,
)
from attnfuse.passes import (
    BSHD_PIPELINE,
    DEFAULT_PIPELINE,
    PASSES,
    PassPluginError,
    PassUnavailableError,
    default_pipeline,
    resolve_pass,
)

PLUGIN = Path(__file__).parent / "filecheck" / "driver" / "Inputs" / "plugin_passes.py"

PROGRAM = """\
func.func @f(%a: i32) -> i32 {
  %c = arith.addi %a, %a : i32
  func.return %c : i32
}
"""


@pytest.fixture
def plugin() -> Iterator[list[str]]:
    """The test passes, registered for one test and unregistered after it."""
    names = load_pass_plugin(PLUGIN)
    yield names
    for name in names:
        unregister_pass(name)


def parse(text: str = PROGRAM) -> tuple[Context, ModuleOp]:
    ctx = make_context()
    module, _ = parse_module_with_locations(ctx, text, "prog.mlir")
    return ctx, module


def funcs_attrs(module: ModuleOp) -> set[str]:
    return {
        name for op in module.walk() if op.name == "func.func" for name in op.attributes
    }


# ----------------------------------------------------------------------- registry


def test_builtin_registry_follows_naming_convention() -> None:
    for name, target in PASSES.items():
        assert target.split(":")[0] == "attnfuse.passes." + name.replace("-", "_")
    pipeline_names = [p.split("{")[0] for p in DEFAULT_PIPELINE.split(",")]
    assert set(pipeline_names) <= set(PASSES)


def test_default_pipeline_variants() -> None:
    """`default_pipeline` sets a pass's options or leaves passes out, keeps the order,
    parses back into the same passes, and rejects names the pipeline does not have."""
    assert default_pipeline() == DEFAULT_PIPELINE
    fused = default_pipeline({"rope-fusion": "strategy=fused", "lower-backward": "grad-layout=sbhd block-m=64"},
                             without=["split-kv"])
    assert fused == ("attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling,"
                     "lower-backward{grad-layout=sbhd block-m=64},lower-to-tile")
    passes = PassManager(fused).passes
    assert [p.name for p in passes] == [p.split("{")[0] for p in fused.split(",")]
    assert [p for p in passes if p.name == "lower-backward"][0].block_m == 64
    assert BSHD_PIPELINE.endswith("lower-backward{grad-layout=bshd},lower-to-tile{out-layout=bshd}")
    with pytest.raises(ValueError, match="rope-fuson not in the default pipeline"):
        default_pipeline({"rope-fuson": "strategy=fused"})
    with pytest.raises(ValueError, match="lower-backwards not in the default pipeline"):
        default_pipeline(without=["lower-backwards"])


def test_resolve_pass_forms() -> None:
    cls = resolve_pass("online-softmax", "attnfuse.passes.online_softmax")
    assert cls.name == "online-softmax"
    assert (
        resolve_pass(
            "online-softmax", "attnfuse.passes.online_softmax:OnlineSoftmaxPass"
        )
        is cls
    )
    with pytest.raises(
        PassUnavailableError, match="module 'attnfuse.passes.nope' does not exist"
    ):
        resolve_pass("nope", "attnfuse.passes.nope")
    with pytest.raises(
        PassUnavailableError, match="defines no ModulePass named 'other'"
    ):
        resolve_pass("other", "attnfuse.passes.online_softmax")
    with pytest.raises(PassUnavailableError, match="not a ModulePass subclass"):
        resolve_pass("x", "attnfuse.passes:PASSES")


def test_available_passes_layers() -> None:
    passes = available_passes()
    assert {"cse", "canonicalize"} <= passes.keys()  # xDSL
    assert set(PASSES) <= passes.keys()  # AttnFuse
    assert "cse" not in available_passes(include_xdsl=False)


def test_plugin_registers_every_pass(plugin: list[str]) -> None:
    assert {"test-tag-funcs", "test-requires-tag", "test-crash"} <= set(plugin)
    assert load_pass_plugin(str(PLUGIN)) == plugin  # idempotent
    assert available_passes()["test-tag-funcs"]().name == "test-tag-funcs"


def test_plugin_errors(tmp_path: Path) -> None:
    with pytest.raises(PassPluginError, match="does not exist"):
        load_pass_plugin(tmp_path / "missing.py")
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    with pytest.raises(PassPluginError, match="SyntaxError"):
        load_pass_plugin(broken)
    with pytest.raises(PassPluginError, match="ModuleNotFoundError"):
        load_pass_plugin("no_such_module_for_attnfuse")


def test_register_pass_python_call() -> None:
    @register_pass
    @dataclass(frozen=True)
    class HelloPass(ModulePass):
        """Say hello."""

        name = "test-hello"

        def apply(self, ctx: Context, op: ModuleOp) -> None:
            op.attributes["hello"] = StringAttr("world")

    try:
        assert register_pass(HelloPass) is HelloPass  # same class again: fine
        ctx, module = parse()
        PassManager("test-hello").run(module, ctx)
        assert module.attributes["hello"] == StringAttr("world")

        @dataclass(frozen=True)
        class OtherHello(HelloPass):
            pass

        with pytest.raises(ValueError, match="already registered"):
            register_pass(OtherHello)
        register_pass(OtherHello, replace=True)
        assert available_passes()["test-hello"]() is OtherHello
        with pytest.raises(ValueError, match="already registered"):
            register_pass(OtherHello, name="cse")
    finally:
        unregister_pass("test-hello")
    assert "test-hello" not in available_passes()
    with pytest.raises(TypeError):
        register_pass(int)  # type: ignore[arg-type]


def test_register_lazy_factory_with_name() -> None:
    calls: list[int] = []

    def factory() -> type[ModulePass]:
        calls.append(1)
        return resolve_pass("online-softmax", "attnfuse.passes.online_softmax")

    register_pass(factory, name="test-lazy-softmax")
    try:
        assert calls == []  # not loaded until used
        assert available_passes()["test-lazy-softmax"]().name == "online-softmax"
    finally:
        unregister_pass("test-lazy-softmax")


def test_entry_point_passes(plugin: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    module = available_passes()["test-tag-funcs"]().__module__
    eps = [
        EntryPoint("test-ep-tag", f"{module}:TagFuncsPass", registry.ENTRY_POINT_GROUP),
        EntryPoint("test-ep-bad", "os:path", registry.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(registry, "entry_points", lambda group: eps)
    passes = available_passes()
    assert passes["test-ep-tag"]().__name__ == "TagFuncsPass"
    with pytest.raises(PassUnavailableError, match="not a ModulePass"):
        passes["test-ep-bad"]()


# ----------------------------------------------------------------------- pipelines


def test_pipeline_text_and_options(plugin: list[str]) -> None:
    pm = PassManager('cse,test-tag-funcs{tag="seen"}')
    assert [p.name for p in pm.passes] == ["cse", "test-tag-funcs"]
    assert pm.pipeline == 'cse,test-tag-funcs{tag="seen"}'
    ctx, module = parse()
    pm.run(module, ctx)
    assert funcs_attrs(module) >= {"seen"}


def test_pipeline_errors() -> None:
    with pytest.raises(UnknownPassError, match="did you mean 'canonicalize'"):
        PassManager("canonicalise")
    with pytest.raises(
        PipelineError, match="invalid pass pipeline: Expected argument name"
    ):
        PassManager("cse{")
    with pytest.raises(PipelineError, match="invalid options for pass 'cse'"):
        PassManager("cse{frob=1}")


def test_missing_prerequisite(plugin: list[str]) -> None:
    with pytest.raises(MissingPrerequisiteError) as info:
        PassManager("test-requires-tag")
    assert info.value.pass_name == "test-requires-tag"
    assert info.value.prerequisite == "test-tag-funcs"
    assert (
        "it is not in the pipeline; try -p 'test-tag-funcs,test-requires-tag'"
        in str(info.value)
    )
    with pytest.raises(MissingPrerequisiteError, match="it is scheduled after it"):
        PassManager("cse,test-requires-tag,test-tag-funcs")
    with pytest.raises(MissingPrerequisiteError, match="invalidated by 'test-untag'"):
        PassManager("test-tag-funcs,test-untag,test-requires-tag")
    PassManager("test-tag-funcs,test-untag,test-tag-funcs,test-requires-tag")


def test_suggestion_keeps_options(plugin: list[str]) -> None:
    with pytest.raises(MissingPrerequisiteError) as info:
        PassManager('cse,test-requires-tag,test-tag-funcs{tag="t"}')
    assert "try -p 'cse,test-tag-funcs{tag=\"t\"},test-requires-tag'" in str(info.value)


def test_prerequisite_cycle_and_unknown(plugin: list[str]) -> None:
    with pytest.raises(PassDependencyCycleError, match="test-cycle-a -> test-cycle-b"):
        PassManager("test-cycle-a")

    @dataclass(frozen=True)
    class NeedsGhost(ModulePass):
        name = "test-needs-ghost"
        requires: ClassVar[tuple[str, ...]] = ("no-such-pass",)

        def apply(self, ctx: Context, op: ModuleOp) -> None:
            pass

    with pytest.raises(PipelineError, match="declares prerequisite 'no-such-pass'"):
        PassManager([NeedsGhost()])


# ------------------------------------------------------------------------ running


def test_verify_after_each_pass_names_the_pass(plugin: list[str]) -> None:
    ctx, module = parse()
    with pytest.raises(VerificationError) as info:
        PassManager("test-tag-funcs,test-break-ir").run(module, ctx)
    diag = info.value.diagnostic
    assert diag.span is not None and diag.span.get_location().line == 3
    assert "the IR is invalid after pass 'test-break-ir'" in diag.notes
    assert info.value.op is not None and info.value.op.name == "func.return"

    ctx, module = parse()
    PassManager("test-break-ir", verify_each=False).run(module, ctx)  # no check


def test_pass_failures(plugin: list[str]) -> None:
    ctx, module = parse()
    with pytest.raises(
        PassFailedError, match="pass 'test-requires-tag' failed: @f is not tagged"
    ):
        PassManager('test-tag-funcs{tag="other"},test-requires-tag').run(module, ctx)
    with pytest.raises(
        PassCrashError, match="pass 'test-crash' crashed: RuntimeError: boom"
    ):
        PassManager("test-crash").run(module, ctx)


def test_timing_and_print_ir_callback(plugin: list[str]) -> None:
    seen: list[tuple[str, set[str]]] = []
    pm = PassManager(
        "test-tag-funcs,test-requires-tag",
        timing=True,
        print_ir_after=lambda p, m: seen.append((p.name, funcs_attrs(m))),
    )
    ctx, module = parse()
    pm.run(module, ctx)
    assert seen == [
        ("test-tag-funcs", {"tagged"}),
        ("test-requires-tag", {"tagged", "checked"}),
    ]
    assert pm.timing is not None
    assert [name for name, _ in pm.timing.rows] == [
        "test-tag-funcs",
        "test-requires-tag",
        "(verifier)",
    ]
    report = pm.timing.format()
    assert "Execution time report" in report and "(100.0%)  Total" in report


def test_target_fills_unset_options(plugin: list[str]) -> None:
    ctx, module = parse()
    PassManager("test-target", target="H100_SXM", seq_len=512).run(module, ctx)
    assert module.attributes["test.target"] == StringAttr("h100-sxm")  # canonical name
    assert module.attributes["test.seq_len"] == StringAttr("512")
    pm = PassManager('test-target{target="l4"}', target="h200")
    assert pm.pipeline == 'test-target{target="l4"}'  # explicit option wins
    assert PassManager("test-target").pipeline == "test-target"  # nothing filled
    assert PassManager("rope-fusion", target="b200").pipeline == 'rope-fusion{target="b200"}'


def test_unknown_target_lists_known_ones(plugin: list[str]) -> None:
    with pytest.raises(PipelineError, match=r"unknown target 'gtx480'; known targets: a100, b200, .*mi300x"):
        PassManager("test-target", target="gtx480")


def test_make_context_dialects() -> None:
    ctx = make_context()
    loaded = {d.name for d in ctx.loaded_dialects}
    assert {"builtin", "func", "arith", "math", "scf", "tensor"} <= loaded
    assert {"attn", "tile"} <= set(ctx.registered_dialect_names)
    assert ctx.get_optional_op("attn.dropout") is not None  # loads lazily
