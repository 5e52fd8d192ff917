"""Fused RoPE (and Qwen3's QK-norm) for Hugging Face attention layers: `fuse_rope(model)`.

```python
from attnfuse.integrations import huggingface, huggingface_rope

huggingface.register()
model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attnfuse")
huggingface_rope.fuse_rope(model)    # the layers' RoPE now runs inside AttnFuse's kernels
loss = model(input_ids=ids, labels=ids, use_cache=False).loss
```

Through `attn_implementation="attnfuse"` alone the model rotates q and k itself before it
calls the attention interface (`huggingface.py`). `fuse_rope` gives each supported
attention layer a forward that hands AttnFuse the unrotated projections and the position
ids instead, so the rotation runs in the compiled kernels (where `rope-fusion` places it)
and the backward rotates the gradients back itself: no RoPE elementwise kernels of the
model's, forward or backward. A Qwen3 layer's QK-norm moves into the program with it.

Supported layers: `LlamaAttention` and `Qwen3Attention` without a sliding window, with
RoPE types `default` and `llama3` (an other type is a `NotImplementedError` from
`fuse_rope`). A call keeps the model's own forward (RoPE in the model, then the attention
implementation) when it has a KV cache (the cache holds rotated keys, which every later
call and every other implementation reads), an attention-mask tensor (padding: the
fused program has only the causal mask), no position ids, dropout while training, or an
attention implementation whose interface is not `huggingface.attention_forward` (any name
it is registered under). Pass `use_cache=False` to training forwards. Under
`torch.compile` transformers gives every call without a padding mask a dense
packed-sequence mask (it cannot read the position ids while tracing), which keeps the
model's forward too, unless the implementation's mask function knows the batch is not
packed (`huggingface.register(name, packed=False)`).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, replace
from typing import Any

import torch

import attnfuse.api
from attnfuse.builder import Program, attention
from attnfuse.integrations.huggingface import attention_forward
from attnfuse.passes import BSHD_PIPELINE

__all__ = ["SUPPORTED", "FusedRopeConfig", "compiled_fused", "fuse_rope", "rope_options"]

SUPPORTED: dict[str, bool] = {"LlamaAttention": False, "Qwen3Attention": True}
"""Attention layer classes `fuse_rope` converts, and whether each carries a QK-norm
(`q_norm` / `k_norm` RMSNorms over the head dim, applied before RoPE)."""


@dataclass(frozen=True)
class FusedRopeConfig:
    """Everything that selects the compiled program of a fused layer's call."""

    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    scale: float
    rope: tuple[tuple[str, Any], ...]
    """Keyword options of `ProgramBuilder.rope` (`rope_options`)."""
    qk_norm_eps: float | None
    """The QK-norm's epsilon, None without one."""
    norm_dtype: torch.dtype | None

    def values(self) -> tuple[Any, ...]:
        """The fields in order (`FusedRopeConfig(*values)` is this config), spelled out
        for Dynamo as `AttentionConfig.values` is."""
        return (self.heads, self.kv_heads, self.head_dim, self.dtype, self.scale, self.rope, self.qk_norm_eps,
                self.norm_dtype)

    def program(self) -> Program:
        b = attention(self.heads, self.head_dim, kv_heads=self.kv_heads, dtype=self.dtype,
                      name="hf_rope_attention").scale(self.scale)
        if self.qk_norm_eps is not None:
            b = b.qk_norm(eps=self.qk_norm_eps, weight_dtype=self.norm_dtype)
        return b.rope(positions=True, **dict(self.rope)).causal().build()


@functools.lru_cache(maxsize=64)
def compiled_fused(config: FusedRopeConfig) -> attnfuse.api.AttentionFunction:
    """The compiled program of a configuration (compiled once per process), writing its
    output as `[B, S, H, D]` like the backend's."""
    return attnfuse.api.compile(config.program(), pipeline=BSHD_PIPELINE)


def rope_options(config: Any, head_dim: int) -> tuple[tuple[str, Any], ...]:
    """The `rope()` options of a transformers config's `rope_parameters` (HF's
    `ROPE_INIT_FUNCTIONS` types `default` and `llama3`; `partial_rotary_factor` as
    `rotary_dim`)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", "default")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise NotImplementedError(f"fuse_rope: {type(config).__name__} has no rope_theta")
    options: dict[str, Any] = {"theta": float(theta)}
    if rope_type == "llama3":
        options.update(scaling="llama3", factor=float(params["factor"]),
                       low_freq_factor=float(params["low_freq_factor"]),
                       high_freq_factor=float(params["high_freq_factor"]),
                       original_max_position=int(params["original_max_position_embeddings"]))
    elif rope_type != "default":
        raise NotImplementedError(f"fuse_rope: rope_type {rope_type!r} is not supported (default and llama3 are); "
                                  "leave the layers unfused")
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        options["rotary_dim"] = int(head_dim * float(partial))
    return tuple(sorted(options.items()))


def _attend_fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor,
                  weights: tuple[torch.Tensor, ...], fields: tuple[Any, ...]) -> torch.Tensor:
    """The compiled program's call on `[B, H, S, D]` views of the `[B, S, H, D]`
    projections. `fuse_rope` marks it `torch.compiler.allow_in_graph`, as
    `huggingface._attend`."""
    fn = compiled_fused(FusedRopeConfig(*fields))
    named = {"q": query, "k": key, "v": value, "pos": positions, **dict(zip(("wq", "wk"), weights))}
    return fn(*(named[p.name] for p in fn.parameters))


def _keeps_own_forward(module: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether a call must keep the layer's own forward (see the module docstring)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # imported by the model already

    return (kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None  # rotated keys
            or kwargs.get("attention_mask") is not None  # padding: the program has the causal mask only
            or kwargs.get("position_ids") is None
            or bool(module.training and getattr(module, "attention_dropout", 0.0))
            or ALL_ATTENTION_FUNCTIONS.get(module.config._attn_implementation) is not attention_forward)


def _fused_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A supported layer's forward with RoPE (and QK-norm) in the compiled program; the
    layer's own forward for the calls `_keeps_own_forward` names."""
    if args or _keeps_own_forward(self, kwargs):
        return type(self).forward(self, *args, **kwargs)
    hidden = kwargs["hidden_states"]
    batch, seq = hidden.shape[:2]
    shape = (batch, seq, -1, self.head_dim)
    q = self.q_proj(hidden).view(shape).transpose(1, 2)
    k = self.k_proj(hidden).view(shape).transpose(1, 2)
    v = self.v_proj(hidden).view(shape).transpose(1, 2)
    weights = (self.q_norm.weight, self.k_norm.weight) if self._attnfuse_rope.qk_norm_eps is not None else ()
    # sizes and dtypes as they are now (the model may have been cast since `fuse_rope`)
    config: FusedRopeConfig = replace(self._attnfuse_rope, heads=q.shape[1], kv_heads=k.shape[1], dtype=q.dtype,
                                      norm_dtype=weights[0].dtype if weights else None)
    positions = kwargs["position_ids"].to(torch.int32)
    out = _attend_fused(q, k, v, positions, weights, config.values())
    return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1)), None


def fuse_rope(model: torch.nn.Module) -> int:
    """Give every supported attention layer of `model` the fused forward (see the module
    docstring); returns how many layers. A model without one is a `ValueError`."""
    torch.compiler.allow_in_graph(_attend_fused)
    count = 0
    for module in model.modules():
        norm = SUPPORTED.get(type(module).__name__)
        if norm is None or getattr(module, "sliding_window", None) is not None:
            continue
        eps = float(module.q_norm.variance_epsilon) if norm else None
        # heads and dtypes are filled per call
        module._attnfuse_rope = FusedRopeConfig(
            heads=0, kv_heads=0, head_dim=module.head_dim, dtype=torch.float32, scale=float(module.scaling),
            rope=rope_options(module.config, module.head_dim), qk_norm_eps=eps, norm_dtype=None)
        module.forward = types.MethodType(_fused_forward, module)
        count += 1
    if not count:
        raise ValueError(f"fuse_rope: {type(model).__name__} has no attention layer it converts "
                         f"({', '.join(SUPPORTED)}, without a sliding window)")
    return count
