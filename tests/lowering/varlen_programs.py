"""Packed-batch programs, inputs and PyTorch's own packed attention, for the varlen tests.

`Case` describes a packed program (heads, head dim, dtype, RoPE, masks, one or two
cu_seqlens) and its sequence lengths; `Case.program()` writes it with
`attnfuse.attention(...).packed()`, `Case.inputs(seed)` makes fresh random q/k/v
(`[1, H, total, D]`, never zeros) and the int32 cu_seqlens. `torch_varlen` is the same
attention written with PyTorch ops in the inputs' dtype, one sequence at a time (RoPE with
cos/sin rounded to the dtype as HF does, repeat_kv, a boolean mask, softmax): the error
it makes against the float64 reference is the yardstick for ours.

Kernels run in the Triton interpreter with 16 x 16 tiles (`pipeline`), so lengths like
37 span three blocks, the last partial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import attnfuse
from attnfuse.reference.rope import RopeParams, cos_sin
from attnfuse.testing import cu_seqlens, max_error

DTYPES = {"f32": torch.float32, "f16": torch.float16}


def pipeline(strategy: str = "hybrid", backward: bool = False) -> str:
    bwd = "lower-backward{block-m=16 block-n=16}," if backward else ""
    return (f"attn-canonicalize,rope-fusion{{strategy={strategy}}},online-softmax,"
            f"mask-tiling{{block-m=16 block-n=16}},{bwd}lower-to-tile")


@dataclass(frozen=True)
class Case:
    """A packed program and the lengths of its sequences (`lengths_k` None: self-attention)."""

    lengths_q: tuple[int, ...]
    lengths_k: tuple[int, ...] | None = None
    hq: int = 4
    hkv: int = 2
    d: int = 32
    dtype: str = "f32"
    theta: float | None = 10000.0
    window: int | None = None
    align: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    """Other building blocks: "softcap", "alibi", "sinks", "qk_norm"."""

    @property
    def shared(self) -> bool:
        return self.lengths_k is None

    def program(self, packed: bool = True) -> attnfuse.builder.Program:
        """The packed program (`packed=False`: the same attention on one padded batch)."""
        b = attnfuse.attention(self.hq, self.d, kv_heads=self.hkv, dtype=self.dtype, name="packed")
        if "qk_norm" in self.extra:
            b = b.qk_norm(eps=1e-5, weight_dtype="f32")
        if self.theta is not None:
            b = b.rope(theta=self.theta)
        if "softcap" in self.extra:
            b = b.softcap(20.0)
        if "alibi" in self.extra:
            b = b.alibi()
        b = b.causal(align=self.align)
        if self.window is not None:
            b = b.sliding_window(left=self.window, align=self.align)
        if "sinks" in self.extra:
            b = b.sinks()
        return (b.packed(shared=self.shared) if packed else b).lse().build()

    def inputs(self, seed: int = 0) -> list[Any]:
        """q, k, v, then the cu_seqlens (one, or q's and k's), then norm weights / sinks."""
        g = torch.Generator().manual_seed(seed)
        lengths_k = self.lengths_q if self.lengths_k is None else self.lengths_k
        tq, tk = sum(self.lengths_q), sum(lengths_k)
        dtype = DTYPES[self.dtype]
        q = torch.randn(1, self.hq, tq, self.d, generator=g).to(dtype)
        k = torch.randn(1, self.hkv, tk, self.d, generator=g).to(dtype)
        v = torch.randn(1, self.hkv, tk, self.d, generator=g).to(dtype)
        cus = [cu_seqlens(list(self.lengths_q))] + ([] if self.shared else [cu_seqlens(list(lengths_k))])
        extra: list[Any] = []
        if "qk_norm" in self.extra:
            extra += [1.0 + 0.1 * torch.randn(self.d, generator=g) for _ in range(2)]
        if "sinks" in self.extra:
            extra.append(torch.randn(self.hq, generator=g))
        return [q, k, v, *cus, *extra]


def torch_varlen(case: Case, args: Sequence[Any]) -> torch.Tensor:
    """PyTorch's own packed attention of `case` (no extras), in the inputs' dtype."""
    assert not case.extra
    q, k, v, cu_q = args[:4]
    cu_k = cu_q if case.shared else args[4]
    outs = []
    for i in range(len(cu_q) - 1):
        qs, ks, vs = q[:, :, cu_q[i]:cu_q[i + 1]], k[:, :, cu_k[i]:cu_k[i + 1]], v[:, :, cu_k[i]:cu_k[i + 1]]
        if case.theta is not None:
            qs, ks = _rope(qs, case.theta), _rope(ks, case.theta)
        group = case.hq // case.hkv
        ks, vs = ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1)
        s = (qs @ ks.transpose(-1, -2)) * case.d ** -0.5
        sq, skv = s.shape[-2:]
        diag = skv - sq if case.align == "bottom_right" else 0
        i_, j_ = torch.arange(sq)[:, None] + diag, torch.arange(skv)[None, :]
        keep = j_ <= i_
        if case.window is not None:
            keep = keep & (j_ >= i_ - case.window)
        p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
        outs.append(torch.where(keep.any(-1, keepdim=True), p, 0.0).to(vs.dtype) @ vs)
    return torch.cat(outs, dim=2)


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """HF-style rotate_half RoPE at positions 0..S-1, cos/sin in x's dtype."""
    cos, sin = (t.to(x.dtype) for t in cos_sin(RopeParams(rotary_dim=x.shape[-1], theta=theta),
                                                torch.arange(x.shape[2])))
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def within_torch_error(ours: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """Our error against the float64 reference is at most 4 times PyTorch's own in the
    same dtype (plus a few units of the dtype, for inputs PyTorch happens to get exact)."""
    unit = torch.finfo(ours.dtype).eps * max(1.0, float(exact.abs().max()))
    bound = 4 * max_error(theirs, exact) + 4 * unit
    assert max_error(ours, exact) <= bound, f"{what}: error {max_error(ours, exact):.3e} > {bound:.3e}"
