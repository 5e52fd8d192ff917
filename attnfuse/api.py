"""The Python API: compile an attn program once, call it on torch tensors.

```python
import attnfuse
attention = attnfuse.compile("examples/llama3.attn")
out = attention(q, k, v)                     # [B, 32, S, 128] bf16, CUDA or CPU
out, lse = attention(q, k, v, return_lse=True)
```

Arguments follow the program's function signature (q, k, v, then its extra operands).
On CUDA tensors the kernels run compiled; on CPU tensors through the Triton
interpreter. Compiled programs are cached on disk, keyed by the program text, the
pipeline, the `target` option, the versions of xDSL and Triton and a hash of the
compiler's own source.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr, TensorType
from xdsl.passes import ModulePass
from xdsl.printer import Printer

from attnfuse.analysis.packing import packed_batch
from attnfuse.analysis.paging import cache_lengths, paged_cache
from attnfuse.backends.gluon.emitter import emit_gluon
from attnfuse.backends.gluon.metadata import gluon_kernel_metadata
from attnfuse.backends.triton.emitter import emit_module, kernel_metadata
from attnfuse.builder import Program
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.source_locations import decode_source
from attnfuse.dialects.tile import KernelOp
from attnfuse.dialects.tile_hopper import KernelOp as GluonKernelOp
from attnfuse.params import substitute
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.placement_versions import PlacementVersions
from attnfuse.passes import DEFAULT_PIPELINE, pass_fingerprint
from attnfuse.program import AttentionProgram, analyze, find_functions, shared_length_operand, symbolic_shapes
from attnfuse.runtime import cache
from attnfuse.runtime.checks import ArgumentChecker, AttnfuseArgumentError, Parameter, torch_dtype
from attnfuse.runtime.host import HostProgram
from attnfuse.runtime.op import OpSignature, Ops, define_ops
from attnfuse.runtime.runner import Runner

__all__ = ["AttentionFunction", "AttnfuseArgumentError", "Parameter", "compile"]

_VERSION = "0.1.0"

logger = logging.getLogger(__name__)


@functools.cache
def _versions() -> str:
    """Versions of everything that shapes a compiled program, the compiler's own code included."""
    import triton
    import xdsl

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return (
        f"attnfuse={_VERSION}:{digest.hexdigest()[:16]} "
        f"xdsl={getattr(xdsl, '__version__', '?')} triton={triton.__version__}"
    )


def _read_program(program: object) -> tuple[str, str]:
    """(text, filename) of a program given as text, a path, a module or a built program."""
    if isinstance(program, ModuleOp):
        return str(program), "<module>"
    if isinstance(program, Program):
        return program.text(), f"<program @{program.name}>"
    if isinstance(program, os.PathLike) or (
        isinstance(program, str) and "\n" not in program and program.endswith((".attn", ".mlir"))
    ):
        path = Path(program)
        return decode_source(path.read_bytes(), str(path)), str(path)
    if isinstance(program, str):
        return program, "<program>"
    raise TypeError(
        "attnfuse.compile: program must be program text (str), a path (str or os.PathLike), "
        f"an attnfuse.Program or an xDSL ModuleOp, got {type(program).__name__}"
    )


def _print(op: Any) -> str:
    buf = io.StringIO()
    Printer(stream=buf).print_op(op)
    return buf.getvalue()


def _lower(text: str, manager: PassManager, ctx: Any, module: ModuleOp, locations: Any,
           name: str) -> tuple[cache.CompiledProgram, list[func.FuncOp], ModuleOp | str]:
    """(the compiled program, its host functions, the lowered IR) of `text` (parsed as
    `module`) through `manager`'s pipeline: from the disk cache (the IR as text: the host
    functions only), else lowered and stored (the IR as the lowered module, printed only
    when asked for: printing takes about a tenth of the compile)."""
    prints = [pass_fingerprint(type(p)) for p in manager.passes]
    key = hashlib.sha256("\n".join([text, manager.pipeline, manager.target or "", _versions(), *map(str, prints)]).encode()).hexdigest()
    cached = cache.load(key) if None not in prints else None
    logger.debug("@%s: disk cache %s (key %s)", name, "hit" if cached else "miss", key[:16])
    if cached is not None:
        host_funcs = [f for f in parse_module_with_locations(ctx, cached.host, "<cache>")[0].ops
                      if isinstance(f, func.FuncOp)]
        return cached, host_funcs, cached.host
    start = time.perf_counter()
    manager.run(module, ctx, locations=locations)
    kernels = [op for op in module.walk() if isinstance(op, KernelOp)]
    gluon = [op for op in module.walk() if isinstance(op, GluonKernelOp)]
    host_funcs = [f for f in module.ops if isinstance(f, func.FuncOp)]
    compiled = cache.CompiledProgram(
        source=emit_module(kernels) + emit_gluon(module),
        host="\n".join(_print(f) for f in host_funcs),
        kernels={**{k.sym_name.data: kernel_metadata(k) for k in kernels},
                 **{k.sym_name.data: gluon_kernel_metadata(k) for k in gluon}},
    )
    logger.debug("@%s: ran %s in %.3f s", name, manager.pipeline, time.perf_counter() - start)
    if None not in prints:
        cache.store(key, compiled)
    return compiled, host_funcs, module


def _analyzed(text: str, filename: str, name: str) -> AttentionProgram:
    """The attention program of function @name in `text`, parsed anew."""
    module = parse_module_with_locations(make_context(), text, filename)[0]
    return analyze(next(f for f in find_functions(module) if f.sym_name.data == name))


def _lower_host(text: str, filename: str, name: str, passes: Sequence[ModulePass]) -> HostProgram:
    """The forward host program of @name in `text` lowered through `passes` (`PlacementVersions`)."""
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, text, filename)
    compiled, host_funcs, _ = _lower(text, PassManager(passes), ctx, module, locations, name)
    return HostProgram(next(f for f in host_funcs if f.sym_name.data == name), compiled.source, compiled.kernels)


class AttentionFunction:
    """A compiled attention program; call it like the function it declares."""

    def __init__(self, text: str, filename: str, pipeline: str, target: str | None, entry: str | None,
                 f32_dot: str = "") -> None:
        ctx = make_context()
        module, locations = parse_module_with_locations(ctx, text, filename)
        functions = find_functions(module)
        if entry is not None:
            functions = [f for f in functions if f.sym_name.data == entry]
        if not functions:
            raise ValueError(f"{filename}: no attention function{f' named @{entry}' if entry else ''}")
        function = functions[0]
        self.name = function.sym_name.data
        analyzed = analyze(function)
        self.parameters = [
            Parameter(i, a.name_hint or f"arg{i}", a.type) for i, a in enumerate(function.args)
        ]
        packing = packed_batch(analyzed)
        paging = paged_cache(analyzed)
        lengths = cache_lengths(analyzed)
        self._checker = ArgumentChecker(
            self.name, self.parameters, symbolic_shapes(analyzed), shared_length_operand(analyzed),
            (analyzed.q.arg_index, analyzed.k.arg_index, analyzed.v_arg),
            packing.arguments(analyzed) if packing is not None else (),
            paging.arguments(analyzed) if paging is not None else None,
            analyzed.arg(lengths) if lengths is not None else None,
        )
        self.returns_lse = len(function.function_type.outputs.data) == 2
        self.attn_ir = str(module)
        self.pipeline = pipeline
        manager = PassManager(pipeline, target=target, f32_dot=f32_dot)
        rope = PlacementVersions.applies(analyzed, manager.passes)
        versions = None if rope is None else PlacementVersions(  # before the pipeline rewrites `analyzed`'s IR
            analyzed, functools.partial(_analyzed, text, filename, self.name), manager.passes, rope,
            functools.partial(_lower_host, text, filename, self.name))
        compiled, host_funcs, self._lowered = _lower(text, manager, ctx, module, locations, self.name)
        self.triton_source = compiled.source
        metadata = compiled.kernels
        by_name = {f.sym_name.data: f for f in host_funcs}
        self._host = HostProgram(by_name[self.name], self.triton_source, metadata)
        reason = by_name[self.name].attributes.get("attnfuse.no_backward")
        self._no_backward = reason.data if isinstance(reason, StringAttr) else None
        backward = by_name.get(f"{self.name}_backward")
        self._backward: HostProgram | None = None
        self._grad_of: list[int] = []
        saved_backward = by_name.get(f"{self.name}_backward_saved")
        saved = by_name[self.name].attributes.get("attnfuse.saved")
        saved_args = tuple(int(a.value.data) for a in saved.data) if isinstance(saved, ArrayAttr) else ()  # type: ignore[attr-defined]
        if backward is not None:
            self._backward = HostProgram(backward, self.triton_source, metadata)
            grad_of = backward.attributes["attnfuse.grad_of"]
            assert isinstance(grad_of, ArrayAttr)
            self._grad_of = [int(a.value.data) for a in grad_of.data]  # type: ignore[attr-defined]
        out_type = function.function_type.outputs.data[0]
        assert isinstance(out_type, TensorType)
        _, heads, _, dim = out_type.get_shape()
        self.op_signature = OpSignature(
            name=self.name,
            digest=hashlib.sha256(
                "\n".join([self.name, compiled.source, compiled.host, repr(sorted(metadata.items()))]).encode()
            ).hexdigest(),
            parameters=tuple(self.parameters),
            out_dtype=torch_dtype(out_type.element_type),
            out_heads=heads,
            out_dim=dim,
            out_order=self._host.result_order(0),
            grad_of=tuple(self._grad_of),
            saved=saved_args if saved_backward is not None else (),
            grad_orders=tuple(self._backward.result_order(i) for i in range(len(self._grad_of)))
            if self._backward is not None else (),
            no_backward=None if self._backward is not None else self._no_backward or "it was compiled without lower-backward",
        )
        runner = Runner(self._host, self._backward, self._checker, self._grad_of,
                        HostProgram(saved_backward, self.triton_source, metadata) if saved_backward is not None else None)
        self.ops: Ops
        self.ops, self._runner = define_ops(self.op_signature, runner)
        self._host, self._backward = self._runner.host, self._runner.backward  # shared with a live twin
        self._op = self.ops.forward
        if self._runner.versions is None:
            self._runner.versions = versions

    @property
    def lowered_ir(self) -> str:
        """The lowered module as text (host functions and `tile.kernel`s; from the disk
        cache: the host functions only), printed on first use."""
        if not isinstance(self._lowered, str):
            self._lowered = str(self._lowered)
        return self._lowered

    @property
    def check_page_values(self) -> bool:
        """Whether every call of a paged program checks its block table and kv_lens
        values (lengths within the block table, pages within the pool; for a contiguous
        cache with lengths, lengths within its capacity): a copy to the host, so a
        synchronisation and no CUDA-graph capture. Off by default; shapes
        and dtypes are always checked. Shared by the live compilations of one program
        (they share their runner)."""
        return self._runner.checker.check_pages

    @check_page_values.setter
    def check_page_values(self, on: bool) -> None:
        checker = self._runner.checker
        if on and checker.pages is None and checker.lengths is None:
            raise ValueError(f"@{self.name} reads no KV cache through kv_lens (attn.scores has no kv_lens)")
        self._runner.checker.check_pages = on

    @property
    def check_segment_values(self) -> bool:
        """Whether every call of a packed program (cu_seqlens) checks their values (from 0,
        rising, to the token count): a copy to the host, so a synchronisation. On by
        default; skipped while a CUDA graph is being captured. Off, bad values give wrong
        numbers but no access outside the tensors (the kernels clamp every sequence).
        Shared by the live compilations of one program."""
        return self._runner.checker.check_segments

    @check_segment_values.setter
    def check_segment_values(self, on: bool) -> None:
        if not self._runner.checker.segments:
            raise ValueError(f"@{self.name} is not a packed program (attn.scores has no cu_seqlens)")
        self._runner.checker.check_segments = on

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any, return_lse: bool = False) -> Any:
        """Run the program through its custom op (`self.ops.forward`); differentiable
        when any tensor argument requires grad."""
        args = self._checker.scalars(args)
        requires_grad, plain = False, True  # one pass: this is the per-call hot path
        for a in args:
            if isinstance(a, torch.Tensor):
                requires_grad = requires_grad or a.requires_grad
                plain = plain and type(a) is torch.Tensor and not a.is_meta
        needs_grad = requires_grad and torch.is_grad_enabled()
        if self._backward is None and needs_grad:
            raise RuntimeError(f"@{self.name} has no gradient: {self.op_signature.no_backward}")
        if not needs_grad and plain and not torch.compiler.is_compiling():
            # Eager inference on plain tensors: the launch plan directly, without the
            # dispatcher's cost (about 28 us per call), in the RoPE placement the cost
            # model picks for the shape class (`Runner.infer`, `placement_versions`);
            # autograd, fake/meta tensors, tensor subclasses and torch.compile go through
            # the custom op. A call that drops lse lets the plan skip its allocation
            # (`LaunchPlan.run`).
            want_lse = return_lse or self.returns_lse
            out, lse = self._runner.infer(args, want_lse)[:2]
            return (out, lse) if want_lse else out
        try:
            out, lse = self._op(*args)[:2]
        except (RuntimeError, TypeError):
            try:  # arguments the op's schema rejects: say which and why
                self._checker.check(args)
            except AttnfuseArgumentError as bad:
                raise bad from None
            raise
        if return_lse or self.returns_lse:
            return out, lse
        return out

    def _forward(self, args: Sequence[Any], lse: bool = True) -> list[Any]:
        """The forward host program on arguments whose scalars are converted (`Runner.forward`)."""
        return self._runner.forward(args, lse)

    def gradients(self, args: Sequence[Any], out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                  d_lse: torch.Tensor | None = None) -> list[torch.Tensor | None]:
        """Run the compiled backward: one gradient per argument (None where there is none)."""
        return self._runner.gradients(args, out, lse, d_out, d_lse)

    def count_tiles(self, *args: Any) -> int:
        """Debug helper for programs lowered with `lower-to-tile{count-tiles=true}`."""
        results = self._forward(self._checker.scalars(args))
        counter = 2 + len(self.op_signature.saved)  # after out, lse and the saved transforms
        if len(results) <= counter:
            raise ValueError("compile with lower-to-tile{count-tiles=true} to count tiles")
        return int(results[counter].item())

    def count_backward_tiles(self, *args: Any) -> int:
        """Debug helper for programs lowered with `lower-backward{count-tiles=true}`: the
        tiles the dQ and dK/dV kernels visited together in one backward."""
        args = self._checker.scalars(args)
        if self._backward is None:
            raise ValueError(f"@{self.name} has no backward")
        out, lse = self._forward(args)[:2]
        results = self._runner.backward_results(args, out, lse, torch.ones_like(out))
        if len(results) <= len(self._grad_of):
            raise ValueError("compile with lower-backward{count-tiles=true} to count backward tiles")
        return int(results[-1].item())


def compile(  # noqa: A001 - the natural name, as torch.compile
    program: str | os.PathLike[str] | ModuleOp | Program,
    pipeline: str | None = None,
    target: str | None = None,
    entry: str | None = None,
    params: Mapping[str, object] | None = None,
    f32_dot: str = "",
) -> AttentionFunction:
    """Compile an attn program (text, a path to a .attn file, a module, or a program from
    `attnfuse.attention(...)`); ``target`` names the GPU the cost model plans for
    (``attnfuse.cost.known_targets()``); ``params`` binds the text's ``${name}``
    placeholders (`attnfuse.params`); ``f32_dot`` sets the precision of an f32 program's
    dots in every pass that has the option unset (``ieee``, ``tf32x3``: the default, or
    ``tf32``; see `attnfuse.analysis.tile_plan.DEFAULT_F32_DOT`)."""
    text, filename = _read_program(program)
    text = substitute(text, params, filename)
    return AttentionFunction(text, filename, pipeline or DEFAULT_PIPELINE, target, entry, f32_dot)
