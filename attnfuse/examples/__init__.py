"""The example `.attn` programs shipped with AttnFuse.

Each example is one real model's attention (Llama 3, Gemma 2, Qwen3, gpt-oss, ...), with a
header comment citing the model configuration it follows.

```python
from attnfuse import examples

examples.names()                      # ['alibi', 'document', ..., 't5_bias']
text = examples.path("gemma2").read_text()
```

From a source checkout the files are read from the repository's top-level `examples/`
directory (so edits there are seen at once); an installed package reads its own copy
(`attnfuse/examples/*.attn`, package data). `tests/test_examples.py` checks that the two
copies are identical.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SUFFIX", "directory", "names", "path"]

SUFFIX = ".attn"
"""File extension of AttnFuse programs."""

_PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT_ROOT = _PACKAGE_DIR.parent.parent


def _checkout_dir() -> Path | None:
    """The repository's `examples/` directory when running from a source checkout."""
    candidate = _CHECKOUT_ROOT / "examples"
    in_checkout = (_CHECKOUT_ROOT / "pyproject.toml").is_file() and candidate.is_dir()
    if in_checkout and any(candidate.glob(f"*{SUFFIX}")):
        return candidate
    return None


def directory() -> Path:
    """The directory the examples are read from: the checkout's, else the package's."""
    return _checkout_dir() or _PACKAGE_DIR


def names() -> list[str]:
    """Sorted names of the examples (file stems, e.g. `"llama3"`)."""
    return sorted(p.stem for p in directory().glob(f"*{SUFFIX}"))


def path(name: str) -> Path:
    """The path of example `name` (`"gemma2"` or `"gemma2.attn"`).

    Raises `FileNotFoundError` naming the known examples when there is no such example.
    """
    stem = name.removesuffix(SUFFIX)
    if not stem or "/" in stem or "\\" in stem:
        raise FileNotFoundError(f"invalid example name {name!r}")
    found = directory() / f"{stem}{SUFFIX}"
    if not found.is_file():
        raise FileNotFoundError(
            f"no example named {name!r} (known: {', '.join(names()) or 'none'})"
        )
    return found
