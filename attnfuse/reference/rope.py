"""Rotary embedding tables of the reference semantics (float64).

`inv_freq[i] = theta^(-2i / rd)` for `i < rd / 2`, then rescaled by the `scaling` option
exactly as Hugging Face transformers' `ROPE_INIT_FUNCTIONS` do (`linear`, `llama3`,
`yarn`), but in float64. `rd` is the rotary width (`rotary_dim`, default head_dim). The
parameters and frequencies are `attnfuse.analysis.rope`'s (shared with the lowering).
"""

from __future__ import annotations

import torch

from attnfuse.analysis.rope import RopeParams, inverse_frequencies, yarn_attention_factor

__all__ = ["RopeParams", "apply_rope", "cos_sin", "inverse_frequencies", "yarn_attention_factor"]


def cos_sin(p: RopeParams, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`cos` and `sin` of `positions[..., None] * inv_freq`, shape `[..., rd / 2]`.

    Yarn multiplies both by its attention factor.
    """
    angles = positions.to(torch.float64)[..., None] * torch.tensor(inverse_frequencies(p), dtype=torch.float64, device=positions.device)
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
