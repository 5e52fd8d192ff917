"""Bands: the kept set of affine masks, and the key rows a band-skipping kernel loads.

A causal mask keeps `kv - q <= 0`, a sliding window `-left <= kv - q <= right`; both are a
`Band`. `attn-canonicalize` merges them, `mask-tiling` records them in the tile plan
(`lower-to-tile` derives its KV loop bounds from it) and the cost model counts with
`visited_kv_rows` the key rows those loops load.

```mlir
%m = attn.mask sliding_window %s {left = 4095, right = 0} : !attn.scores<?x16x?x?xf32>
```
keeps `Band(lower=-4095, upper=0)`.

Plain Python (no xDSL): the cost model imports it at the driver's start-up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Band:
    """`lower <= kv - q - diag <= upper` (None: unbounded); `diag` is 0 (`align =
    "top_left"`) or `kv_len - q_len` (`"bottom_right"`: the last query sees the last key)."""

    lower: int | None
    upper: int | None
    align: str = "top_left"

    def intersect(self, other: Band) -> Band | None:
        """The band of both constraints, or None when the alignments differ."""
        if self.align != other.align:
            return None

        def pick(a: int | None, b: int | None, f: type[max] | type[min]) -> int | None:
            return b if a is None else a if b is None else f(a, b)

        return Band(pick(self.lower, other.lower, max), pick(self.upper, other.upper, min), self.align)

    def keeps_a_key_per_row(self) -> bool:
        """Whether every query row keeps a key whatever the lengths: no lower bound, and no
        upper bound or a top-left one that keeps the diagonal (query i keeps key 0)."""
        return self.lower is None and (self.upper is None or (self.align == "top_left" and self.upper >= 0))


def visited_kv_rows(band: Band, q_len: int, kv_len: int, block_m: int, block_n: int) -> int:
    """Key rows one (batch, head) loads over all its q blocks when each q block visits
    the whole KV blocks from the one holding its first kept key to the one holding its
    last (the loop bounds `lower-to-tile` derives); rows past `kv_len` are not loaded."""
    diag = kv_len - q_len if band.align == "bottom_right" else 0
    rows = 0
    for start in range(0, q_len, block_m):
        end = min(q_len, start + block_m)
        lo = 0 if band.lower is None else max(0, start + diag + band.lower)
        hi = kv_len if band.upper is None else min(kv_len, end + diag + band.upper)
        if hi > lo:
            rows += min(kv_len, -(-hi // block_n) * block_n) - lo // block_n * block_n
    return rows
