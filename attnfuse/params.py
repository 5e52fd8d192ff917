"""Program parameters: `${name}` placeholders in program text, bound at compile time.

One `.attn` file can serve several model sizes:

```mlir
func.func @llama(%q: tensor<?x${heads}x?x${head_dim}x${dtype}>, ...) {
  %qr = attn.rope %q {theta = ${theta=500000.0}} : tensor<?x${heads}x?x${head_dim}x${dtype}>
```

`attnfuse.compile(path, params={"heads": 32, "head_dim": 128, "dtype": "bf16"})` replaces
every `${name}` with the value's text before parsing; `${name=default}` has a default.
Values are ints, floats (written as the text format writes them), torch dtypes or
dtype names (`bf16`, `f16`, `f32`) and plain words (`half`, `llama3`, `top_left`). A
placeholder without a value, or a value no placeholder uses, is a `ParameterError`
naming it, with the placeholder's line and column. Comments are left alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from attnfuse.dialects.attn_types import format_option_value

__all__ = ["ParameterError", "substitute"]

_PLACEHOLDER = re.compile(r"//[^\n]*|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:=([^}\n]*))?\}")
_WORD = re.compile(r"[A-Za-z0-9_.+-]+\Z")
_DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32"}


class ParameterError(ValueError):
    """A program parameter without a value, unused, or of a value that cannot be written."""


def _format(name: str, value: object) -> str:
    if str(value) in _DTYPES:
        return _DTYPES[str(value)]
    if isinstance(value, bool):
        raise ParameterError(f"parameter {name!r}: expected an int, a float, a dtype or a word, got bool")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ParameterError(f"parameter {name!r}: {value} is not finite")
        return format_option_value(value)
    if isinstance(value, str) and _WORD.match(value):
        return value
    raise ParameterError(
        f"parameter {name!r}: expected an int, a float, a torch dtype or a word "
        f"([A-Za-z0-9_.+-]), got {type(value).__name__} {value!r}"
    )


def substitute(text: str, params: Mapping[str, object] | None, filename: str = "<program>") -> str:
    """`text` with every `${name}` / `${name=default}` replaced (see the module docstring)."""
    values = dict(params or {})
    used: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name is None:  # a comment
            return match.group(0)
        used.add(name)
        if name in values:
            return _format(name, values[name])
        if default is not None:
            return default.strip()
        line = text.count("\n", 0, match.start()) + 1
        column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
        raise ParameterError(
            f"{filename}:{line}:{column}: parameter ${{{name}}} has no value; "
            f"pass params={{{name!r}: ...}} to attnfuse.compile"
        )

    result = _PLACEHOLDER.sub(replace, text)
    if unused := sorted(set(values) - used):
        placeholders = ", ".join(sorted(used)) or "none"
        raise ParameterError(
            f"{filename}: params {', '.join(map(repr, unused))} not used by the program "
            f"(its parameters: {placeholders})"
        )
    return result
