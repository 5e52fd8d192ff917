"""The :class:`~attnfuse.cost.model.AttentionShape` of an attention program.

Heads, head dim and dtype come from the program's types; the mask from its
``attn.mask`` ops (causal, or a sliding window looking back); sequence length and
batch, which programs leave dynamic, from the caller; which forward kernel runs from
the target: on a warp-specialized one (sm_90) the Gluon schedule, where the dtype,
head dims and sequence length allow it.
"""

from __future__ import annotations

from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, TensorType

from attnfuse.analysis.masks import mask_band
from attnfuse.analysis.tile_plan import default_block_sizes
from attnfuse.cost.model import HOPPER_FUSED_TILES, AttentionShape
from attnfuse.cost.target import Target
from attnfuse.dialects.attn import MaskOp, QKNormOp
from attnfuse.lowering.hopper_forward import BLOCK_M as HOPPER_ROWS
from attnfuse.lowering.hopper_forward import HEAD_DIMS as HOPPER_HEAD_DIMS
from attnfuse.program import AttentionProgram

__all__ = ["BENCH_TOKENS", "DEFAULT_SEQ_LEN", "gluon_takes", "shape_of"]

DEFAULT_SEQ_LEN = 4096
"""S assumed when neither the program nor the caller fixes it (Llama-3-8B training)."""
BENCH_TOKENS = 16384
"""batch x S assumed when the caller gives no batch (docs/benchmarks.md's convention)."""

_DTYPES = ((BFloat16Type, "bf16"), (Float16Type, "f16"), (Float32Type, "f32"))


def _mask(program: AttentionProgram) -> tuple[bool, int | None]:
    """(causal, window) of the program's masks; other masks count as full."""
    causal, window = False, None
    for op in program.score_ops:
        if not isinstance(op, MaskOp):
            continue
        kind = op.kind_name
        if kind in ("causal", "prefix_lm"):
            causal = True
        elif kind == "sliding_window":
            band = mask_band(op)
            causal |= band.upper == 0
            window = None if band.lower is None else -band.lower
    return causal, window


def gluon_takes(seq_len: int) -> bool:
    """Whether the Gluon forward can run at `seq_len`: its TMA tiles need S to be a
    multiple of their rows (`host.tma_ready`'s `rows`); other S run the Triton kernels."""
    return seq_len % HOPPER_ROWS == 0


def shape_of(
    program: AttentionProgram, seq_len: int = 0, batch: int = 0, *, block_m: int = 128, block_n: int = 0,
    target: Target | None = None,
) -> AttentionShape:
    """The shape of ``program`` at ``seq_len`` (0: the program's static S, else
    :data:`DEFAULT_SEQ_LEN`) and ``batch`` (0: :data:`BENCH_TOKENS` / S, at least 1) on
    ``target``. On a warp-specialized target a bf16 / f16 program with head dim 64 or 128
    counts as running the Gluon forward where :func:`gluon_takes` S (its other
    conditions, e.g. no runtime block map, sinks or dropout, are not checked here)."""
    q_type = program.scores.q.type
    assert isinstance(q_type, TensorType)
    dims = q_type.get_shape()
    hq, hkv, _ = program.heads
    if not seq_len:
        seq_len = dims[2] if dims[2] > 0 else DEFAULT_SEQ_LEN
    dtype = next((name for kind, name in _DTYPES if isinstance(q_type.element_type, kind)), "f32")
    causal, window = _mask(program)
    v_type = program.func.args[program.v_arg].type
    assert isinstance(v_type, TensorType)
    hopper = (target is not None and target.warp_specialized and dtype in ("bf16", "f16")
              and dims[3] in HOPPER_HEAD_DIMS and v_type.get_shape()[3] == dims[3] and gluon_takes(seq_len))
    fused_m, fused_n = HOPPER_FUSED_TILES if hopper else default_block_sizes(program, k_in_kernel=True)
    return AttentionShape(
        batch=batch or max(1, BENCH_TOKENS // seq_len),
        q_heads=hq,
        kv_heads=hkv,
        seq_len=seq_len,
        head_dim=dims[3],
        dtype=dtype,
        causal=causal,
        window=window,
        block_m=block_m,
        block_n=block_n or default_block_sizes(program, k_in_kernel=False)[1],
        fused_block_m=fused_m,
        fused_block_n=fused_n,
        hopper=hopper,
        q_norm=any(isinstance(t, QKNormOp) for t in program.q.transforms),
        k_norm=any(isinstance(t, QKNormOp) for t in program.k.transforms),
    )
