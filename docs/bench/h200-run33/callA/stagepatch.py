"""Experiment: the 16-row split kernel's pipeline depth (monkeypatched split_stages)."""
import attnfuse.lowering.split_kv as sk
from attnfuse.analysis.split_kv import SMALL_ROWS
_orig = sk.split_stages
DEPTH = {"small": None}
def _patched(spec, rows, block_n):
    s = _orig(spec, rows, block_n)
    if rows == SMALL_ROWS and DEPTH["small"] is not None:
        return DEPTH["small"] + (2 if spec.paged is not None else 0)
    return s
sk.split_stages = _patched
