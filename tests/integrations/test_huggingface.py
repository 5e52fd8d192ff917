"""`attn_implementation="attnfuse"` on tiny random Llama, Qwen3, Gemma 2 and gpt-oss models.

Logits and parameter gradients through AttnFuse's kernels (Triton interpreter, f32) are
compared with a float64 copy of the model run with transformers' eager attention; the
bound is a small multiple of the error of eager attention in f32 against that copy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnfuse.integrations import huggingface  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
WINDOW = 4


def _models() -> dict[str, tuple[type, Any]]:
    t = transformers
    return {
        "llama": (t.LlamaForCausalLM, t.LlamaConfig(**COMMON)),
        "qwen3": (t.Qwen3ForCausalLM, t.Qwen3Config(**COMMON)),
        "gemma2": (t.Gemma2ForCausalLM, t.Gemma2Config(**COMMON, sliding_window=WINDOW, attn_logit_softcapping=2.0,
                                                         query_pre_attn_scalar=12)),
        "gpt_oss": (t.GptOssForCausalLM, t.GptOssConfig(**COMMON, sliding_window=WINDOW, num_local_experts=4,
                                                          num_experts_per_tok=2,
                                                          layer_types=["sliding_attention", "full_attention"])),
    }


@pytest.fixture(scope="module", autouse=True)
def registered() -> None:
    huggingface.register()


@pytest.fixture
def configs(monkeypatch: pytest.MonkeyPatch) -> list[huggingface.AttentionConfig]:
    """The configurations of the programs the backend runs during a test."""
    seen: list[huggingface.AttentionConfig] = []
    compiled = huggingface.compiled

    def spy(config: huggingface.AttentionConfig) -> Any:
        seen.append(config)
        return compiled(config)

    monkeypatch.setattr(huggingface, "compiled", spy)
    return seen


def _model(name: str) -> torch.nn.Module:
    cls, config = _models()[name]
    torch.manual_seed(0)
    model = cls._from_config(config, attn_implementation="eager", experts_implementation="eager").eval()
    if name == "gpt_oss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_()
    return model


def _run(model: torch.nn.Module, implementation: str, ids: torch.Tensor, keep: torch.Tensor,
         **kwargs: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits at the positions `keep` selects and the gradients of their next-token loss."""
    model.set_attn_implementation(implementation)
    model.zero_grad()
    logits = model(ids, **kwargs).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1][keep[:, 1:]], ids[:, 1:][keep[:, 1:]])
    loss.backward()
    return logits[keep].detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _check(name: str, ids: torch.Tensor, keep: torch.Tensor, reference: str = "eager", **kwargs: Any) -> None:
    model = _model(name)
    exact, exact_grads = _run(copy.deepcopy(model).double(), reference, ids, keep, **kwargs)
    eager, eager_grads = _run(model, reference, ids, keep, **kwargs)
    fused, fused_grads = _run(model, "attnfuse", ids, keep, **kwargs)
    assert len(fused_grads) == len(exact_grads) > 0
    for got, ref, want in [(fused, eager, exact), *zip(fused_grads, eager_grads, exact_grads)]:
        bound = 8 * (ref.double() - want).abs().max().item() + 1e-6 * want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= bound


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "gpt_oss"])
def test_logits_and_gradients(name: str, configs: list[huggingface.AttentionConfig]) -> None:
    ids = torch.randint(0, COMMON["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1))
    _check(name, ids, torch.ones_like(ids, dtype=torch.bool))
    assert configs and all(c.causal and c.bias is None and c.align == "top_left" for c in configs)
    windows = {c.window for c in configs}
    assert windows == ({WINDOW, None} if name in ("gemma2", "gpt_oss") else {None})
    assert all((c.softcap is not None) == (name == "gemma2") for c in configs)
    assert all((c.sinks is not None) == (name == "gpt_oss") for c in configs)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_padding_mask_is_a_bias(name: str, configs: list[huggingface.AttentionConfig]) -> None:
    ids = torch.randint(0, COMMON["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # right padding (left padding leaves rows without keys, NaN in eager's f64 reference)
    _check(name, ids, mask.bool(), attention_mask=mask)
    assert configs and all(c.bias == ("heads",) and not c.causal and c.window is None for c in configs)


def test_left_padding(configs: list[huggingface.AttentionConfig]) -> None:
    """Padded queries see no key: their rows are 0 (as SDPA's), never NaN, in the forward and
    the backward; the reference is SDPA (eager's f64 mask overflows to NaN there)."""
    ids = torch.randint(0, COMMON["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    _check("llama", ids, mask.bool(), reference="sdpa", attention_mask=mask)
    assert configs and all(c.bias == ("heads",) for c in configs)


def test_decoding_with_a_cache(configs: list[huggingface.AttentionConfig]) -> None:
    """Prefill then three single-token steps (bottom-right window and causal) match a
    full forward of the float64 model."""
    model = _model("gemma2")
    ids = torch.randint(0, COMMON["vocab_size"], (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(ids).logits
        model.set_attn_implementation("attnfuse")
        out = model(ids[:, :7], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for i in range(7, 10):
            out = model(ids[:, i:i + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    torch.testing.assert_close(torch.cat(steps, dim=1).double(), exact, rtol=1e-5, atol=1e-5)
    decode = [c for c in configs if c.align == "bottom_right"]
    assert decode and all(not c.causal and c.bias is None for c in decode)
    assert {c.window for c in decode} == {WINDOW, None}


def test_training_dropout(configs: list[huggingface.AttentionConfig]) -> None:
    """Dropout in training mode: the program's attn.dropout, seeded from torch's generator."""
    cls, config = _models()["llama"]
    config.attention_dropout = 0.5
    torch.manual_seed(0)
    model = cls._from_config(config, attn_implementation="attnfuse")
    ids = torch.randint(0, COMMON["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        plain = model.eval()(ids).logits
        model.train()
        torch.manual_seed(1)
        first = model(ids).logits
        torch.manual_seed(1)
        assert torch.equal(first, model(ids).logits)
    assert not torch.allclose(first, plain)
    assert {c.dropout for c in configs} == {0.0, 0.5}


def _call(mask: Any = None, **kwargs: Any) -> Callable[[], Any]:
    module = torch.nn.Module()
    q, kv = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
    return lambda: huggingface.attention_forward(module, q, kv, kv, mask, **kwargs)


def test_errors() -> None:
    with pytest.raises(ValueError, match="position_bias is not supported"):
        _call(position_bias=torch.zeros(1, 4, 5, 5))()
    with pytest.raises(TypeError, match="expected a tensor attention mask or None, got list"):
        _call([[1]])()
    with pytest.raises(ValueError, match=r"expected a \[B, 1 or 4, Sq, Skv\] attention mask, got shape \(1, 5, 5\)"):
        _call(torch.ones(1, 5, 5, dtype=torch.bool))()


def test_torch_compile_one_graph(configs: list[huggingface.AttentionConfig]) -> None:
    """Under torch.compile(fullgraph=True) the model is one graph (the backend's calls are
    graph nodes, not traced into the compiler) with the eager model's logits and gradients."""
    model = _model("llama").train()
    ids = torch.randint(0, COMMON["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(6))
    keep = torch.ones_like(ids, dtype=torch.bool)
    eager, eager_grads = _run(model, "attnfuse", ids, keep)
    torch._dynamo.reset()
    got, got_grads = _run(torch.compile(model, backend="aot_eager", fullgraph=True), "attnfuse", ids, keep)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert configs and all(c.causal and c.bias is None for c in configs)
