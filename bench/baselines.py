"""flex_attention and SDPA equivalents of attn programs, for the benchmarks' baselines.

`flex_baseline(program, args)` translates an analysed attn program into a call of
PyTorch's `flex_attention`: Q/K transforms (RoPE of any scaling, with or without
positions; QK-norm) as a PyTorch preamble (to `torch.compile` with the call), the
score ops as a `score_mod` (scale, softcap, ALiBi, bias tensors), the masks as a
`mask_mod` and block mask (causal, sliding window, document ids, either alignment), and
sinks through flex's lse (`out * sigmoid(lse - sink)`). A packed batch (cu_seqlens on
`attn.scores`) becomes flex's document masking over the packed `[1, H, T, D]` tensors:
sequence ids and positions within each sequence, read by the RoPE preamble, the
`mask_mod` (same sequence, bands within it) and the `score_mod`. Programs with
`attn.score_mod` regions, custom masks, prefix-LM masks or dropout raise `Unsupported`.
`sdpa_baseline` does the same with SDPA (cuDNN by default) for programs whose only
score op is a causal mask (Llama, Qwen3). Checked against the float64 reference by
tests/test_bench_baselines.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnfuse.dialects.attn import BiasOp, MaskOp, QKNormOp, RopeOp, SoftcapOp
from attnfuse.program import AttentionProgram
from attnfuse.reference.interpreter import alibi_slopes
from attnfuse.reference.rope import RopeParams, cos_sin


class Unsupported(ValueError):
    """The program uses something this translation does not cover."""


@dataclass(frozen=True)
class Packed:
    """Per token of a packed batch: its sequence and position in it, per side."""

    seq_q: torch.Tensor
    pos_q: torch.Tensor
    seq_k: torch.Tensor
    pos_k: torch.Tensor
    diag: torch.Tensor
    """Per query token: len_k - len_q of its sequence (bottom-right alignment)."""


def _packed(program: AttentionProgram, args: Sequence[Any]) -> Packed | None:
    scores = program.scores
    if scores.cu_seqlens_q is None or scores.cu_seqlens_k is None:
        return None
    sides = []
    for cu in (args[program.arg(scores.cu_seqlens_q)].long(), args[program.arg(scores.cu_seqlens_k)].long()):
        tokens = torch.arange(int(cu[-1]), device=cu.device)
        seq = torch.searchsorted(cu[1:], tokens, right=True)
        sides.append((seq, tokens - cu[seq], cu[1:] - cu[:-1]))
    (seq_q, pos_q, len_q), (seq_k, pos_k, len_k) = sides
    return Packed(seq_q, pos_q, seq_k, pos_k, (len_k - len_q)[seq_q])


def _rope(x: torch.Tensor, op: RopeOp, positions: torch.Tensor) -> torch.Tensor:
    p = RopeParams.of(op)
    rd = p.rotary_dim
    cos, sin = (t.to(x.dtype) for t in cos_sin(p, positions))  # [S, rd/2] or [B, S, rd/2]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    rot, rest = x[..., :rd], x[..., rd:]
    if p.style == "half":
        a, b = rot[..., : rd // 2], rot[..., rd // 2:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


def _transform(x: torch.Tensor, ops: Sequence[RopeOp | QKNormOp], program: AttentionProgram,
               args: Sequence[Any], packed_positions: torch.Tensor | None = None) -> torch.Tensor:
    for op in ops:
        if isinstance(op, QKNormOp):
            y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + op.float_option("eps"))
            if op.weight is not None:
                y = y * (args[program.arg(op.weight)].float() + op.float_option("weight_offset"))
            x = y.to(x.dtype)
        else:
            positions = (args[program.arg(op.positions)] if op.positions is not None
                         else packed_positions + op.int_option("offset") if packed_positions is not None
                         else torch.arange(x.shape[2], device=x.device) + op.int_option("offset"))
            if op.bottom_right():  # the queries end where the keys end (decode)
                keys = args[program.k.arg_index].shape[2]
                if program.scores.kv_lens is not None:
                    raise Unsupported('align = "bottom_right" on a cache with kv_lens has no baseline here')
                positions = positions + (keys - x.shape[2])
            x = _rope(x, op, positions)
    return x


def _score_mod(program: AttentionProgram, args: Sequence[Any], heads: int,
               packed: Packed | None = None) -> Callable[..., Any] | None:
    mods: list[Callable[..., Any]] = []
    for op in program.score_ops:
        if isinstance(op, SoftcapOp):
            cap = op.float_option("cap")
            mods.append(lambda s, b, h, q, kv, cap=cap: cap * torch.tanh(s / cap))
        elif isinstance(op, BiasOp) and op.kind_name == "alibi":
            slopes = (args[program.arg(op.slopes)].float() if op.slopes is not None
                      else alibi_slopes(heads, op.float_option("max_bias")).float().to(args[0].device))
            if packed is not None:
                mods.append(lambda s, b, h, q, kv, t=slopes, p=packed: s + t[h] * (p.pos_k[kv] - p.pos_q[q]))
            else:
                mods.append(lambda s, b, h, q, kv, t=slopes: s + t[h] * (kv - q))
        elif isinstance(op, BiasOp):
            bias = args[program.arg(op.bias[0])].float()
            mods.append(lambda s, b, h, q, kv, t=bias: s + t[b if t.shape[0] > 1 else 0, h if t.shape[1] > 1 else 0, q, kv])
        elif not isinstance(op, MaskOp):
            raise Unsupported(f"{op.name} has no flex_attention translation here")
    if not mods:
        return None

    def score_mod(s: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        for mod in mods:
            s = mod(s, b, h, q, kv)
        return s

    return score_mod


def _mask_mod(program: AttentionProgram, args: Sequence[Any], sq: int, skv: int,
              packed: Packed | None = None) -> Callable[..., Any] | None:
    keeps: list[Callable[..., Any]] = []
    if packed is not None:  # same sequence; bands on positions within it
        keeps.append(lambda b, h, q, kv, p=packed: p.seq_q[q] == p.seq_k[kv])
    for op in program.score_ops:
        if not isinstance(op, MaskOp):
            continue
        bottom_right = op.str_option("align") == "bottom_right"
        if packed is not None:  # positions within the sequence, the query's shifted to the keys' diagonal
            qpos: Callable[[Any], Any] = (lambda q, p=packed, br=bottom_right: p.pos_q[q] + (p.diag[q] if br else 0))
            kpos: Callable[[Any], Any] = lambda kv, p=packed: p.pos_k[kv]
        else:
            qpos = lambda q, off=skv - sq if bottom_right else 0: q + off  # noqa: E731
            kpos = lambda kv: kv  # noqa: E731
        if op.kind_name == "causal":
            keeps.append(lambda b, h, q, kv, qp=qpos, kp=kpos: kp(kv) <= qp(q))
        elif op.kind_name == "sliding_window":
            left, right = op.option("left"), op.option("right")
            if left is not None:
                keeps.append(lambda b, h, q, kv, qp=qpos, kp=kpos, n=int(left): kp(kv) >= qp(q) - n)
            if right is not None:
                keeps.append(lambda b, h, q, kv, qp=qpos, kp=kpos, n=int(right): kp(kv) <= qp(q) + n)
        elif op.kind_name == "document":
            ids = [args[program.arg(a)] for a in op.args]
            keeps.append(lambda b, h, q, kv, iq=ids[0], ik=ids[-1]: iq[b, q] == ik[b, kv])
        else:
            raise Unsupported(f"attn.mask {op.kind_name} has no flex_attention translation here")
    if not keeps:
        return None

    def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        keep = keeps[0](b, h, q, kv)
        for more in keeps[1:]:
            keep = keep & more(b, h, q, kv)
        return keep

    return mask_mod


def flex_baseline(program: AttentionProgram, args: Sequence[Any], *, compile: bool = True) -> Callable[..., torch.Tensor]:
    """`fn(q, k, v) -> out` equal to `program` on `args` (its other operands fixed).

    With `compile`, dynamo's caches are cleared first (`torch._dynamo.reset()`, which
    also drops other compiled functions' caches: they recompile on their next call), so
    the baseline compiles for its own static shapes. A process that built baselines for
    other shapes or programs before reused their caches: dynamo recompiled with dynamic
    sizes, or ran eagerly past its recompile limit, and `bench/decode.py` measured flex
    up to 6x slower than a fresh compile and 0.05-0.3 off SDPA (run 37)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if compile:
        torch._dynamo.reset()

    if program.dropout is not None:
        raise Unsupported("flex_attention has no dropout")
    q0, k0 = args[program.q.arg_index], args[program.k.arg_index]
    batch, heads, sq, _ = q0.shape
    skv = k0.shape[2]
    packed = _packed(program, args)
    score_mod = _score_mod(program, args, heads, packed)
    mask_mod = _mask_mod(program, args, sq, skv, packed)
    block_mask = (create_block_mask(mask_mod, batch, None, sq, skv, device=str(q0.device))
                  if mask_mod is not None else None)
    sinks = (args[program.arg(program.softmax.sinks)].float()
             if program.softmax is not None and program.softmax.sinks is not None else None)
    scale = program.scores.scale_value()
    flex = torch.compile(flex_attention) if compile else flex_attention

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q = _transform(q, program.q.transforms, program, args, packed.pos_q if packed is not None else None)
        k = _transform(k, program.k.transforms, program, args, packed.pos_k if packed is not None else None)
        gqa = q.shape[1] != k.shape[1]
        if sinks is None:
            return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
        out, lse = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                        return_lse=True)
        return (out.float() * torch.sigmoid(lse - sinks.view(1, -1, 1))[..., None]).to(out.dtype)

    return torch.compile(run) if compile else run


def qk_preamble(program: AttentionProgram, args: Sequence[Any], *,
                compile: bool = True) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """`fn(q, k) -> (q', k')`: the program's Q and K transforms (RoPE, QK-norm) in
    PyTorch, compiled unless `compile=False` (its other operands, positions and weights,
    fixed from `args`): what a model runs before handing Q and K to SDPA."""

    def transform(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _transform(q, program.q.transforms, program, args), _transform(k, program.k.transforms, program, args)

    return torch.compile(transform) if compile else transform


def sdpa_baseline(program: AttentionProgram, args: Sequence[Any], *, backend: str = "cudnn",
                  compile: bool = True) -> Callable[..., torch.Tensor]:
    """`fn(q, k, v) -> out` through SDPA (`backend`: cudnn, flash or math) for programs
    whose score ops are one top-left causal mask, with the Q/K transforms as a preamble."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ops = program.score_ops
    if program.scores.cu_seqlens_q is not None:
        raise Unsupported("SDPA baselines take no packed batch (cu_seqlens): use flex_baseline")
    if program.dropout is not None or program.softmax is None or program.softmax.sinks is not None or not (
            len(ops) == 1 and isinstance(ops[0], MaskOp) and ops[0].kind_name == "causal"
            and ops[0].str_option("align") == "top_left"):
        raise Unsupported("SDPA baselines cover programs whose only score op is a top-left causal mask")
    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "math": SDPBackend.MATH}[backend]
    scale = program.scores.scale_value()
    pre = qk_preamble(program, args, compile=compile)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k = pre(q, k)
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])

    return run
