"""AttnFuse: a compiler for transformer attention variants, built on xDSL, emitting Triton.

```python
import attnfuse
attention = attnfuse.compile("examples/llama3.attn")
out = attention(q, k, v)
```

On a machine without CUDA, kernels run through the Triton interpreter, which Triton
selects when it is imported: using the Python API before importing triton sets
`TRITON_INTERPRET=1` in that case (set it yourself to `0` to opt out). The package
imports torch and triton lazily, so the `attnfuse-opt` driver starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnfuse.api import AttentionFunction, AttnfuseArgumentError, compile

__all__ = ["AttentionFunction", "AttnfuseArgumentError", "compile"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in __all__:
        from attnfuse import api

        return getattr(api, name)
    raise AttributeError(f"module 'attnfuse' has no attribute {name!r}")
