"""
The disk cache of compiled programs, safe by construction.

An entry is one JSON file, `programs/<key>.json`, holding what compiling produced: the
Triton source, the host code (MLIR text) and each kernel's launch metadata. The cache
trusts nothing it reads:

* the directory is per user: created with mode 0700, and refused (a `CacheWarning`,
  then compiling runs uncached) when it is owned by another user or is group- or
  world-writable, so no one else can plant or swap an entry;
* an entry is used only when it matches the schema, names the key it was looked up
  by, and its content hash matches; anything else (null, a list, a missing field,
  another program's entry, a directory in its place) is recompiled and overwritten;
* nothing from it is imported: the source is run from memory (`runtime.loader`), so no
  `.py` or bytecode file exists to plant;
* writes are atomic (a private temporary file, then `os.replace`), so concurrent
  writers are safe, and a directory that cannot be written makes compiling run uncached.

Triton's own `FileCacheManager` writes into Triton's cache directory with default
permissions and no ownership checks, which is why this small module exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnfuse.backends.triton.metadata import KernelMetadata

FORMAT = "attnfuse-program/3"
"""The entry format this module reads and writes."""


class CacheWarning(UserWarning):
    """The disk cache is not used (unsafe or unusable directory); compiling runs uncached."""


@dataclass(frozen=True)
class CompiledProgram:
    """What compiling a program produces, as stored in one cache entry."""

    source: str
    host: str
    kernels: dict[str, KernelMetadata]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "host": self.host,
            "kernels": {
                name: {
                    "name": m.name,
                    "arg_names": list(m.arg_names),
                    "signature": m.signature,
                    "num_warps": m.num_warps,
                    "num_stages": m.num_stages,
                    "launch": m.launch,
                    "do_not_specialize": list(m.do_not_specialize),
                    "writes": None if m.writes is None else list(m.writes),
                    "maxnreg": m.maxnreg,
                    "tma": {arg: list(block) for arg, block in m.tma.items()},
                }
                for name, m in self.kernels.items()
            },
        }


logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """`$ATTNFUSE_CACHE_DIR`, else `$XDG_CACHE_HOME/attnfuse`, else `~/.cache/attnfuse`."""
    configured = os.environ.get("ATTNFUSE_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnfuse"


def _warn(message: str) -> None:
    warnings.warn(f"{message}; compiling without the disk cache", CacheWarning, stacklevel=4)


def _private_dir(path: Path) -> bool:
    """Create `path` (0700) if missing; True when it is ours alone (else warn)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as e:
        _warn(f"cannot create the AttnFuse cache directory {path}: {e.strerror or e}")
        return False
    if not stat.S_ISDIR(info.st_mode):
        _warn(f"the AttnFuse cache directory {path} is not a directory")
        return False
    if info.st_uid != os.geteuid():
        _warn(f"the AttnFuse cache directory {path} is owned by another user (uid {info.st_uid})")
        return False
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        _warn(f"the AttnFuse cache directory {path} is writable by others "
              f"(mode {stat.S_IMODE(info.st_mode):o}); make it 0700")
        return False
    return True


def _programs_dir(cache_dir: Path | None) -> Path | None:
    root = cache_dir or default_cache_dir()
    if not _private_dir(root):
        return None
    programs = root / "programs"
    return programs if _private_dir(programs) else None


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _kernel(name: str, data: Any) -> KernelMetadata | None:
    fields = {"name": str, "arg_names": list, "signature": dict, "num_warps": int,
              "num_stages": int, "launch": dict, "do_not_specialize": list}
    if not isinstance(data, dict) or set(data) != {*fields, "writes", "maxnreg", "tma"}:
        return None
    writes, maxnreg, tma = data["writes"], data["maxnreg"], data["tma"]
    if writes is not None and not _is_str_list(writes):
        return None
    if (maxnreg is not None and (not isinstance(maxnreg, int) or isinstance(maxnreg, bool))) or not (
        isinstance(tma, dict) and all(isinstance(v, list) and all(type(x) is int for x in v) for v in tma.values())
    ):
        return None
    if any(not isinstance(data[f], t) or isinstance(data[f], bool) for f, t in fields.items()):
        return None
    signature = data["signature"]
    if (data["name"] != name or not _is_str_list(data["arg_names"])
            or not _is_str_list(data["do_not_specialize"])
            or list(signature) != data["arg_names"]
            or not all(isinstance(t, str) for t in signature.values())):
        return None
    return KernelMetadata(
        name=name, arg_names=tuple(data["arg_names"]), signature=dict(signature),
        num_warps=data["num_warps"], num_stages=data["num_stages"], launch=data["launch"],
        do_not_specialize=tuple(data["do_not_specialize"]),
        writes=None if writes is None else tuple(writes),
        maxnreg=maxnreg, tma={arg: tuple(block) for arg, block in tma.items()},
    )


def _decode(entry: Any, key: str) -> CompiledProgram | None:
    """The program an entry holds, or None when it is not a valid entry for `key`."""
    if not isinstance(entry, dict) or set(entry) != {"format", "key", "digest", "program"}:
        return None
    payload = entry["program"]
    if entry["format"] != FORMAT or entry["key"] != key or not isinstance(payload, dict):
        return None
    if set(payload) != {"source", "host", "kernels"} or entry["digest"] != _digest(payload):
        return None
    source, host, kernels = payload["source"], payload["host"], payload["kernels"]
    if not isinstance(source, str) or not isinstance(host, str) or not isinstance(kernels, dict):
        return None
    metadata = {name: _kernel(name, data) for name, data in kernels.items()}
    if any(m is None for m in metadata.values()):
        return None
    return CompiledProgram(source, host, metadata)  # type: ignore[arg-type]


def load(key: str, cache_dir: Path | None = None) -> CompiledProgram | None:
    """The cached program for `key`, or None (missing, invalid, or no usable cache)."""
    directory = _programs_dir(cache_dir)
    if directory is None:
        return None
    path = directory / f"{key}.json"
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        logger.debug("unreadable cache entry %s: %s", path, e)
        return None
    program = _decode(entry, key)
    if program is None:
        logger.debug("invalid cache entry %s: recompiling", path)
    return program


def store(key: str, program: CompiledProgram, cache_dir: Path | None = None) -> bool:
    """Write the entry for `key` atomically, replacing whatever is there; False when
    the cache is unusable (then compiling simply ran uncached)."""
    directory = _programs_dir(cache_dir)
    if directory is None:
        return False
    payload = program.to_json()
    text = json.dumps({"format": FORMAT, "key": key, "digest": _digest(payload), "program": payload})
    path = directory / f"{key}.json"
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # a directory in an entry's place: heal it
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        _warn(f"cannot write to the AttnFuse cache directory {directory}: {e.strerror or e}")
        return False
    logger.debug("stored cache entry %s", path)
    return True
