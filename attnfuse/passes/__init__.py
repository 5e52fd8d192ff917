"""AttnFuse's pass registry.

Where a pass name resolves, lowest to highest precedence: xDSL's own passes
(``canonicalize``, ``cse``, ...); AttnFuse's passes (:data:`PASSES`); third-party
passes published under the ``attnfuse.passes`` entry point group; passes registered
at run time with :func:`register_pass` or :func:`load_pass_plugin`
(``attnfuse-opt --pass-plugin FILE.py``). :func:`available_passes` merges them.

One pass per module: the pass named ``rope-fusion`` lives in
``attnfuse/passes/rope_fusion.py``. :data:`PASSES` maps each pass name to
``"module"`` or ``"module:Class"``; modules are imported only when the pass is used.
With the ``"module"`` form the module must define exactly one ``ModulePass`` subclass
whose ``name`` is the pass name.

To add a pass to AttnFuse itself: write ``attnfuse/passes/<snake_name>.py`` with a
frozen-dataclass ``ModulePass`` whose ``name`` is the kebab-case name, then add one line
to :data:`PASSES`. Users' own passes register through
:func:`attnfuse.pass_manager.register_pass` or the ``attnfuse.passes`` entry point group
instead (see docs/extending.md).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType

from xdsl.passes import ModulePass

__all__ = [
    "BSHD_PIPELINE",
    "DEFAULT_PIPELINE",
    "default_pipeline",
    "ENTRY_POINT_GROUP",
    "PASSES",
    "PassFactory",
    "PassPluginError",
    "PassUnavailableError",
    "available_passes",
    "get_all_passes",
    "load_pass_plugin",
    "pass_fingerprint",
    "pass_summary",
    "register_pass",
    "resolve_pass",
    "unregister_pass",
]

ENTRY_POINT_GROUP = "attnfuse.passes"
"""Entry point group for third-party passes: ``my-pass = "my_pkg.passes:MyPass"``."""

PassFactory = Callable[[], type[ModulePass]]
"""A zero-argument callable returning a pass class (xDSL's registry convention)."""

PASSES: dict[str, str] = {
    "attn-canonicalize": "attnfuse.passes.attn_canonicalize",
    "rope-fusion": "attnfuse.passes.rope_fusion",
    "online-softmax": "attnfuse.passes.online_softmax",
    "mask-tiling": "attnfuse.passes.mask_tiling",
    "split-kv": "attnfuse.passes.split_kv",
    "lower-backward": "attnfuse.passes.lower_backward",
    "lower-to-tile": "attnfuse.passes.lower_to_tile",
}
"""Pass name -> ``"module"`` or ``"module:Class"`` for every pass shipped with AttnFuse."""

DEFAULT_PIPELINE: str = (
    "attn-canonicalize,rope-fusion{strategy=auto},online-softmax,mask-tiling,split-kv,"
    "lower-backward,lower-to-tile"
)
"""The pipeline ``attnfuse-opt -t triton`` (and the Python API) runs by default."""



def default_pipeline(options: Mapping[str, str] | None = None, *, without: Iterable[str] = ()) -> str:
    """`DEFAULT_PIPELINE` with the options of some passes replaced (`options`: pass name
    -> option text, e.g. `"strategy=fused"` or `"grad-layout=sbhd block-m=64"`) and some
    passes left out, in the same order:

    ```python
    default_pipeline({"rope-fusion": "strategy=fused"}, without=["split-kv"])
    # "attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling,lower-backward,lower-to-tile"
    ```

    A name that is not a pass of the default pipeline raises a `ValueError`."""
    options = dict(options or {})
    without = set(without)
    passes = [(part.split("{", 1)[0], part) for part in DEFAULT_PIPELINE.split(",")]
    unknown = sorted((set(options) | without) - {name for name, _ in passes})
    if unknown:
        raise ValueError(f"default_pipeline: {', '.join(unknown)} not in the default pipeline "
                         f"({', '.join(name for name, _ in passes)})")
    return ",".join(f"{name}{{{options[name]}}}" if name in options else part
                    for name, part in passes if name not in without)


BSHD_PIPELINE: str = default_pipeline({"lower-backward": "grad-layout=bshd", "lower-to-tile": "out-layout=bshd"})
"""The default pipeline with the output and the gradients of q, k and v stored as
`[B, S, H, D]` (`attnfuse.nn.Attention(layout="bshd")` and the Hugging Face backend, whose
callers transpose the output and reshape it, and whose q, k and v are transposed views of
`[B, S, H * D]` projections: their backward then reshapes the gradients without a copy)."""


class PassUnavailableError(ImportError):
    """A registered pass whose module or class cannot be loaded."""


class PassPluginError(ImportError):
    """A pass plugin (``--pass-plugin``) that cannot be loaded."""


def resolve_pass(name: str, target: str) -> type[ModulePass]:
    """Import the pass ``name`` from ``target`` (``"module"`` or ``"module:Class"``)."""
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise PassUnavailableError(
                f"pass '{name}' is registered, but its module '{module_name}' "
                "does not exist"
            ) from e
        raise PassUnavailableError(
            f"pass '{name}': importing '{module_name}' failed: {e}"
        ) from e
    except ImportError as e:
        raise PassUnavailableError(
            f"pass '{name}': importing '{module_name}' failed: {e}"
        ) from e

    if class_name:
        cls = getattr(module, class_name, None)
        if not (isinstance(cls, type) and issubclass(cls, ModulePass)):
            raise PassUnavailableError(
                f"pass '{name}': '{target}' is not a ModulePass subclass"
            )
    else:
        found = [
            v
            for v in vars(module).values()
            if isinstance(v, type)
            and issubclass(v, ModulePass)
            and getattr(v, "name", None) == name
        ]
        if len(found) != 1:
            what = "no ModulePass" if not found else f"{len(found)} ModulePasses"
            raise PassUnavailableError(
                f"pass '{name}': module '{module_name}' defines {what} named '{name}'"
            )
        cls = found[0]
    if getattr(cls, "name", None) != name:
        raise PassUnavailableError(
            f"pass '{name}': class {cls.__qualname__} is named "
            f"'{getattr(cls, 'name', None)}', expected '{name}'"
        )
    return cls


def _lazy(name: str, target: str) -> PassFactory:
    def factory() -> type[ModulePass]:
        return resolve_pass(name, target)

    factory.__qualname__ = factory.__name__ = f"load_{name.replace('-', '_')}"
    factory.__doc__ = f"Load the '{name}' pass from {target}."
    return factory


def get_all_passes() -> dict[str, PassFactory]:
    """Pass name -> lazy factory, for every pass in :data:`PASSES`."""
    return {name: _lazy(name, target) for name, target in PASSES.items()}


# --------------------------------------------------- user and third-party passes

_USER_PASSES: dict[str, PassFactory] = {}


def _load_entry_point(ep: EntryPoint) -> type[ModulePass]:
    cls = ep.load()
    if not (isinstance(cls, type) and issubclass(cls, ModulePass)):
        raise PassUnavailableError(
            f"entry point '{ep.name} = {ep.value}' is not a ModulePass subclass"
        )
    return cls


def _entry_point_passes() -> dict[str, PassFactory]:
    """Passes published by installed packages under :data:`ENTRY_POINT_GROUP`."""
    return {
        ep.name: functools.partial(_load_entry_point, ep)
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    }


def available_passes(*, include_xdsl: bool = True) -> dict[str, PassFactory]:
    """Every known pass name -> lazy factory, later registries overriding earlier."""
    passes: dict[str, PassFactory] = {}
    if include_xdsl:
        from xdsl.transforms import get_all_passes as xdsl_passes

        passes.update(xdsl_passes())
    passes.update(get_all_passes())
    passes.update(_entry_point_passes())
    passes.update(_USER_PASSES)
    return passes


def register_pass(
    pass_or_factory: type[ModulePass] | PassFactory,
    *,
    name: str | None = None,
    replace: bool = False,
) -> type[ModulePass] | PassFactory:
    """Make a pass available to pipelines (``-p``) by its ``name``.

    Accepts a ``ModulePass`` subclass or a zero-argument factory returning one (the
    factory is called now unless ``name`` is given). Returns its argument, so it also
    works as a class decorator. Re-registering the same class is a no-op; taking a
    name already used by another pass needs ``replace=True``.
    """
    if isinstance(pass_or_factory, type):
        if not issubclass(pass_or_factory, ModulePass):
            raise TypeError(f"{pass_or_factory.__qualname__} is not a ModulePass")
        cls = pass_or_factory

        def factory() -> type[ModulePass]:
            return cls

        pass_name = name or getattr(cls, "name", None)
    else:
        factory = pass_or_factory
        cls = None
        pass_name = name or getattr(factory(), "name", None)
    if not isinstance(pass_name, str) or not pass_name:
        raise ValueError("a registered pass needs a `name` (ClassVar[str])")
    if not replace and pass_name in (known := available_passes()):
        if cls is None or known[pass_name]() is not cls:
            raise ValueError(
                f"a pass named '{pass_name}' is already registered; "
                "use register_pass(..., replace=True) to override it"
            )
    _USER_PASSES[pass_name] = factory
    return pass_or_factory


def unregister_pass(name: str) -> None:
    """Remove a pass registered with :func:`register_pass` (no-op if absent)."""
    _USER_PASSES.pop(name, None)


def _import_plugin(plugin: str) -> ModuleType:
    """Import a plugin given as a ``.py`` path or a dotted module name (cached)."""
    path = Path(plugin)
    if not (plugin.endswith(".py") or path.exists()):
        return importlib.import_module(plugin)
    if not path.is_file():
        raise PassPluginError(f"pass plugin '{plugin}' does not exist")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    mod_name = f"attnfuse_plugin_{path.stem}_{digest}"
    if (cached := sys.modules.get(mod_name)) is not None:
        return cached
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def load_pass_plugin(plugin: str | os.PathLike[str]) -> list[str]:
    """Import a ``.py`` file or a dotted module and register the passes it defines.

    Every concrete ``ModulePass`` subclass defined in the plugin (with a ``name``) is
    registered; the plugin may also call :func:`register_pass` itself. Returns the
    pass names. Loading a plugin again re-registers the same classes (a no-op).
    """
    try:
        module = _import_plugin(str(plugin))
    except PassPluginError:
        raise
    except Exception as e:
        raise PassPluginError(
            f"cannot load pass plugin '{plugin}': {type(e).__name__}: {e}"
        ) from e
    names: list[str] = []
    for obj in list(vars(module).values()):
        if (
            isinstance(obj, type)
            and issubclass(obj, ModulePass)
            and obj.__module__ == module.__name__
            and not inspect.isabstract(obj)
            and isinstance(getattr(obj, "name", None), str)
        ):
            register_pass(obj)
            names.append(obj.name)
    return names


def pass_summary(factory: PassFactory) -> str:
    """The first line of a pass's docstring, or why it cannot be loaded."""
    try:
        cls = factory()
    except Exception as e:
        return f"(unavailable: {e})"
    doc = cls.__dict__.get("__doc__") or ""  # not ModulePass's inherited docstring
    if doc.startswith(f"{cls.__name__}("):  # generated by @dataclass
        return ""
    return inspect.cleandoc(doc).split("\n", 1)[0].strip()


def pass_fingerprint(cls: type[ModulePass]) -> str | None:
    """What identifies a pass's code in compiled-program cache keys.

    xDSL's and AttnFuse's own passes: ``""`` (their versions are in the key already).
    Any other pass: its declared ``cache_version`` (a ``ClassVar[str]``) if it has one,
    else a hash of the source of the module that defines it, so editing a registered
    pass invalidates what it compiled; None when that source cannot be read (the
    program is then compiled without the disk cache).
    """
    if cls.__module__.split(".")[0] in ("xdsl", "attnfuse"):
        return ""
    declared = getattr(cls, "cache_version", None)
    if isinstance(declared, str):
        return f"{cls.__module__}.{cls.__qualname__}@{declared}"
    module = sys.modules.get(cls.__module__)
    try:
        source = inspect.getsource(module) if module is not None else None
    except (OSError, TypeError):
        source = None
    if source is None:
        return None
    return hashlib.sha256(source.encode()).hexdigest()
