"""RoPE parameters and frequencies of an `attn.rope` op, in float64 without torch.

The lowering (cos/sin tables, in-kernel rotations, the paged append) and the reference
semantics (`attnfuse.reference.rope`) share these values, so compile-time code needs
no tensor library:

```mlir
%qr = attn.rope %q {theta = 500000.0, scaling = "llama3", factor = 8.0} : tensor<?x32x?x128xbf16>
```

`inverse_frequencies(RopeParams.of(op))` gives the `rotary_dim / 2` frequencies after
scaling (none, linear, llama3 as Hugging Face's `_compute_llama3_parameters`, yarn as
`_compute_yarn_parameters`), `yarn_attention_factor` the cos/sin multiplier of yarn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

from attnfuse.dialects.attn import RopeOp

if TYPE_CHECKING:
    from attnfuse.program import AttentionProgram

__all__ = ["NO_BACKWARD_BOTTOM_RIGHT", "RopeParams", "bottom_right_rope", "inverse_frequencies",
           "rope_inverse_frequencies", "yarn_attention_factor"]

NO_BACKWARD_BOTTOM_RIGHT = (
    'a Q rope with align = "bottom_right" is for decoding: lower-backward builds no backward for it '
    "(give positions instead to train)")
"""Why a program whose Q rope is aligned bottom-right has no gradient."""


def bottom_right_rope(program: AttentionProgram) -> RopeOp | None:
    """The program's Q rope aligned bottom-right (`align = "bottom_right"`), or None."""
    return next((t for t in program.q.transforms if isinstance(t, RopeOp) and t.bottom_right()), None)


@dataclass(frozen=True)
class RopeParams:
    """The options of one `attn.rope`, resolved to values."""

    rotary_dim: int
    theta: float = 10000.0
    style: str = "half"
    scaling: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: int = 1
    attention_factor: float | None = None

    @classmethod
    def of(cls, op: RopeOp) -> RopeParams:
        """The resolved options of an `attn.rope` op (defaults filled in)."""
        attention_factor = op.option("attention_factor")
        return cls(
            rotary_dim=op.rotary_width(),
            theta=op.float_option("theta"),
            style=op.str_option("style"),
            scaling=op.str_option("scaling"),
            factor=op.float_option("factor"),
            low_freq_factor=op.float_option("low_freq_factor"),
            high_freq_factor=op.float_option("high_freq_factor"),
            original_max_position=op.int_option("original_max_position"),
            beta_fast=op.float_option("beta_fast"),
            beta_slow=op.float_option("beta_slow"),
            truncate=op.int_option("truncate"),
            attention_factor=None if attention_factor is None else float(attention_factor),
        )


def _exponents(p: RopeParams) -> list[float]:
    return [i / p.rotary_dim for i in range(0, p.rotary_dim, 2)]


def _llama3(p: RopeParams, inv_freq: list[float]) -> list[float]:
    """Low frequencies divided by the factor, high ones kept, smoothed in between."""
    old_len = p.original_max_position
    low_freq_wavelen = old_len / p.low_freq_factor
    high_freq_wavelen = old_len / p.high_freq_factor
    out = []
    for f in inv_freq:
        wavelen = 2 * math.pi / f
        scaled = f / p.factor if wavelen > low_freq_wavelen else f
        if high_freq_wavelen <= wavelen <= low_freq_wavelen:
            smooth = (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor)
            scaled = (1 - smooth) * scaled / p.factor + smooth * scaled
        out.append(scaled)
    return out


def _yarn_correction_dim(rotations: float, p: RopeParams) -> float:
    return (p.rotary_dim * math.log(p.original_max_position / (rotations * 2 * math.pi))) / (
        2 * math.log(p.theta)
    )


def _yarn(p: RopeParams) -> list[float]:
    """Yarn's frequencies: the ramp runs over `[low, high]` = correction dims of
    `beta_fast` / `beta_slow` (floored / ceiled when `truncate` = 1), clamped to
    `[0, rd - 1]`; `low == high` widens the ramp by 0.001."""
    low = _yarn_correction_dim(p.beta_fast, p)
    high = _yarn_correction_dim(p.beta_slow, p)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, p.rotary_dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i, e in enumerate(_exponents(p)):
        extrapolation = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
        pos_freq = p.theta**e
        out.append(1.0 / (p.factor * pos_freq) * (1 - extrapolation) + 1.0 / pos_freq * extrapolation)
    return out


def yarn_attention_factor(p: RopeParams) -> float:
    """The cos/sin multiplier of yarn: the option, else `0.1 ln(factor) + 1` (1 if factor <= 1)."""
    if p.attention_factor is not None:
        return p.attention_factor
    return 1.0 if p.factor <= 1 else 0.1 * math.log(p.factor) + 1.0


def inverse_frequencies(p: RopeParams) -> list[float]:
    """The `rd / 2` rotation frequencies after scaling (float64)."""
    if p.scaling == "yarn":
        return _yarn(p)
    inv_freq = [1.0 / (p.theta**e) for e in _exponents(p)]
    if p.scaling == "linear":
        return [f / p.factor for f in inv_freq]
    if p.scaling == "llama3":
        return _llama3(p, inv_freq)
    if p.scaling != "none":
        raise ValueError(f"attn.rope: unknown scaling '{p.scaling}'")
    return inv_freq


def rope_inverse_frequencies(op: RopeOp) -> list[float]:
    """`inverse_frequencies` of an `attn.rope` op's resolved options."""
    return inverse_frequencies(RopeParams.of(op))
