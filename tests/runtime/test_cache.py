"""The disk cache cannot run planted code, heals bad entries, and keys user passes.

Every test compiles the same tiny program into its own cache directory and checks the
result against the float64 reference, so "the cache was refused" still means "the call
was right".
"""

from __future__ import annotations

import importlib._bootstrap_external as bootstrap
import json
import os
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import attnfuse
from attnfuse import reference
from attnfuse.pass_manager import load_pass_plugin, unregister_pass
from attnfuse.runtime import cache, loader
from attnfuse.testing import assert_close
from tiny import TINY

PIPELINE = "attn-canonicalize,rope-fusion,online-softmax,mask-tiling,lower-to-tile"


def payload(marker: Path) -> str:
    """Python that proves it ran by creating `marker`."""
    return f"open({str(marker)!r}, 'w').write('pwned')\n"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(directory))
    monkeypatch.setattr(loader, "_loaded", {})  # a fresh process, as far as kernels go
    return directory


def run_checked(pipeline: str = PIPELINE) -> attnfuse.AttentionFunction:
    fn = attnfuse.compile(TINY, pipeline=pipeline)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 13, 32, generator=g) for _ in range(3))
    assert_close(fn(q, k, v), reference.run(TINY, q, k, v))
    return fn


def entries(directory: Path) -> list[Path]:
    programs = directory / "programs"
    return sorted(programs.glob("*.json")) if programs.is_dir() else []


def test_cache_dir_is_private(cache_dir: Path) -> None:
    fn = run_checked()
    again = attnfuse.compile(TINY, pipeline=PIPELINE)  # from the cache: the same metadata
    assert again._host.metadata == fn._host.metadata  # noqa: SLF001
    assert (cache_dir.stat().st_mode & 0o777) == 0o700
    (entry,) = entries(cache_dir)
    assert (entry.stat().st_mode & 0o077) == 0
    assert not [p for p in cache_dir.rglob("*") if p.suffix in (".py", ".pyc", ".tmp")]


def _planted_entry(cache_dir: Path, marker: Path) -> Path:
    """A well-formed entry (valid digest) whose kernel source runs `payload`."""
    run_checked()
    (path,) = entries(cache_dir)
    entry = json.loads(path.read_text())
    entry["program"]["source"] = payload(marker) + entry["program"]["source"]
    entry["digest"] = cache._digest(entry["program"])  # noqa: SLF001 - the attacker can hash too
    path.write_text(json.dumps(entry))
    return path


@pytest.mark.parametrize("how", ["other owner", "world-writable", "group-writable"])
def test_planted_entry_in_unsafe_dir_is_not_used(cache_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    marker = tmp_path / "marker"
    _planted_entry(cache_dir, marker)
    monkeypatch.setattr(loader, "_loaded", {})
    if how == "other owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory to another user")
        os.chown(cache_dir, 4242, 4242)
    else:
        cache_dir.chmod(0o777 if how == "world-writable" else 0o770)
    with pytest.warns(cache.CacheWarning, match="compiling without the disk cache"):
        run_checked()
    assert not marker.exists()


def test_planted_bytecode_never_runs(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel source is run from memory: a `.py` with the right content next to a
    planted `__pycache__` `.pyc` whose header matches it (what an import would run) is
    never read."""
    fn = run_checked()
    marker = tmp_path / "marker"
    source = fn.triton_source
    digest = loader.source_digest(source)
    for directory in (cache_dir / "triton", cache_dir, cache_dir / "programs"):
        directory.mkdir(exist_ok=True)
        py = directory / f"kernels_{digest[:32]}.py"
        py.write_text(source)
        stats = py.stat()
        code = compile(payload(marker) + source, str(py), "exec")
        pyc = Path(bootstrap.cache_from_source(str(py)))
        pyc.parent.mkdir(exist_ok=True)
        pyc.write_bytes(bootstrap._code_to_timestamp_pyc(code, int(stats.st_mtime), stats.st_size))  # noqa: SLF001
    monkeypatch.setattr(loader, "_loaded", {})
    for name in [m for m in sys.modules if m.startswith("attnfuse_kernels_")]:
        monkeypatch.delitem(sys.modules, name)
    run_checked()
    assert not marker.exists()


def _bad_entries(other: str) -> dict[str, object]:
    return {
        "null": None,
        "list": [1, 2],
        "missing key": {"format": cache.FORMAT, "key": "x", "digest": "y"},
        "another program": json.loads(other),
        "tampered": "tampered",
        "not json": "not json",
        "directory": "directory",
    }


@pytest.mark.parametrize("shape", list(_bad_entries("null")))
def test_malformed_entry_is_healed(cache_dir: Path, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    run_checked(PIPELINE.replace("lower-to-tile", "lower-to-tile{count-tiles=true}"))
    (other,) = entries(cache_dir)
    other_text = other.read_text()
    other.unlink()
    run_checked()
    (path,) = entries(cache_dir)
    good = json.loads(path.read_text())
    bad = _bad_entries(other_text)[shape]
    path.unlink()
    if bad == "directory":
        path.mkdir()
        (path / "x").write_text("{}")
    elif bad == "tampered":
        good["program"]["source"] += "\n# edited\n"
        path.write_text(json.dumps(good))
    elif bad == "not json":
        path.write_text("{not json")
    else:
        path.write_text(json.dumps(bad))
    monkeypatch.setattr(loader, "_loaded", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error", cache.CacheWarning)
        run_checked()
        run_checked()  # the healed entry is used
    key = path.stem
    healed = cache.load(key)
    assert healed is not None and path.is_file()
    assert json.loads(path.read_text())["key"] == key


def test_unusable_cache_dir_runs_uncached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(blocker / "cache"))  # under a regular file
    with pytest.warns(cache.CacheWarning, match="cannot create"):
        run_checked()


def test_unwritable_cache_dir_runs_uncached(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (cache_dir / "programs").mkdir(parents=True, mode=0o700)
    cache_dir.chmod(0o700)
    if os.geteuid() == 0:  # root writes through permissions: refuse the write itself

        def refuse(*_: object, **__: object) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(cache.tempfile, "mkstemp", refuse)
    else:
        (cache_dir / "programs").chmod(0o500)
    with pytest.warns(cache.CacheWarning, match="cannot write"):
        run_checked()
    assert not entries(cache_dir)


PLUGIN = '''
from dataclasses import dataclass
from xdsl.passes import ModulePass

@dataclass(frozen=True)
class NoOpPass(ModulePass):
    """Does nothing ({version})."""

    name = "test-cache-noop"

    def apply(self, ctx, op):
        return None
'''


def test_editing_a_user_pass_changes_the_key(cache_dir: Path, tmp_path: Path) -> None:
    plugin = tmp_path / "noop_plugin.py"
    plugin.write_text(textwrap.dedent(PLUGIN.format(version="v1")))
    load_pass_plugin(plugin)
    try:
        pipeline = "test-cache-noop," + PIPELINE
        run_checked(pipeline)
        run_checked(pipeline)
        assert len(entries(cache_dir)) == 1
        plugin.write_text(textwrap.dedent(PLUGIN.format(version="v2 with a longer docstring")))
        run_checked(pipeline)
        assert len(entries(cache_dir)) == 2
    finally:
        unregister_pass("test-cache-noop")
