"""Hugging Face transformers backend: `attn_implementation="attnfuse"`.

```python
from transformers import AutoModelForCausalLM
from attnfuse.integrations import huggingface

huggingface.register()     # "attnfuse" joins transformers' AttentionInterface and AttentionMaskInterface
model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attnfuse")
```

Every attention call of the model runs a compiled program built from what the layer
passes: head counts and dims (GQA), dtype, `scaling`, `softcap` (Gemma 2), the causal
flag, `sliding_window`, `s_aux` sink logits (gpt-oss) and training dropout. Programs are
compiled once per configuration (`compiled`). The model applies RoPE (and QK-norm)
itself, as it does for SDPA, so the programs start at `attn.scores`.

Masks: the mask function registered with the backend is transformers' own `sdpa_mask`,
except that a sliding-window causal mask without padding is also skipped. A skipped mask
(None) becomes mask ops of the program (`causal`, `sliding_window` of the layer's
window): blocks outside them are never visited. Any other mask (padding, packed
sequences, custom 4-d masks) arrives as a dense 4-d tensor and becomes an additive bias
operand (0 / -inf, or the float mask itself): correct for every mask, but a
`[B, 1, Sq, Skv]` f32 tensor per call.

Under `torch.compile` a model is one graph: each attention call is a node that
AOTAutograd traces into the program's custom ops, never into the compiler.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

import attnfuse.api
from attnfuse.passes import BSHD_PIPELINE
from attnfuse.builder import Program, attention

__all__ = ["NAME", "AttentionConfig", "attention_forward", "attention_mask_function", "compiled", "register", "unpacked"]

NAME = "attnfuse"
"""The `attn_implementation` name `register()` uses by default."""


@dataclass(frozen=True)
class AttentionConfig:
    """Everything that selects the compiled program of one attention call."""

    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: torch.dtype
    scale: float | None
    softcap: float | None
    causal: bool
    window: int | None
    align: str
    """"top_left" for a prefill (HF's skipped masks are SDPA's top-left `is_causal`),
    "bottom_right" for a single decoded query."""
    bias: tuple[str, ...] | None
    """The dims a dense mask operand broadcasts over, or None without one."""
    sinks: torch.dtype | None
    dropout: float

    def values(self) -> tuple[Any, ...]:
        """The fields in order (`AttentionConfig(*values)` is this config). Spelled out
        rather than `dataclasses.astuple`, which asks of every value whether it is a
        dataclass: torch 2.11's Dynamo cannot trace that question on a `torch.dtype` and
        breaks the graph there (once per layer call, run 28)."""
        return (self.heads, self.kv_heads, self.head_dim, self.v_head_dim, self.dtype, self.scale, self.softcap,
                self.causal, self.window, self.align, self.bias, self.sinks, self.dropout)

    def program(self) -> Program:
        b = attention(self.heads, self.head_dim, kv_heads=self.kv_heads, v_head_dim=self.v_head_dim,
                      dtype=self.dtype, name="hf_attention")
        if self.scale is not None:
            b = b.scale(self.scale)
        if self.softcap is not None:
            b = b.softcap(self.softcap)
        if self.bias is not None:
            b = b.bias(broadcast=self.bias)
        if self.causal:
            b = b.causal(align=self.align)
        if self.window is not None:
            b = b.sliding_window(left=self.window - 1, align=self.align)
        if self.sinks is not None:
            b = b.sinks(dtype=self.sinks)
        if self.dropout:
            b = b.dropout(self.dropout)
        return b.build()


@functools.lru_cache(maxsize=64)
def compiled(config: AttentionConfig) -> attnfuse.api.AttentionFunction:
    """The compiled program of a configuration (compiled once per process)."""
    # Stored as [B, S, H, D]: the model's `reshape(B, S, H * D)` of the transposed output is then a view.
    return attnfuse.api.compile(config.program(), pipeline=BSHD_PIPELINE)


def attention_mask_function(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                   attention_mask: torch.Tensor | None = None, local_size: int | None = None,
                   allow_is_causal_skip: bool = True, use_vmap: bool = False, config: Any = None,
                   **kwargs: Any) -> torch.Tensor | None:
    """The backend's mask function: `sdpa_mask`, which gives None for a causal mask that
    SDPA's `is_causal` can apply, and also None (1) for the plain causal mask of a call
    without padding mask or cache offset, also under `torch.compile` (where `sdpa_mask`
    builds it densely before transformers 5.24 and torch 2.14), and (2) for the model's
    own sliding-window causal mask without padding when every query sees its whole window
    (`q_length` 1 or `kv_length`). The program's mask ops then apply the mask."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask  # see register()

    if (attention_mask is None and local_size is None and allow_is_causal_skip and not use_vmap
            and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
            and isinstance(q_offset, int) and q_offset == 0 and kv_offset == 0 and q_length == kv_length):
        return None
    if (local_size is not None and allow_is_causal_skip and not use_vmap and not torch.compiler.is_compiling()
            and local_size == getattr(config, "sliding_window", None)
            and getattr(config, "attention_chunk_size", None) is None
            and q_length in (1, kv_length)):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None or bool(padding[:, kv_offset:kv_offset + kv_length].all()):
            return None
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=allow_is_causal_skip, use_vmap=use_vmap, config=config, **kwargs)


def _bias(mask: torch.Tensor, heads: int) -> tuple[torch.Tensor, tuple[str, ...]]:
    """A dense 4-d mask as an additive f32 bias and the dims it broadcasts over."""
    if mask.dim() != 4 or mask.shape[1] not in (1, heads):
        raise ValueError(f"attnfuse attention: expected a [B, 1 or {heads}, Sq, Skv] attention mask, "
                         f"got shape {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, -torch.inf)
    else:
        bias = mask.float()
    return bias, ("heads",) if mask.shape[1] == 1 else ()


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The `AttentionInterface` function: q `[B, H, Sq, D]`, k and v `[B, Hkv, Skv, D]`
    (any strides) to the output `[B, Sq, H, Dv]` and no attention weights."""
    if kwargs.get("position_bias") is not None:
        raise ValueError("attnfuse attention: position_bias is not supported (build a program with "
                         "attnfuse.attention(...).bias() and call it directly)")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attnfuse attention: expected a tensor attention mask or None, got "
                        f"{type(attention_mask).__name__}")
    heads, q_length = query.shape[1], query.shape[2]
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    extra: list[Any] = []
    bias_dims: tuple[str, ...] | None = None
    if attention_mask is not None:
        bias, bias_dims = _bias(attention_mask, heads)
        extra.append(bias)
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        extra.append(sinks)
    window = kwargs.get("sliding_window")
    config = AttentionConfig(
        heads=heads, kv_heads=key.shape[1], head_dim=query.shape[3], v_head_dim=value.shape[3], dtype=query.dtype,
        scale=scaling, softcap=kwargs.get("softcap"),
        causal=attention_mask is None and is_causal and q_length > 1,
        window=window if attention_mask is None and is_causal and window is not None else None,
        align="bottom_right" if q_length == 1 else "top_left",
        bias=bias_dims, sinks=None if sinks is None else sinks.dtype,
        dropout=float(dropout),
    )
    if config.dropout:
        extra.append(int(torch.randint(0, 2**62, ())))
    return _attend(query, key, value, tuple(extra), config.values()).transpose(1, 2), None


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, extra: tuple[Any, ...],
            fields: tuple[Any, ...]) -> torch.Tensor:
    """`compiled(AttentionConfig(*fields))(query, key, value, *extra)`. `register` marks it
    `torch.compiler.allow_in_graph`: under `torch.compile` Dynamo then puts this call in
    the graph as it is instead of tracing into the compiler
    (which would break the graph at every layer); AOTAutograd then runs it on fake tensors,
    which leaves the program's custom op (and its backward op) in the graph."""
    return compiled(AttentionConfig(*fields))(query, key, value, *extra)


def unpacked(mask_function: Any) -> Any:
    """`mask_function` (any of transformers' mask interface functions), told that a call
    without padding mask or cache offset is a plain causal one. Without them transformers
    looks for packed sequences in the position ids; under torch.compile it cannot read
    them, so it always adds a packed-sequence mask: a dense mask for SDPA and AttnFuse (a
    bias operand, no block skipping, and `huggingface_rope`'s layers keep their own
    RoPE), an extra mask_mod for flex_attention. For batches of one sequence a row
    (positions 0..S-1) the plain causal mask is the exact one; packed batches need the
    original function."""
    from transformers.masking_utils import causal_mask_function  # see register()

    def function(**kwargs: Any) -> Any:
        q_offset = kwargs.get("q_offset", 0)
        if (kwargs.get("attention_mask") is None and kwargs.get("local_size") is None
                and isinstance(q_offset, int) and q_offset == 0 and kwargs.get("kv_offset", 0) == 0
                and kwargs["q_length"] == kwargs["kv_length"]):
            kwargs.update(mask_function=causal_mask_function, allow_is_causal_skip=True)
        return mask_function(**kwargs)
    return function


def register(name: str = NAME, *, packed: bool = True) -> None:
    """Register the backend with transformers as `attn_implementation=name`; with
    `packed=False` its mask function is `unpacked`'s (for training on batches that never
    pack several sequences into a row, under torch.compile)."""
    # Here, not at module import: transformers' attention interface imports torch's
    # flex_attention, and torch.compiler.allow_in_graph imports Dynamo; both imports set
    # TORCHINDUCTOR_CACHE_DIR.
    torch.compiler.allow_in_graph(_attend)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask_function if packed else unpacked(attention_mask_function))
