"""Context parallelism: ring attention of compiled AttnFuse programs over a process group.

```python
import torch.distributed as dist
from attnfuse.distributed import RingAttention

dist.init_process_group("nccl")
ring = RingAttention(attnfuse.attention(32, 128, kv_heads=8).rope(theta=5e5).causal())
q, k, v = (ring.shard(t) for t in (q_full, k_full, v_full))   # zigzag shards [B, H, S / world, D]
out = ring(q, k, v)                                          # this rank's shard of the output
```

Importing this package initialises nothing; see docs/pytorch.md, "Context parallelism".
"""

from __future__ import annotations

from attnfuse.distributed.ring import RingAttention
from attnfuse.distributed.sharding import global_positions, shard, unshard
from attnfuse.ring_split import RingSplitError

__all__ = ["RingAttention", "RingSplitError", "global_positions", "shard", "unshard"]
