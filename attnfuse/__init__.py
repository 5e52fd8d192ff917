"""AttnFuse: a compiler for transformer attention variants, built on xDSL, emitting Triton.

```python
import attnfuse
attention = attnfuse.compile("examples/llama3.attn")
out = attention(q, k, v)
```

On a machine without CUDA, kernels run through the Triton interpreter, which Triton
selects when it is imported: importing attnfuse before triton sets `TRITON_INTERPRET=1`
in that case (set it yourself to `0` to opt out).
"""

from __future__ import annotations

import os as _os
import sys as _sys

if "TRITON_INTERPRET" not in _os.environ and "triton" not in _sys.modules:
    import torch as _torch

    if not _torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"

from attnfuse.api import AttentionFunction, AttnfuseArgumentError, compile  # noqa: E402

__all__ = ["AttentionFunction", "AttnfuseArgumentError", "compile"]
__version__ = "0.1.0"
