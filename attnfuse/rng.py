"""Philox-4x32-10 in torch int64 arithmetic, bit-exact with Triton 3.6 `tl.rand`.

Triton's `tl.rand(seed, offset)` (see `triton/language/random.py`):

* the seed is cast to uint64 and split into the Philox key `k0 = seed & 0xffffffff`,
  `k1 = (seed >> 32) & 0xffffffff`;
* the counter is `(c0, c1, c2, c3) = (offset_lo, offset_hi, 0, 0)`, with `offset_hi = 0`
  for an int32 offset and `offset >> 32` for an int64 one (the same for offsets in
  `[0, 2^31)`, the only ones attention kernels use);
* ten rounds of `c0' = umulhi(B, c2) ^ c1 ^ k0`, `c2' = umulhi(A, c0) ^ c3 ^ k1`,
  `c1' = B * c2`, `c3' = A * c0` (mod 2^32), with the key bumped by the Weyl constants
  after every round;
* the first output word `c0` is bitcast to int32, folded onto `[0, 2^31)` by
  `x < 0 ? -x - 1 : x` and multiplied, in float32, by `4.6566127342e-10`.

Every uint32 lives in an int64 tensor in `[0, 2^32)`; products are split into 16-bit
halves so no int64 operation overflows.

The attention dropout stream (`attn.dropout`) draws element `(b, h, q, kv)` of a
`[B, H, Sq, Skv]` probability tensor as `tl.rand(key, q * Skv + kv)` with
`key = seed + ((b * H + h) << 32)` wrapped to int64: the low key word is the seed's,
the high word is `(seed_hi + b * H + h) mod 2^32`.
"""

from __future__ import annotations

import torch

__all__ = ["dropout_keep", "philox", "rand", "split_seed", "uniform_from_uint32"]

_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
N_ROUNDS = 10
UNIFORM_SCALE = 4.6566127342e-10
"""Triton's int32 -> [0, 1) scale, applied in float32."""


def split_seed(seed: int) -> tuple[int, int]:
    """The Philox key `(k0, k1)` of a seed: its uint64 bit pattern split in 32-bit words.

    Seeds are taken modulo 2^64, so negative int64 seeds give their two's complement.
    """
    bits = int(seed) % (1 << 64)
    return bits & _MASK32, bits >> 32


def _mul_wide(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(hi, lo)` words of the 64-bit product of the uint32 constant `a` and uint32s `b`."""
    a_hi, a_lo = a >> 16, a & _MASK16
    lo_part = a_lo * b  # < 2^48
    hi_part = a_hi * b  # < 2^48
    hi = (hi_part + (lo_part >> 16)) >> 16
    lo = (((hi_part & _MASK16) << 16) + lo_part) & _MASK32
    return hi, lo


def philox(
    k0: torch.Tensor | int,
    k1: torch.Tensor | int,
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor | None = None,
    c3: torch.Tensor | None = None,
    n_rounds: int = N_ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32 on uint32 words held in int64 tensors (keys and counters broadcast)."""
    zero = torch.zeros_like(c0)
    c2 = zero if c2 is None else c2
    c3 = zero if c3 is None else c3
    k0 = torch.as_tensor(k0, dtype=torch.int64)
    k1 = torch.as_tensor(k1, dtype=torch.int64)
    for _ in range(n_rounds):
        hi_b, lo_b = _mul_wide(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mul_wide(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & _MASK32
        k1 = (k1 + PHILOX_KEY_B) & _MASK32
    return c0, c1, c2, c3


def uniform_from_uint32(x: torch.Tensor) -> torch.Tensor:
    """Triton's `uint_to_uniform_float` for 32-bit words: a float32 in [0, 1)."""
    signed = torch.where(x >= 1 << 31, x - (1 << 32), x)
    folded = torch.where(signed < 0, -signed - 1, signed)
    return folded.to(torch.float32) * torch.tensor(UNIFORM_SCALE, dtype=torch.float32)


def _counters(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    offsets = offsets.to(torch.int64)
    return offsets & _MASK32, (offsets >> 32) & _MASK32


def rand(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """`tl.rand(seed, offsets)`: float32 uniforms in [0, 1), one per offset.

    `offsets` are treated as int64 (Triton's int64-offset path; identical to the int32
    path for offsets in `[0, 2^31)`).
    """
    k0, k1 = split_seed(seed)
    lo, hi = _counters(offsets)
    return uniform_from_uint32(philox(k0, k1, lo, hi)[0])


def dropout_keep(
    seed: int, b_count: int, h_count: int, q_len: int, kv_len: int, p: float,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The `[B, H, Sq, Skv]` boolean keep mask of `attn.dropout` with drop probability p.

    Element `(b, h, q, kv)` is kept iff `u >= float32(p)` (the comparison a kernel makes
    in float32), with `u = tl.rand(seed + ((b * H + h) << 32), q * Skv + kv)`.
    """
    k0, k1 = split_seed(seed)
    bh = torch.arange(b_count * h_count, dtype=torch.int64, device=device).view(b_count, h_count, 1, 1)
    key_hi = (k1 + bh) & _MASK32
    q = torch.arange(q_len, dtype=torch.int64, device=device).view(1, 1, q_len, 1)
    kv = torch.arange(kv_len, dtype=torch.int64, device=device).view(1, 1, 1, kv_len)
    lo, hi = _counters(q * kv_len + kv)
    shape = (b_count, h_count, q_len, kv_len)
    u = uniform_from_uint32(philox(k0, key_hi, lo.expand(shape), hi.expand(shape))[0])
    threshold = torch.tensor(p, dtype=torch.float32, device=device)
    return u >= threshold
