"""The AttnFuse pass manager, layered over xDSL's pass pipeline machinery.

Pipelines are text (``a,b{opt=v}``) resolved against :func:`available_passes` (xDSL's
passes, AttnFuse's, the ``attnfuse.passes`` entry point group, and passes registered
with :func:`register_pass`; those registry functions live in :mod:`attnfuse.passes`
and are re-exported here).

A pass class may declare ``requires: ClassVar[tuple[str, ...]]`` (passes that must run
earlier in the pipeline) and ``invalidates: ClassVar[tuple[str, ...]]`` (passes whose
effect it undoes, so a later pass requiring them needs them to run again).
:class:`PassManager` checks these on a networkx dependency graph before running,
verifies the module after every pass, and can time passes and print IR between them.
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import ArgSpec, parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException

from attnfuse.analysis.tile_plan import resolve_f32_dot
from attnfuse.cost.target import UnknownTargetError, get_target
from attnfuse.diagnostics import (
    LocatedError,
    OpError,
    SourceLocations,
    VerificationError,
    describe_spec_error,
    error_at,
    locations_of,
    verify_module,
)
from attnfuse.passes import (
    ENTRY_POINT_GROUP,
    PassFactory,
    available_passes,
    load_pass_plugin,
    pass_summary,
    register_pass,
    unregister_pass,
)

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "ENTRY_POINT_GROUP",
    "MissingPrerequisiteError",
    "PassBrokeIRError",
    "PassCrashError",
    "PassDependencyCycleError",
    "PassFailedError",
    "PassManager",
    "PipelineError",
    "TimingReport",
    "UnknownPassError",
    "available_passes",
    "check_prerequisites",
    "load_pass_plugin",
    "make_context",
    "pass_summary",
    "register_pass",
    "resolve_pipeline",
    "unregister_pass",
]

# --------------------------------------------------------------------------- errors


class PipelineError(ValueError):
    """A pipeline that cannot be built: bad syntax, unknown pass, bad options, ..."""


class UnknownPassError(PipelineError):
    """A pipeline names a pass that no registry knows."""


class MissingPrerequisiteError(PipelineError):
    """A pass's declared prerequisite does not run before it."""

    def __init__(self, pass_name: str, prerequisite: str, message: str) -> None:
        super().__init__(message)
        self.pass_name = pass_name
        self.prerequisite = prerequisite


class PassDependencyCycleError(PipelineError):
    """Declared pass prerequisites form a cycle."""


class PassFailedError(DiagnosticException):
    """A pass rejected its input or options.

    Raised for a ``DiagnosticException`` (e.g. ``PassFailedException``) or a
    ``ValueError`` (an inappropriate value: options, input shapes) from a pass.
    """

    def __init__(self, pass_name: str, cause: Exception) -> None:
        reason = str(cause).strip() or type(cause).__name__
        reason = reason.removeprefix(f"{pass_name}: ")
        super().__init__(f"pass '{pass_name}' failed: {reason}")
        self.pass_name = pass_name
        self.cause = cause


class PassBrokeIRError(VerificationError):
    """A pass left IR that does not verify behind: a bug in the pass, not the input."""

    def __init__(self, pass_name: str, error: VerificationError) -> None:
        super().__init__(error.diagnostic, error.op)
        self.pass_name = pass_name


class PassCrashError(RuntimeError):
    """A pass raised an unexpected Python exception (a compiler bug)."""

    def __init__(self, pass_name: str, cause: BaseException) -> None:
        super().__init__(f"pass '{pass_name}' crashed: {type(cause).__name__}: {cause}")
        self.pass_name = pass_name
        self.cause = cause


# ---------------------------------------------------------------------- pipelines


def _declared(cls: type[ModulePass], attr: str) -> tuple[str, ...]:
    value = getattr(cls, attr, ())
    return (value,) if isinstance(value, str) else tuple(value)


def resolve_pipeline(
    pipeline: str, available: Mapping[str, PassFactory] | None = None
) -> tuple[ModulePass, ...]:
    """Parse ``a,b{opt=v}`` pipeline text into configured pass instances."""
    available = available_passes() if available is None else available
    try:
        specs: list[ArgSpec] = list(parse_pipeline(pipeline))
    except ArgSpecParseError as e:
        raise PipelineError(
            f"invalid pass pipeline: {describe_spec_error(e)}"
        ) from None
    passes: list[ModulePass] = []
    for spec in specs:
        if spec.name not in available:
            close = difflib.get_close_matches(spec.name, list(available), n=3)
            hint = (
                f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            )
            raise UnknownPassError(f"unknown pass '{spec.name}'{hint}")
        try:
            cls = available[spec.name]()
        except Exception as e:
            raise PipelineError(f"cannot load pass '{spec.name}': {e}") from e
        try:
            passes.append(cls.from_pass_spec(spec))
        except (ValueError, TypeError) as e:
            raise PipelineError(f"invalid options for pass '{spec.name}': {e}") from e
    return tuple(passes)


def dependency_graph(
    pass_classes: Sequence[type[ModulePass]], available: Mapping[str, PassFactory]
) -> nx.DiGraph:
    """Graph of declared prerequisites (edge ``prerequisite -> pass``), transitively."""
    import networkx as nx  # lazily: it is a sizeable import for the driver's startup

    graph: nx.DiGraph = nx.DiGraph()
    todo: list[type[ModulePass]] = list(pass_classes)
    seen: set[str] = set()
    while todo:
        cls = todo.pop()
        if cls.name in seen:
            continue
        seen.add(cls.name)
        graph.add_node(cls.name)
        for req in _declared(cls, "requires"):
            if req not in available:
                raise PipelineError(
                    f"pass '{cls.name}' declares prerequisite '{req}', "
                    "which is not a registered pass"
                )
            graph.add_edge(req, cls.name)
            try:
                todo.append(available[req]())
            except Exception:
                graph.add_node(req)  # unloadable: keep it as a leaf
    return graph


Step = tuple[str, type[ModulePass]]


def _suggest(steps: Sequence[Step], graph: nx.DiGraph) -> list[str] | None:
    """Pass names close to ``steps`` that run every prerequisite first."""
    import networkx as nx

    names = [n for n, _ in steps]
    if len(set(names)) != len(names):
        return None  # repeated passes: no unambiguous reordering
    needed: set[str] = set(names)
    for name in names:
        needed |= nx.ancestors(graph, name)
    order = {name: i for i, name in enumerate(names)}
    for name in needed - order.keys():
        order[name] = min(order[d] for d in nx.descendants(graph, name) if d in order)
    sub = graph.subgraph(needed)
    return list(nx.lexicographical_topological_sort(sub, key=lambda n: (order[n], n)))


def _first_violation(steps: Sequence[Step]) -> tuple[str, str, str] | None:
    """(pass, prerequisite, reason) for the first unmet prerequisite, if any."""
    satisfied: set[str] = set()
    invalidated_by: dict[str, str] = {}
    for index, (name, cls) in enumerate(steps):
        for req in _declared(cls, "requires"):
            if req in satisfied:
                continue
            if req in invalidated_by:
                reason = f"its effect is invalidated by '{invalidated_by[req]}'"
            elif any(n == req for n, _ in steps[index + 1 :]):
                reason = "it is scheduled after it"
            else:
                reason = "it is not in the pipeline"
            return name, req, reason
        satisfied.add(name)
        invalidated_by.pop(name, None)
        for inv in _declared(cls, "invalidates"):
            if inv in satisfied:
                satisfied.discard(inv)
                invalidated_by[inv] = name
    return None


def check_prerequisites(
    passes: Sequence[ModulePass], available: Mapping[str, PassFactory] | None = None
) -> None:
    """Raise if declared prerequisites are cyclic or do not run earlier."""
    if not any(_declared(type(p), "requires") for p in passes):
        return  # nothing declared: nothing to check (and no networkx import)
    import networkx as nx

    available = available_passes() if available is None else available
    graph = dependency_graph([type(p) for p in passes], available)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = " -> ".join([cycle[0][0], *(v for _, v in cycle)])
        raise PassDependencyCycleError(
            f"pass prerequisites form a cycle: {path} (each requires the previous)"
        )
    steps: list[Step] = [(p.name, type(p)) for p in passes]
    if (violation := _first_violation(steps)) is None:
        return
    name, req, reason = violation
    message = (
        f"pass '{name}' requires '{req}' to run earlier in the pipeline, but {reason}"
    )
    suggestion = _suggest(steps, graph)
    if suggestion is not None:
        try:
            fixed = [(n, available[n]()) for n in suggestion]
        except Exception:
            fixed = None
        if fixed is not None and _first_violation(fixed) is None:
            text = {p.name: str(p) for p in passes}
            message += f"; try -p '{','.join(text.get(n, n) for n in suggestion)}'"
    raise MissingPrerequisiteError(name, req, message)


# ----------------------------------------------------------------------- context


def make_context(*, allow_unregistered: bool = False) -> Context:
    """A context with builtin, func, arith, math, scf, tensor, attn and tile.

    The xDSL dialects are loaded; attn and tile are registered lazily and load on
    first use.
    """
    from xdsl.dialects.arith import Arith
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.func import Func
    from xdsl.dialects.math import Math
    from xdsl.dialects.scf import Scf
    from xdsl.dialects.tensor import Tensor

    from attnfuse.universe import ATTNFUSE_DIALECTS

    ctx = Context(allow_unregistered=allow_unregistered)
    for dialect in (Builtin, Func, Arith, Math, Scf, Tensor):
        ctx.load_dialect(dialect)
    for name, factory in ATTNFUSE_DIALECTS.items():
        ctx.register_dialect(name, factory)
    return ctx


# --------------------------------------------------------------------- the manager


@dataclass
class TimingReport:
    """Wall-clock time per pipeline step, printed like ``mlir-opt --mlir-timing``."""

    rows: list[tuple[str, float]] = field(default_factory=list[tuple[str, float]])

    def add(self, name: str, seconds: float) -> None:
        """Record ``seconds`` for step ``name`` (repeated names stay separate rows)."""
        self.rows.append((name, seconds))

    def total(self) -> float:
        """Sum of all rows."""
        return sum(s for _, s in self.rows)

    def format(self) -> str:
        """The report table."""
        total = self.total() or 1e-12
        bar = "===" + "-" * 73 + "==="
        lines = [
            bar,
            "... Execution time report ...".center(len(bar)).rstrip(),
            bar,
            f"  Total Execution Time: {self.total():.4f} seconds",
            "",
            "  ----Wall Time----  ----Name----",
        ]
        for name, secs in self.rows:
            lines.append(f"  {secs:9.4f} ({100 * secs / total:5.1f}%)  {name}")
        lines.append(f"  {self.total():9.4f} (100.0%)  Total")
        return "\n".join(lines) + "\n"


PrintIRCallback = Callable[[ModulePass, ModuleOp], None]


def _with_options(p: ModulePass, **values: object) -> ModulePass:
    """Fill the options of ``p`` named in ``values`` that the pipeline left unset
    (None, 0 or the empty string)."""
    names = {f.name for f in dataclasses.fields(p)} if dataclasses.is_dataclass(p) else set()
    unset = {k: v for k, v in values.items() if k in names and getattr(p, k, None) in (None, 0, "")}
    return dataclasses.replace(p, **unset) if unset else p  # type: ignore[type-var]


class PassManager:
    """Resolve, check and run a pass pipeline.

    ``pipeline`` is text (``"a,b{opt=v}"``) or pass instances. Construction resolves
    names and options and checks declared prerequisites (raising
    :class:`PipelineError`); :meth:`run` applies the passes in order, verifying after
    each one when ``verify_each`` (a :class:`~attnfuse.diagnostics.VerificationError`
    names the pass that broke the IR), timing them into :attr:`timing` when
    ``timing`` and calling ``print_ir_after(pass, module)`` after each pass.
    ``target`` (a name in :func:`attnfuse.cost.known_targets`, checked here) and
    ``seq_len`` fill the ``target`` / ``seq_len`` options of passes that have them
    (``rope-fusion``) where the pipeline leaves them unset, and ``f32_dot`` the
    ``f32-dot`` option (``mask-tiling``, ``lower-backward``, ``lower-to-tile``: the
    precision of f32 dots, whose default tiles follow it).
    """

    def __init__(
        self,
        pipeline: str | Sequence[ModulePass] = "",
        *,
        verify_each: bool = True,
        timing: bool = False,
        print_ir_after: PrintIRCallback | None = None,
        target: str | None = None,
        seq_len: int = 0,
        f32_dot: str = "",
        available: Mapping[str, PassFactory] | None = None,
    ) -> None:
        self.available = available_passes() if available is None else dict(available)
        if isinstance(pipeline, str):
            self.passes = resolve_pipeline(pipeline, self.available)
        else:
            self.passes = tuple(pipeline)
        check_prerequisites(self.passes, self.available)
        if target is not None:
            try:
                found = get_target(target)
            except UnknownTargetError as e:
                raise PipelineError(str(e)) from None
            target = target if target.endswith(".json") else found.name  # a profile stays a path
        if f32_dot:
            try:
                resolve_f32_dot("f32_dot", f32_dot)
            except ValueError as e:
                raise PipelineError(str(e)) from None
        values = {"target": target, "seq_len": seq_len, "f32_dot": f32_dot}
        if target is not None or seq_len or f32_dot:
            self.passes = tuple(_with_options(p, **values) for p in self.passes)
        self.verify_each = verify_each
        self.print_ir_after = print_ir_after
        self.target = target
        self.timing: TimingReport | None = TimingReport() if timing else None
        self._verify_seconds = 0.0

    @property
    def pipeline(self) -> str:
        """The resolved pipeline as text (non-default options spelled out)."""
        return ",".join(str(p) for p in self.passes)

    def run(
        self,
        module: ModuleOp,
        ctx: Context | None = None,
        *,
        locations: SourceLocations | None = None,
        verify_input: bool = True,
    ) -> ModuleOp:
        """Apply the pipeline to ``module`` in place and return it."""
        ctx = make_context() if ctx is None else ctx
        locations = locations_of(module) if locations is None else locations
        self._verify_seconds = 0.0
        try:
            if self.verify_each and verify_input:
                self._verify(module, locations, "the input IR is invalid")
            for p in self.passes:
                self._apply(p, module, ctx)
                if self.verify_each:
                    note = f"the IR is invalid after pass '{p.name}'"
                    try:
                        self._verify(module, locations, note)
                    except VerificationError as e:
                        raise PassBrokeIRError(p.name, e) from e
                if self.print_ir_after is not None:
                    self.print_ir_after(p, module)
        finally:
            if self.timing is not None and self.verify_each:
                self.timing.add("(verifier)", self._verify_seconds)
        return module

    def _apply(self, p: ModulePass, module: ModuleOp, ctx: Context) -> None:
        start = time.perf_counter()
        try:
            p.apply(ctx, module)
        except LocatedError as e:
            e.diagnostic.notes.append(f"in pass '{p.name}'")
            raise
        except OpError as e:
            if e.op is None:
                raise PassFailedError(p.name, e) from e
            raise error_at(e.op, str(e), notes=[f"in pass '{p.name}'"]) from e
        except (DiagnosticException, ValueError) as e:
            raise PassFailedError(p.name, e) from e
        except Exception as e:  # anything else is a bug in the pass
            raise PassCrashError(p.name, e) from e
        if self.timing is not None:
            self.timing.add(p.name, time.perf_counter() - start)

    def _verify(
        self, module: ModuleOp, locations: SourceLocations | None, note: str
    ) -> None:
        start = time.perf_counter()
        try:
            verify_module(module, locations, notes=[note])
        finally:
            self._verify_seconds += time.perf_counter() - start
