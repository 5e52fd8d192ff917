"""`huggingface_rope.fuse_rope`: RoPE (and Qwen3's QK-norm) inside AttnFuse's kernels for
tiny random Llama and Qwen3 models.

Logits and parameter gradients (Triton interpreter, f32) are compared with a float64
copy of the model run with transformers' eager attention and its own RoPE; the bound is
a small multiple of the error of eager attention in f32 against that copy.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnfuse.integrations import huggingface, huggingface_rope  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
LLAMA3_SCALING = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


UNPACKED = "attnfuse_unpacked"


@pytest.fixture(scope="module", autouse=True)
def registered() -> None:
    huggingface.register()
    # under torch.compile transformers would otherwise pass every call a dense
    # packed-sequence mask, and the layers would keep their RoPE
    huggingface.register(UNPACKED, packed=False)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """What ran during a test: fused programs' configurations, the backend's unfused
    programs, and the models' own RoPE."""
    seen: dict[str, list[Any]] = {"fused": [], "unfused": [], "model_rope": []}
    fused, unfused = huggingface_rope.compiled_fused, huggingface.compiled

    def spy_fused(config: huggingface_rope.FusedRopeConfig) -> Any:
        seen["fused"].append(config)
        return fused(config)

    def spy_unfused(config: huggingface.AttentionConfig) -> Any:
        seen["unfused"].append(config)
        return unfused(config)

    monkeypatch.setattr(huggingface_rope, "compiled_fused", spy_fused)
    monkeypatch.setattr(huggingface, "compiled", spy_unfused)
    for module in (transformers.models.llama.modeling_llama, transformers.models.qwen3.modeling_qwen3):
        rope = module.apply_rotary_pos_emb

        def spy_rope(*args: Any, rope: Any = rope, **kwargs: Any) -> Any:
            seen["model_rope"].append(1)
            return rope(*args, **kwargs)

        monkeypatch.setattr(module, "apply_rotary_pos_emb", spy_rope)
    return seen


def _model(name: str, **overrides: Any) -> torch.nn.Module:
    t = transformers
    cls, config_cls = {"llama": (t.LlamaForCausalLM, t.LlamaConfig), "qwen3": (t.Qwen3ForCausalLM, t.Qwen3Config)}[name]
    torch.manual_seed(0)
    return cls._from_config(config_cls(**{**COMMON, **overrides}), attn_implementation="eager").eval()


def _run(model: torch.nn.Module, implementation: str, ids: torch.Tensor,
         **kwargs: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and the gradients of their next-token loss."""
    model.set_attn_implementation(implementation)
    model.zero_grad()
    logits = model(ids, **kwargs).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _check(model: torch.nn.Module, ids: torch.Tensor, **kwargs: Any) -> None:
    """The fused model (`fuse_rope` applied, `attnfuse`) against the float64 eager copy."""
    exact, exact_grads = _run(copy.deepcopy(model).double(), "eager", ids, **kwargs)
    eager, eager_grads = _run(model, "eager", ids, **kwargs)
    assert huggingface_rope.fuse_rope(model) == COMMON["num_hidden_layers"]
    fused, fused_grads = _run(model, "attnfuse", ids, **kwargs)
    assert len(fused_grads) == len(exact_grads) > 0
    for got, ref, want in [(fused, eager, exact), *zip(fused_grads, eager_grads, exact_grads)]:
        bound = 8 * (ref.double() - want).abs().max().item() + 1e-6 * want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= bound


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_rope_runs_in_the_kernels(name: str, calls: dict[str, list[Any]]) -> None:
    ids = torch.randint(0, COMMON["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1))
    model = _model(name).train()
    _check(model, ids, use_cache=False)
    assert calls["fused"] and not calls["unfused"]
    # the eager and float64 runs rotated in the model (2 layers each); the fused run did not
    assert len(calls["model_rope"]) == 2 * COMMON["num_hidden_layers"]
    for config in calls["fused"]:
        assert dict(config.rope) == {"theta": 10000.0}
        assert (config.qk_norm_eps is not None) == (name == "qwen3")
        assert (config.heads, config.kv_heads, config.head_dim, config.dtype) == (4, 2, 16, torch.float32)


def test_llama3_scaling(calls: dict[str, list[Any]]) -> None:
    ids = torch.randint(0, COMMON["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(2))
    _check(_model("llama", rope_parameters=LLAMA3_SCALING), ids, use_cache=False)
    assert calls["fused"] and dict(calls["fused"][0].rope) == {
        "theta": 500000.0, "scaling": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position": 16}


def test_cache_and_padding_keep_the_model_rope(calls: dict[str, list[Any]]) -> None:
    """With a KV cache (which holds rotated keys) or a padding mask a call keeps the
    model's RoPE and the backend's unfused program: still the eager model's results."""
    model = _model("llama")
    ids = torch.randint(0, COMMON["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    keep = torch.ones_like(ids)
    keep[1, :3] = 0
    with torch.no_grad():
        cached, padded = model(ids, use_cache=True).logits, model(ids, attention_mask=keep, use_cache=False).logits
        huggingface_rope.fuse_rope(model)
        model.set_attn_implementation("attnfuse")
        calls["model_rope"].clear()
        torch.testing.assert_close(model(ids, use_cache=True).logits, cached, rtol=1e-5, atol=1e-5)
        rows = keep.bool()
        got = model(ids, attention_mask=keep, use_cache=False).logits
        torch.testing.assert_close(got[rows], padded[rows], rtol=1e-5, atol=1e-5)
        assert not calls["fused"] and calls["unfused"] and len(calls["model_rope"]) == 2 * COMMON["num_hidden_layers"]
        generated = model.generate(ids[:1], max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, 12) and not calls["fused"]


def test_torch_compile_one_graph(calls: dict[str, list[Any]]) -> None:
    """Under torch.compile(fullgraph=True) the fused model is one graph with the eager
    fused model's logits and gradients (an implementation registered under another name,
    whose mask function knows the batch is not packed)."""
    model = _model("qwen3").train()
    huggingface_rope.fuse_rope(model)
    ids = torch.randint(0, COMMON["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(6))
    eager, eager_grads = _run(model, UNPACKED, ids, use_cache=False)
    torch._dynamo.reset()
    got, got_grads = _run(torch.compile(model, backend="aot_eager", fullgraph=True), UNPACKED, ids,
                          use_cache=False)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert calls["fused"] and not calls["unfused"]


def test_cast_after_fusing(calls: dict[str, list[Any]]) -> None:
    """A model cast after `fuse_rope` runs programs of its new dtype (f16 here, whose
    QK-norm weights are f16 too)."""
    model = _model("qwen3")
    ids = torch.randint(0, COMMON["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = copy.deepcopy(model).double()(ids, use_cache=False).logits
        huggingface_rope.fuse_rope(model)
        model.half().set_attn_implementation("attnfuse")
        got = model(ids, use_cache=False).logits
    assert calls["fused"][-1].dtype == calls["fused"][-1].norm_dtype == torch.float16
    assert (got.double() - want).abs().max().item() < 0.05 * want.abs().max().item()


def test_errors() -> None:
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
    with pytest.raises(NotImplementedError, match="fuse_rope: rope_type 'yarn' is not supported"):
        huggingface_rope.fuse_rope(_model("llama", rope_parameters=yarn))
    gemma = transformers.Gemma2ForCausalLM._from_config(transformers.Gemma2Config(**COMMON))
    with pytest.raises(ValueError, match="fuse_rope: Gemma2ForCausalLM has no attention layer it converts"):
        huggingface_rope.fuse_rope(gemma)


def test_configs_pass_through_the_graph_as_their_values() -> None:
    """The configs cross into the graph-allowed calls as `values()`: every field, in order
    (a field added to a config and not to its `values` fails here)."""
    import dataclasses

    plain = huggingface.AttentionConfig(32, 8, 128, 128, torch.bfloat16, None, 50.0, True, 4096, "top_left",
                                        ("b", "h"), torch.float32, 0.0)
    fused = huggingface_rope.FusedRopeConfig(32, 8, 128, torch.bfloat16, 0.088, (("theta", 5e5),), 1e-6, torch.float32)
    for config in (plain, fused):
        values = config.values()
        assert values == tuple(getattr(config, f.name) for f in dataclasses.fields(config))
        assert type(config)(*values) == config
