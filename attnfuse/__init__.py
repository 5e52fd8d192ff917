"""AttnFuse: a compiler for transformer attention variants, built on xDSL, emitting Triton.

```python
import attnfuse
attention = attnfuse.compile("examples/llama3.attn")
out = attention(q, k, v)
```

CUDA tensors run compiled kernels; CPU tensors run the same kernels through the Triton
interpreter, whatever `TRITON_INTERPRET` says (importing AttnFuse changes no environment
variable). The package imports torch and triton lazily, so the `attnfuse-opt` driver
starts fast.

Compile, cache, load and launch-plan events are `logging` debug records of the
`attnfuse` logger (`logging.getLogger("attnfuse").setLevel(logging.DEBUG)` with a
handler to see them); nothing is printed by default.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnfuse.api import AttentionFunction, AttnfuseArgumentError, compile
    from attnfuse.builder import Capture, Program, attention
    from attnfuse.params import ParameterError

__all__ = ["AttentionFunction", "AttnfuseArgumentError", "Capture", "ParameterError", "Program", "attention", "compile"]
_HOMES = {"Capture": "builder", "Program": "builder", "attention": "builder", "ParameterError": "params"}
__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())  # a library: no output unless asked


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        return getattr(importlib.import_module(f"attnfuse.{_HOMES.get(name, 'api')}"), name)
    raise AttributeError(f"module 'attnfuse' has no attribute {name!r}")
