"""Rotary embedding tables of the reference semantics (float64).

`inv_freq[i] = theta^(-2i / rd)` for `i < rd / 2`, then rescaled by the `scaling` option
exactly as Hugging Face transformers' `ROPE_INIT_FUNCTIONS` do (`linear`, `llama3`,
`yarn`), but in float64. `rd` is the rotary width (`rotary_dim`, default head_dim).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnfuse.dialects.attn import RopeOp

__all__ = ["RopeParams", "apply_rope", "cos_sin", "inverse_frequencies", "yarn_attention_factor"]


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


def _default_inv_freq(p: RopeParams) -> torch.Tensor:
    exponents = torch.arange(0, p.rotary_dim, 2, dtype=torch.float64) / p.rotary_dim
    return 1.0 / (p.theta**exponents)


def _llama3(p: RopeParams, inv_freq: torch.Tensor) -> torch.Tensor:
    """HF `_compute_llama3_parameters`: low frequencies / factor, high kept, smooth between."""
    old_len = p.original_max_position
    low_freq_wavelen = old_len / p.low_freq_factor
    high_freq_wavelen = old_len / p.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / p.factor, inv_freq)
    smooth = (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor)
    smoothed = (1 - smooth) * scaled / p.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_correction_dim(rotations: float, p: RopeParams) -> float:
    return (p.rotary_dim * math.log(p.original_max_position / (rotations * 2 * math.pi))) / (
        2 * math.log(p.theta)
    )


def _yarn(p: RopeParams) -> torch.Tensor:
    """HF `_compute_yarn_parameters` (inverse frequencies only).

    The ramp runs over `[low, high]` = correction dims of `beta_fast` / `beta_slow`
    (floored / ceiled when `truncate` = 1), clamped to `[0, rd - 1]`; `low == high` widens
    the ramp by 0.001 as HF does.
    """
    low = _yarn_correction_dim(p.beta_fast, p)
    high = _yarn_correction_dim(p.beta_slow, p)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, p.rotary_dim - 1)
    if low == high:
        high += 0.001
    half = p.rotary_dim // 2
    ramp = ((torch.arange(half, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_factor = 1 - ramp
    pos_freqs = p.theta ** (torch.arange(0, p.rotary_dim, 2, dtype=torch.float64) / p.rotary_dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (p.factor * pos_freqs)
    return interpolated * (1 - extrapolation_factor) + extrapolated * extrapolation_factor


def yarn_attention_factor(p: RopeParams) -> float:
    """The cos/sin multiplier of yarn: the option, else `0.1 ln(factor) + 1` (1 if factor <= 1)."""
    if p.attention_factor is not None:
        return p.attention_factor
    return 1.0 if p.factor <= 1 else 0.1 * math.log(p.factor) + 1.0


def inverse_frequencies(p: RopeParams) -> torch.Tensor:
    """The `rd / 2` rotation frequencies after scaling (float64)."""
    if p.scaling == "yarn":
        return _yarn(p)
    inv_freq = _default_inv_freq(p)
    if p.scaling == "linear":
        return inv_freq / p.factor
    if p.scaling == "llama3":
        return _llama3(p, inv_freq)
    if p.scaling != "none":
        raise ValueError(f"attn.rope: unknown scaling '{p.scaling}'")
    return inv_freq


def cos_sin(p: RopeParams, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`cos` and `sin` of `positions[..., None] * inv_freq`, shape `[..., rd / 2]`.

    Yarn multiplies both by its attention factor.
    """
    angles = positions.to(torch.float64)[..., None] * inverse_frequencies(p).to(positions.device)
    cos, sin = torch.cos(angles), torch.sin(angles)
    if p.scaling == "yarn":
        factor = yarn_attention_factor(p)
        cos, sin = cos * factor, sin * factor
    return cos, sin


def apply_rope(x: torch.Tensor, p: RopeParams, positions: torch.Tensor) -> torch.Tensor:
    """Rotate the first `rd` dims of `x` (`[B, H, S, D]`); dims `>= rd` pass through.

    `positions` is `[S]` or `[B, S]`. Style `half` pairs dim `i` with `i + rd/2` (HF
    `rotate_half`); `interleaved` pairs `2i` with `2i + 1` (GPT-J). Pair `(x1, x2)` at
    frequency `i` becomes `(x1 cos - x2 sin, x2 cos + x1 sin)`.
    """
    rd = p.rotary_dim
    cos, sin = cos_sin(p, positions)
    if positions.dim() == 2:  # [B, S, rd/2] -> [B, 1, S, rd/2]
        cos, sin = cos[:, None], sin[:, None]
    rot, rest = x[..., :rd], x[..., rd:]
    if p.style == "half":
        x1, x2 = rot[..., : rd // 2], rot[..., rd // 2 :]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    elif p.style == "interleaved":
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    else:
        raise ValueError(f"attn.rope: unknown style '{p.style}'")
    return torch.cat([out, rest], dim=-1)
