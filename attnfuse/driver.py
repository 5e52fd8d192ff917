"""``attnfuse-opt``: the AttnFuse optimizer driver (AttnFuse's ``mlir-opt``).

An ``xDSLOptMain`` subclass that knows the attn/tile dialects, the ``.attn`` frontend,
AttnFuse's passes and the ``triton`` target. Pipelines run through
:class:`attnfuse.pass_manager.PassManager` (prerequisite checks, verification after
every pass, timing, IR dumps). Every error on user input is an MLIR-style diagnostic
(``file:line:col: error: reason``) or a one-line ``attnfuse-opt: error: reason``; the
driver never shows a Python traceback unless ``ATTNFUSE_TRACEBACK=1``.
``--verify-diagnostics`` checks diagnostics against ``// expected-*`` annotations
(:mod:`attnfuse.diagnostic_verifier`).

Exit codes: 0 success, 1 invalid input or pipeline (or a diagnostic mismatch under
``--verify-diagnostics``), 2 command-line usage error, 3 internal compiler error.
See docs/driver.md.
"""

from __future__ import annotations

import argparse
import errno
import inspect
import os
import sys
import time
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from io import BytesIO
from typing import IO, NoReturn

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.printer import Printer
from xdsl.utils.arg_spec import parse_spec
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from attnfuse import examples
from attnfuse.cost.target import get_target
from attnfuse.diagnostic_verifier import (
    Diagnostic,
    Expectation,
    check_diagnostics,
    collect_diagnostics,
    parse_expectations,
)
from attnfuse.diagnostics import (
    describe_spec_error,
    format_diagnostic,
    format_exception,
    parse_module_with_locations,
    verify_module,
)
from attnfuse.frontend import AttnFrontend
from attnfuse.driver_options import PROG, add_arguments
from attnfuse.pass_manager import (
    PassBrokeIRError,
    PassCrashError,
    PassManager,
    PipelineError,
    TimingReport,
    available_passes,
    load_pass_plugin,
)
from attnfuse.passes import (
    DEFAULT_PIPELINE,
    PassPluginError,
    PassUnavailableError,
)
from attnfuse.universe import ATTNFUSE_DIALECTS, ATTNFUSE_FRONTENDS, ATTNFUSE_TARGETS

__all__ = ["EXIT_ERROR", "EXIT_INTERNAL", "EXIT_USAGE", "AttnfuseOptMain", "main"]

SPLIT_MARKER = b"// -----"
"""A line that separates chunks under ``--split-input-file``."""
EXIT_ERROR = 1
"""Invalid input (parse/verify error), invalid pipeline, or a pass reported failure."""
EXIT_USAGE = 2
"""Bad command line (argparse's convention)."""
EXIT_INTERNAL = 3
"""Internal compiler error: a pass or target crashed with a Python exception."""


def _version() -> str:
    try:
        return version("attnfuse")
    except PackageNotFoundError:  # running from a source checkout
        return "dev"


def _fatal(message: str, code: int = EXIT_ERROR) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    raise SystemExit(code)


def _prescan(argv: Sequence[str], flag: str) -> list[str]:
    """Values of ``flag`` (``--flag X`` or ``--flag=X``) before argparse runs."""
    values: list[str] = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
    return values


class AttnfuseOptMain(xDSLOptMain):
    """The ``attnfuse-opt`` driver; ``AttnfuseOptMain(args=[...]).run()`` in-process."""

    version_format = f"{PROG} {_version()} (xdsl {{xdsl_version}})"
    pass_manager: PassManager

    def __init__(
        self,
        description: str = "AttnFuse optimizer driver: parse .attn/.mlir, run passes, "
        "emit MLIR or Triton.",
        args: Sequence[str] | None = None,
    ) -> None:
        argv = list(sys.argv[1:] if args is None else args)
        self._want_help = any(a in ("-h", "--help") for a in argv)
        for plugin in _prescan(argv, "--pass-plugin"):
            try:
                load_pass_plugin(plugin)
            except (PassPluginError, ValueError) as e:
                _fatal(str(e))
        try:
            super().__init__(description, argv)
        except ArgSpecParseError as e:  # a BaseException in xDSL: catch explicitly
            _fatal(f"invalid -t/-f specification: {describe_spec_error(e)}", EXIT_USAGE)
        if self.args.example is not None:
            if self.args.input_file is not None:
                _fatal(f"give an input file or --example, not both (got '{self.args.input_file}' "
                       f"and --example {self.args.example})", EXIT_USAGE)
            try:
                self.args.input_file = str(examples.path(self.args.example))
            except FileNotFoundError as e:
                _fatal(str(e), EXIT_USAGE)

    # ---------------------------------------------------------------- registration

    def register_all_dialects(self) -> None:
        super().register_all_dialects()
        known = set(self.ctx.registered_dialect_names)
        for name, factory in ATTNFUSE_DIALECTS.items():
            if name not in known:  # already there when AttnFuse is pip-installed
                self.ctx.register_dialect(name, factory)

    def register_all_frontends(self) -> None:
        super().register_all_frontends()
        self.available_frontends.update(ATTNFUSE_FRONTENDS)

    def register_all_passes(self) -> None:
        super().register_all_passes()
        for name, factory in available_passes().items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        super().register_all_targets()
        self.available_targets.update(ATTNFUSE_TARGETS)

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        add_arguments(arg_parser, self.available_passes, with_pass_help=self._want_help)

    # -------------------------------------------------------------------- pipeline

    def setup_pipeline(self) -> None:
        """Resolve ``-p`` (or the default pipeline for ``-t triton``) and check it."""
        text = self.args.passes
        if text is None:
            target = parse_spec(self.args.target).name
            text = DEFAULT_PIPELINE if target == "triton" else ""
        dump = self.args.print_ir_after_all or self.args.print_between_passes
        if self.args.cost_report and self.args.device is None:
            _fatal("--cost-report needs --device NAME", EXIT_USAGE)
        for flag, value in (("--seq-len", self.args.seq_len), ("--batch", self.args.batch)):
            if value < 0:
                _fatal(f"{flag} must be >= 0, got {value}", EXIT_USAGE)
        try:
            self.pass_manager = PassManager(
                text,
                verify_each=not self.args.disable_verify,
                timing=self.args.time_passes,
                print_ir_after=self._dump_ir if dump else None,
                target=self.args.device,
                seq_len=self.args.seq_len,
                f32_dot=self.args.f32_dot,
                available=self.available_passes,
            )
        except (PipelineError, PassUnavailableError) as e:
            _fatal(str(e))
        self.pipeline = PassPipeline(self.pass_manager.passes)
        self._check_target_options()

    def _check_target_options(self) -> None:
        """Reject bad ``-t``/``-f`` options now, not after the pipeline has run."""
        checks = [(self.args.target, self.available_targets, "-t")]
        if self.args.frontend:
            checks.append((self.args.frontend, self.available_frontends, "-f"))
        for text, registry, flag in checks:
            spec = parse_spec(text)
            factory = registry[spec.name]
            if inspect.signature(factory).parameters:
                continue  # a legacy target function: no options
            try:
                factory().from_spec(spec)
            except (ImportError, PassUnavailableError):
                continue  # reported when the target is used
            except (ValueError, TypeError) as e:
                _fatal(f"invalid options for {flag} '{spec.name}': {e}", EXIT_USAGE)

    def _dump_ir(self, pass_: ModulePass, module: ModuleOp) -> None:
        sys.stdout.flush()
        sys.stderr.write(f"// -----// IR Dump After {pass_.name} //----- //\n")
        Printer(
            stream=sys.stderr, print_generic_format=self.args.print_op_generic
        ).print_op(module)
        sys.stderr.write("\n\n")
        sys.stderr.flush()

    def apply_passes(self, prog: ModuleOp) -> None:
        self.pass_manager.run(prog, self.ctx, verify_input=False)

    # ----------------------------------------------------------------------- input

    def _reads_stdin(self) -> bool:
        return self.args.input_file in (None, "-")  # `-` is stdin, as in mlir-opt

    def get_input_name(self) -> str:
        return "<stdin>" if self._reads_stdin() else self.args.input_file

    def get_input_stream(self) -> tuple[IO[bytes], str]:
        if not self._reads_stdin():
            return super().get_input_stream()
        if sys.stdin is None:  # started with stdin closed (`<&-`)
            raise OSError(errno.EBADF, "standard input is closed")
        return sys.stdin.buffer, "mlir"

    def prepare_input(self) -> tuple[list[tuple[BytesIO, int]], str]:
        """Read the input and, with ``--split-input-file``, split it into chunks.

        Unlike xDSL (which splits on ``// -----`` anywhere, even inside a comment),
        only a line that is exactly ``// -----`` separates chunks, as in mlir-opt.
        Each chunk comes with the number of lines before it in the file. The whole
        input is read here, so read errors are reported before anything runs.
        """
        stream, ext = self.get_input_stream()
        if self.args.frontend and ext not in self.available_frontends:
            # xDSL rejects unknown extensions even when -f names a frontend; we don't.
            ext = parse_spec(self.args.frontend).name
        try:
            if ext not in self.available_frontends:
                raise ValueError(f"unrecognized file extension '{ext}'")
            data = stream.read()
        finally:
            if not self._reads_stdin():
                stream.close()
        if not self.args.split_input_file:
            return [(BytesIO(data), 0)], ext
        chunks: list[tuple[BytesIO, int]] = []
        start, current = 0, list[bytes]()
        for index, line in enumerate(data.split(b"\n")):  # lines as the lexer counts
            if line.strip() == SPLIT_MARKER:
                chunks.append((BytesIO(b"\n".join(current)), start))
                start, current = index + 1, []
            else:
                current.append(line)
        chunks.append((BytesIO(b"\n".join(current)), start))
        return chunks, ext

    def parse_chunk(
        self, chunk: IO[bytes], file_extension: str, start_offset: int = 0
    ) -> ModuleOp | None:
        """Parse MLIR/.attn text recording op locations; other frontends via xDSL."""
        spec = parse_spec(self.args.frontend or file_extension)
        if spec.name not in ("mlir", "attn"):
            return super().parse_chunk(chunk, file_extension, start_offset)
        no_implicit = self.args.no_implicit_module
        if spec.name == "attn":
            no_implicit |= AttnFrontend.from_spec(spec).no_implicit_module
        module, _ = parse_module_with_locations(
            self.ctx,
            chunk.read(),
            self.get_input_name(),
            line_offset=start_offset,
            allow_implicit_module=not no_implicit,
        )
        return module

    # ------------------------------------------------------------------------- run

    def run(self) -> None:
        """Process the input; exit non-zero on errors, never with a traceback."""
        try:
            status = self._run()
        except SystemExit:
            raise
        except KeyboardInterrupt:
            _fatal("interrupted", 130)
        except BrokenPipeError:
            _discard_stdout()
            raise SystemExit(EXIT_ERROR) from None
        except Exception as e:  # a bug: report it as such, not as a traceback
            status = self._internal_error(e)
        if status:
            raise SystemExit(status)

    def _run(self) -> int:
        """Process every chunk (even after one fails); the worst exit status."""
        try:
            chunks, file_extension = self.prepare_input()
        except OSError as e:
            _fatal(f"cannot read '{self.get_input_name()}': {e.strerror or e}")
        except ValueError as e:
            frontends = ", ".join(sorted(self.available_frontends))
            _fatal(f"{e} (known: {frontends}; choose one with -f)")
        try:
            output = self.prepare_output()
        except OSError as e:
            _fatal(f"cannot write '{self.args.output_file}': {e.strerror or e}")
        status = 0
        try:
            for i, (chunk, offset) in enumerate(chunks):
                if i > 0:
                    output.write("// -----\n")
                status = max(status, self._process(chunk, file_extension, offset, output))
                output.flush()
            if output is not sys.stdout:
                output.close()
        except BrokenPipeError:
            raise
        except OSError as e:  # e.g. -o /dev/full: No space left on device
            name = self.args.output_file or "<stdout>"
            _discard_output(output)
            _fatal(f"cannot write '{name}': {e.strerror or e}")
        return status

    def _process(
        self, chunk: BytesIO, file_extension: str, offset: int, output: IO[str]
    ) -> int:
        """Parse, verify, transform and emit one chunk; its exit status."""
        expected = None
        if self.args.verify_diagnostics:
            name = self.get_input_name()
            try:
                expected = parse_expectations(chunk.getvalue(), name, offset)
            except ParseError as e:
                return self._report(format_exception(e))
        timing = TimingReport() if self.args.time_passes else None
        try:
            text = self._compile(chunk, file_extension, offset, timing)
        except PassBrokeIRError as e:  # not the input's fault: a bug in the pass
            return self._internal_error(e, text=format_exception(e))
        except (ParseError, DiagnosticException) as e:
            if expected is not None:
                return self._check(
                    expected, collect_diagnostics(e, self.get_input_name())
                )
            quiet = self.args.parsing_diagnostics and isinstance(e, ParseError)
            if quiet:
                sys.stdout.write(format_exception(e, self.get_input_name()))
                return 0
            return self._report(format_exception(e, self.get_input_name()))
        except PassCrashError as e:
            return self._internal_error(e.cause, f"pass '{e.pass_name}' crashed")
        except _TargetCrash as e:
            return self._internal_error(e.cause, f"target '{e.target}' crashed")
        except Exception as e:
            return self._internal_error(e)
        finally:
            chunk.close()
            if timing is not None and timing.rows:
                sys.stdout.flush()
                sys.stderr.write(timing.format())
        output.write(text)
        return 0 if expected is None else self._check(expected, [])

    def _compile(
        self,
        chunk: IO[bytes],
        file_extension: str,
        offset: int,
        timing: TimingReport | None,
    ) -> str:
        """One chunk's output text; raises its diagnostics."""
        start = time.perf_counter()
        try:
            module = self.parse_chunk(chunk, file_extension, offset)
            if module is None:
                return ""
            if not self.args.disable_verify:
                verify_module(module)
            if timing is not None:
                timing.add("(parse)", time.perf_counter() - start)
            if self.args.cost_report:
                return self._cost_report(module)
            self.pass_manager.timing = timing
            self.apply_passes(module)
            start = time.perf_counter()
            text = self._emit(module)
        except RecursionError:
            raise DiagnosticException("input nests too deeply") from None
        except PassCrashError as e:
            if isinstance(e.cause, RecursionError):
                msg = (
                    f"pass '{e.pass_name}' failed: recursion too deep "
                    "(input nests too deeply?)"
                )
                raise DiagnosticException(msg) from None
            raise
        if timing is not None:
            timing.add("(output)", time.perf_counter() - start)
        return text

    def _cost_report(self, module: ModuleOp) -> str:
        """The ``--cost-report`` text of every attention function in ``module``."""
        from attnfuse.cost.program_shape import shape_of  # loads the attn dialect
        from attnfuse.cost.report import cost_report
        from attnfuse.program import analyze, find_functions

        target = get_target(self.args.device)
        reports = []
        for function in find_functions(module):
            shape = shape_of(analyze(function), self.args.seq_len, self.args.batch, target=target)
            reports.append(cost_report(function.sym_name.data, shape, target))
        return "".join(reports)

    def _emit(self, module: ModuleOp) -> str:
        try:
            return self.output_resulting_program(module)
        except (ImportError, PassUnavailableError) as e:
            name = parse_spec(self.args.target).name
            raise DiagnosticException(f"target '{name}' is unavailable: {e}") from e
        except (DiagnosticException, RecursionError):
            raise
        except Exception as e:
            raise _TargetCrash(parse_spec(self.args.target).name, e) from e

    def _check(self, expected: list[Expectation], emitted: list[Diagnostic]) -> int:
        """Compare diagnostics with annotations; report mismatches (status 1)."""
        failures = check_diagnostics(expected, emitted)
        for failure in failures:
            self._report(failure.format())
        return EXIT_ERROR if failures else 0

    def _report(self, text: str) -> int:
        """Print a diagnostic to stderr; the exit status of a user error."""
        sys.stdout.flush()
        sys.stderr.write(text)
        return EXIT_ERROR

    def _internal_error(
        self, exc: BaseException, what: str = "internal error", text: str | None = None
    ) -> int:
        """Report a bug (not the user's fault) as ``text`` or ``what: exc``; exit 3."""
        sys.stdout.flush()
        if text is None:
            msg = f"{what}: {type(exc).__name__}: {exc}".replace("\n", " ")
            text = format_diagnostic(msg, filename=self.get_input_name())
        sys.stderr.write(text)
        if os.environ.get("ATTNFUSE_TRACEBACK"):
            traceback.print_exception(exc, file=sys.stderr)
        else:
            sys.stderr.write(
                "note: this is a bug in AttnFuse or a plugin; "
                "set ATTNFUSE_TRACEBACK=1 for the Python traceback\n"
            )
        return EXIT_INTERNAL


class _TargetCrash(Exception):
    """A target raised an unexpected exception (a compiler bug)."""

    def __init__(self, target: str, cause: BaseException) -> None:
        super().__init__(target)
        self.target = target
        self.cause = cause


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit cannot fail again."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (e.g. captured by pytest)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _discard_output(output: IO[str]) -> None:
    """Drop what could not be written to ``output``."""
    if output is sys.stdout:
        _discard_stdout()
        return
    try:
        output.close()
    except OSError:
        pass  # the buffered text is lost: that is the error being reported


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point (``attnfuse-opt``)."""
    try:
        try:
            AttnfuseOptMain(args=argv).run()
        finally:
            sys.stdout.flush()  # report a full disk here, not at interpreter exit
    except SystemExit:
        raise
    except KeyboardInterrupt:
        _fatal("interrupted", 130)
    except BrokenPipeError:  # e.g. `attnfuse-opt --list-passes | head`
        _discard_stdout()
        raise SystemExit(EXIT_ERROR) from None
    except OSError as e:  # e.g. `attnfuse-opt --help > /dev/full`
        _discard_stdout()
        _fatal(f"cannot write '<stdout>': {e.strerror or e}")
    except BaseException as e:  # last resort: never a bare traceback
        sys.stderr.write(format_diagnostic(f"internal error: {type(e).__name__}: {e}"))
        if os.environ.get("ATTNFUSE_TRACEBACK"):
            traceback.print_exception(e, file=sys.stderr)
        raise SystemExit(EXIT_INTERNAL) from None


if __name__ == "__main__":
    main()
