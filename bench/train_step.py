"""Full training steps of a Llama-3-8B-width model: AttnFuse's HF backend against SDPA and flex_attention.

    python bench/train_step.py --out DIR                    # timed steps at S = 2048, 4096, 8192
    python bench/train_step.py --out DIR --convergence      # loss curves on a small real text corpus

The model is transformers' LlamaForCausalLM built from a LlamaConfig of Llama-3-8B's
width (hidden 4096, 32 query and 8 KV heads of 128, MLP 14336, vocab 128256, RoPE theta
5e5), randomly initialised (seeded: every implementation starts from the same weights)
in bf16 and trained with AdamW in bf16 (weights, gradients and both moments: 8 bytes a
parameter). Attention implementations (`--impls`, HF's `attn_implementation`):

- attnfuse: `attnfuse.integrations.huggingface`. The model rotates q and k itself
  before calling the attention interface, so the programs start at `attn.scores`;
- attnfuse_rope: the same backend with `huggingface_rope.fuse_rope(model)`: the layers
  hand over unrotated q and k and the position ids, and RoPE runs inside AttnFuse's
  kernels (forward and backward);
- sdpa_cudnn, sdpa_flash: HF's SDPA integration with only that backend allowed
  (`torch.nn.attention.sdpa_kernel`): a shape it cannot run is an error, not a fallback;
- flex_attention: HF's flex_attention integration (causal BlockMask);
- sdpa: SDPA with PyTorch's own backend choice (for CPU smoke tests).

Masks: every implementation gets the plain causal mask (`is_causal` for SDPA, mask ops
for AttnFuse, a causal BlockMask for flex), as in an eager step. Under torch.compile
transformers itself would add a packed-sequence mask it cannot rule out while tracing
(dense for SDPA and AttnFuse), so the models use mask functions that know the batches
are unpacked (`register`, `huggingface.unpacked`).

Timed steps: B*S = --tokens (16384) at each S, synthetic uniform tokens (the same for
every implementation). One step = forward with the loss, backward, AdamW step,
zero_grad; the model under torch.compile (--compile). Reported: median step time of
--steps steps after --warmup steps (the first one compiles), tokens/s, peak memory of
the timed steps (torch.cuda.max_memory_allocated), step time over the fastest at the
same S, the loss of every step (step 0 is the same computation for every
implementation). DIR/results.json is rewritten after every configuration (a run cut
short keeps what it measured), DIR/summary.md at the end.

Layers: --layers, by default the most whose estimated peak fits --memory-budget-gib
(`estimate`): 18 at the defaults (4.98 B parameters, 120.1 GiB estimated; 19 would be
124.8 GiB against the budget of 122, which leaves 17 of the H200's 139 GiB to the CUDA
context, cuBLAS / cuDNN workspaces, compilation and fragmentation). The estimate is an
eager step's: 8 bytes a parameter, the activations autograd saves, per token and
decoder layer 16h + 2(Hq + 2Hkv)D + 4Hq + 2HqD + 8m bytes (209 KB here: two RMSNorms in f32 and bf16, the projections'
inputs, q/k/v/out/lse of attention, the MLP's four [tokens, m] tensors; saved-tensor
hooks on a meta-device step measured the same), and the loss, 8h + 14V bytes a token
(f32 log-probabilities and their gradients). torch.compile recomputes some of it, so a
compiled step should peak lower: results.json has the estimate and the measured peaks.

Convergence (--convergence): --convergence-steps steps of --convergence-tokens tokens
(sequences of the first --seqs length) from CPython's `pydoc_data.topics` (the
language reference's topics in plain English, ~465 KB, shipped with every CPython, so
nothing is downloaded), one token a byte; the same seeded model (4 layers unless
--layers), data order and AdamW (warmup then constant --lr, gradients clipped at 1.0)
for every implementation (attnfuse, sdpa_cudnn and sdpa_flash unless --impls).
DIR/convergence.json has every curve and the largest difference of each curve from the
first non-AttnFuse one's (the difference between two SDPA backends is the scale of
plain kernel rounding); DIR/convergence.md, and convergence.png when matplotlib is
installed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
from transformers.integrations.flex_attention import flex_attention_forward
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flex_attention_mask

from attnfuse.integrations import huggingface, huggingface_rope

IMPLEMENTATIONS = ("attnfuse", "attnfuse_rope", "sdpa_cudnn", "sdpa_flash", "flex_attention", "sdpa")
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
ROPE_NOTE = ("attnfuse runs through the HF backend, which receives q and k already rotated by the model; "
             "attnfuse_rope (huggingface_rope.fuse_rope) hands it unrotated q and k, and RoPE runs in "
             "AttnFuse's kernels.")


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The model, precision, device and optimizer options both training scripts share."""
    model = parser.add_argument_group("model (default: Llama-3-8B's width)")
    model.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096)")
    model.add_argument("--heads", type=int, default=32, help="query heads (default 32)")
    model.add_argument("--kv-heads", type=int, default=8, help="key/value heads (default 8)")
    model.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    model.add_argument("--mlp", type=int, default=14336, help="MLP intermediate size (default 14336)")
    model.add_argument("--vocab", type=int, default=128256, help="vocabulary size (default 128256)")
    model.add_argument("--theta", type=float, default=500000.0, help="RoPE theta (default 5e5)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                        help="model and optimizer-state dtype (default bf16)")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda; cpu for smoke tests)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default 0)")
    parser.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (default 3e-4)")


def llama_config(args: argparse.Namespace, layers: int, seq: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp,
                       num_hidden_layers=layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                       head_dim=args.head_dim, rope_theta=args.theta, max_position_embeddings=max(seq, 8192),
                       use_cache=False)


def register() -> None:
    """Each implementation under a name of its own, `<name>_unpacked`, whose mask function
    knows that a step's sequences are not packed (`huggingface.unpacked`). SDPA takes AttnFuse's mask
    function: `sdpa_mask`, except that it leaves the plain causal mask to `is_causal` under
    torch.compile too (transformers < 5.24 or torch < 2.14 build it densely there)."""
    huggingface.register()
    for name, forward, masks in (("attnfuse", huggingface.attention_forward, huggingface.attention_mask_function),
                                 ("sdpa", sdpa_attention_forward, huggingface.attention_mask_function),
                                 ("flex_attention", flex_attention_forward, flex_attention_mask)):
        AttentionInterface.register(f"{name}_unpacked", forward)
        AttentionMaskInterface.register(f"{name}_unpacked", huggingface.unpacked(masks))


def build_model(config: LlamaConfig, impl: str, device: torch.device, dtype: torch.dtype,
                seed: int) -> LlamaForCausalLM:
    """The model with random weights drawn from `seed` directly on `device`, in training mode."""
    register()
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, attn_implementation=hf_implementation(impl), dtype=dtype)
    if impl == "attnfuse_rope":
        huggingface_rope.fuse_rope(model)
    return model.train()


def hf_implementation(impl: str) -> str:
    """The `attn_implementation` name (`register`) of an implementation."""
    return f"{'sdpa' if impl.startswith('sdpa') else impl.removesuffix('_rope')}_unpacked"


def attention_context(impl: str) -> contextlib.AbstractContextManager[Any]:
    """For sdpa_cudnn / sdpa_flash, SDPA restricted to that backend (it must hold while
    torch.compile traces, which picks the kernel, and while the steps run)."""
    if impl not in ("sdpa_cudnn", "sdpa_flash"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.CUDNN_ATTENTION if impl == "sdpa_cudnn" else SDPBackend.FLASH_ATTENTION)


def synthetic_tokens(step: int, rows: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """Uniform token ids [rows, seq] for one step, drawn on the CPU (the same on every device)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab, (rows, seq), generator=generator)


def adamw(model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW whose moments have the parameters' dtype; the fused kernel on CUDA."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=True if device.type == "cuda" else None)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    """torch.cuda.max_memory_allocated in GiB (None off CUDA)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def release() -> None:
    """Drop compiled graphs (which hold the model) and cached device memory between runs."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def environment(device: torch.device) -> dict[str, Any]:
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "argv": sys.argv[1:]}


def describe(config: LlamaConfig) -> str:
    return (f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.num_attention_heads}/"
            f"{config.num_key_value_heads} heads of {config.head_dim}, MLP {config.intermediate_size}, "
            f"vocab {config.vocab_size}")


def parameters(config: LlamaConfig) -> int:
    h, d, m = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    layer = h * q + 2 * h * kv + q * h + 3 * h * m + 2 * h
    return config.num_hidden_layers * layer + 2 * config.vocab_size * h + h


def estimate(config: LlamaConfig, tokens: int) -> dict[str, float]:
    """Estimated peak of one eager bf16 step with AdamW, in GiB by part (module docstring)."""
    h, d, m, v = config.hidden_size, config.head_dim, config.intermediate_size, config.vocab_size
    hq, hkv = config.num_attention_heads, config.num_key_value_heads
    per_token_layer = 16 * h + 2 * (hq + 2 * hkv) * d + 4 * hq + 2 * hq * d + 8 * m
    parts = {"weights_grads_adamw": 8 * parameters(config),
             "layer_activations": tokens * config.num_hidden_layers * per_token_layer,
             "loss": tokens * (8 * h + 14 * v)}
    gib = {name: value / 2**30 for name, value in parts.items()}
    return {**gib, "total": sum(gib.values())}


def fit_layers(args: argparse.Namespace, tokens: int, budget_gib: float) -> int:
    """The most decoder layers whose estimated peak fits the budget (at least 1)."""
    layers = 1
    while estimate(llama_config(args, layers + 1, 0), tokens)["total"] <= budget_gib:
        layers += 1
    return layers


def compiled(model: LlamaForCausalLM, mode: str, backend: str) -> Callable[..., Any]:
    """The callable that runs the model: torch.compile of the whole model, of each decoder
    layer (regional compilation: one graph reused by every layer), or the model itself."""
    if mode == "model":
        return torch.compile(model, backend=backend, dynamic=False)
    if mode == "layers":
        for layer in model.model.layers:
            layer.compile(backend=backend, dynamic=False)
    return model


def train_step(forward: Callable[..., Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               ids: torch.Tensor, clip: float | None = None) -> torch.Tensor:
    """Forward with the next-token loss, backward, (clipping,) AdamW step, zero_grad."""
    loss = forward(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def graph_breaks() -> dict[str, int]:
    """Dynamo's graph breaks since the counters were cleared, by reason."""
    return dict(torch._dynamo.utils.counters["graph_break"])


def time_steps(args: argparse.Namespace, impl: str, seq: int) -> dict[str, Any]:
    """Warmup and timed steps of one implementation at one S; the row's measurements."""
    device, batch = torch.device(args.device), max(1, args.tokens // seq)
    data = [synthetic_tokens(i, batch, seq, args.vocab, args.seed).to(device)
            for i in range(args.warmup + args.steps)]
    torch._dynamo.utils.counters.clear()
    times: list[float] = []
    losses: list[float] = []
    with attention_context(impl):
        model = build_model(llama_config(args, args.layers, seq), impl, device, DTYPES[args.dtype], args.seed)
        optimizer = adamw(model, args.lr, device)
        forward = compiled(model, args.compile, args.compile_backend)
        for i, ids in enumerate(data):
            if i == args.warmup:
                reset_peak(device)
            synchronize(device)
            start = time.perf_counter()
            loss = train_step(forward, model, optimizer, ids)
            synchronize(device)
            times.append(time.perf_counter() - start)
            losses.append(float(loss))
            phase = "warmup" if i < args.warmup else "timed"
            print(f"[{impl} S={seq} B={batch}] step {i + 1}/{len(data)} ({phase}): {times[-1] * 1e3:.1f} ms, "
                  f"loss {losses[-1]:.4f}", flush=True)
        kernels = attention_kernels(lambda: train_step(forward, model, optimizer, data[-1])) \
            if device.type == "cuda" and impl.startswith("attnfuse") else []
    if kernels:
        print(f"[{impl} S={seq}] AttnFuse kernels of one more step: {', '.join(kernels)}", flush=True)
    step_ms = statistics.median(times[args.warmup:]) * 1e3
    breaks = graph_breaks()
    for reason, count in breaks.items():
        print(f"[{impl} S={seq}] graph break x{count}: {reason}", flush=True)
    return {"step_ms": step_ms, "tokens_per_s": batch * seq / step_ms * 1e3, "peak_gib": peak_gib(device),
            "first_step_s": times[0], "graph_breaks": sum(breaks.values()), "graph_break_reasons": breaks,
            "losses": losses, "attnfuse_kernels": kernels,
            "step_ms_all": [t * 1e3 for t in times]}


def attention_kernels(step: Callable[[], Any]) -> list[str]:
    """The GPU kernels of the Hugging Face backends' programs (`hf_attention`,
    `hf_rope_attention`) that one more step runs, from the profiler: which of the Hopper
    (`*_ws`) and Triton kernels the calls took."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if e.key.startswith("hf_")})


def rank(rows: list[dict[str, Any]]) -> None:
    """`time_ratio_to_best`: step time over the fastest implementation's at the same S (1 = fastest)."""
    for seq in {r["seq"] for r in rows}:
        timed = [r for r in rows if r["seq"] == seq and "step_ms" in r]
        for r in timed:
            r["time_ratio_to_best"] = r["step_ms"] / min(t["step_ms"] for t in timed)


def summary(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    est = meta["estimate_gib"]
    lines = [f"## Training step: Llama {meta['model']}, {meta['dtype']}, AdamW, B*S = {meta['tokens']}, "
             f"torch.compile: {meta['compile']}", "",
             f"Device: {meta['device']}; torch {meta['torch']}, transformers {meta['transformers']}. "
             f"{meta['parameters'] / 1e9:.2f} B parameters; estimated eager peak {est['total']:.1f} GiB "
             f"(weights + gradients + AdamW {est['weights_grads_adamw']:.1f}, activations "
             f"{est['layer_activations']:.1f}, loss {est['loss']:.1f}). {ROPE_NOTE}", "",
             "| S | B | implementation | step ms | tokens/s | peak GiB | time / best | loss step 0 | first step s "
             "| graph breaks |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted((r for r in rows if "step_ms" in r), key=lambda r: (r["seq"], r["step_ms"])):
        peak = "" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        lines.append(f"| {r['seq']} | {r['batch']} | {r['impl']} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} "
                     f"| {peak} | {r['time_ratio_to_best']:.3f} | {r['losses'][0]:.4f} | {r['first_step_s']:.1f} "
                     f"| {r['graph_breaks']} |")
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", "Errors:", ""] + [f"- S={r['seq']} {r['impl']}: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


def run_timed(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    rows: list[dict[str, Any]] = []
    started = time.time()

    def save() -> None:
        (args.out / "results.json").write_text(json.dumps({**meta, "seconds": time.time() - started,
                                                           "rows": rows}, indent=1))

    for seq in args.seqs:
        for impl in args.impls:
            row: dict[str, Any] = {"seq": seq, "batch": max(1, args.tokens // seq), "impl": impl}
            try:
                row.update(time_steps(args, impl, seq))
            except Exception as exc:  # reported in the results, never hidden
                traceback.print_exc()
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            release()
            rows.append(row)
            rank(rows)
            save()
            print(f"[{time.time() - started:.0f} s] S={seq} {impl}: "
                  + (f"{row['step_ms']:.1f} ms/step" if "step_ms" in row else row["error"]), flush=True)
    text = summary(meta, rows)
    (args.out / "summary.md").write_text(text)
    print(text, flush=True)


def corpus() -> tuple[torch.Tensor, dict[str, Any]]:
    """CPython's pydoc topics as byte tokens, and what identifies the text."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics)).encode()
    about = {"name": "pydoc_data.topics (CPython's language reference topics)", "bytes": len(text),
             "sha256": hashlib.sha256(text).hexdigest(), "python": platform.python_version(),
             "tokens": "one per byte"}
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long(), about


def corpus_batches(tokens: torch.Tensor, steps: int, rows: int, seq: int, seed: int) -> Iterator[torch.Tensor]:
    """Random windows of the corpus, [rows, seq] a step, in a seeded order."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - seq, (rows,), generator=generator)
        yield torch.stack([tokens[s:s + seq] for s in starts.tolist()])


def train_curve(args: argparse.Namespace, impl: str, tokens: torch.Tensor) -> list[float]:
    """The loss of every step of one implementation's convergence run."""
    device, seq = torch.device(args.device), args.seqs[0]
    rows = max(1, args.convergence_tokens // seq)
    warmup = max(1, args.convergence_steps // 10)
    losses: list[float] = []
    with attention_context(impl):
        model = build_model(llama_config(args, args.layers, seq), impl, device, DTYPES[args.dtype], args.seed)
        optimizer = adamw(model, args.lr, device)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        forward = compiled(model, args.compile, args.compile_backend)
        started = time.time()
        batches = corpus_batches(tokens, args.convergence_steps, rows, seq, args.seed)
        for i, ids in enumerate(batches):
            losses.append(float(train_step(forward, model, optimizer, ids.to(device), clip=1.0)))
            schedule.step()
            print(f"[convergence {impl}] step {i + 1}/{args.convergence_steps}: loss {losses[-1]:.4f} "
                  f"({time.time() - started:.0f} s)", flush=True)
    return losses


def run_convergence(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    tokens, about = corpus()
    curves: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    for impl in args.impls:
        try:
            curves[impl] = train_curve(args, impl, tokens)
        except Exception as exc:  # reported in the results, never hidden
            traceback.print_exc()
            errors[impl] = f"{type(exc).__name__}: {exc}"[:400]
        release()
        text = write_convergence(args, meta, about, curves, errors)  # after every curve: a cut run keeps the rest
    print(text, flush=True)


def write_convergence(args: argparse.Namespace, meta: dict[str, Any], about: dict[str, Any],
                      curves: dict[str, list[float]], errors: dict[str, str]) -> str:
    """DIR/convergence.json, .md and .png for the curves so far; the markdown."""
    reference = next((impl for impl in curves if impl != "attnfuse"), None)
    differences = {} if reference is None else {
        f"{impl} vs {reference}": {
            "max_abs": max(abs(a - b) for a, b in zip(curve, curves[reference])),
            "mean_abs": statistics.fmean(abs(a - b) for a, b in zip(curve, curves[reference])),
        } for impl, curve in curves.items() if impl != reference}
    tail = max(1, min(10, args.convergence_steps // 10))
    final = {impl: statistics.fmean(curve[-tail:]) for impl, curve in curves.items()}
    result = {**meta, "corpus": about, "seq": args.seqs[0], "tokens_per_step": args.convergence_tokens,
              "steps": args.convergence_steps, "reference": reference, "differences": differences,
              "final_loss": final, "curves": curves, "errors": errors}
    (args.out / "convergence.json").write_text(json.dumps(result, indent=1))
    lines = [f"## Convergence: Llama {meta['model']}, {meta['dtype']}, "
             f"{args.convergence_steps} steps of {args.convergence_tokens} tokens (S = {args.seqs[0]}), "
             f"{about['name']} as bytes", "", ROPE_NOTE, "",
             f"| implementation | loss step 0 | mean loss of the last {tail} steps "
             f"| max abs diff vs {reference or '-'} | mean abs diff |", "|---|---:|---:|---:|---:|"]
    for impl, curve in curves.items():
        diff = differences.get(f"{impl} vs {reference}")
        cells = f"{diff['max_abs']:.4g} | {diff['mean_abs']:.4g}" if diff else " | "
        lines.append(f"| {impl} | {curve[0]:.4f} | {final[impl]:.4f} | {cells} |")
    lines += [f"- {impl}: {error}" for impl, error in errors.items()]
    text = "\n".join(lines) + "\n"
    (args.out / "convergence.md").write_text(text)
    plot(curves, args.out / "convergence.png")
    return text


def plot(curves: dict[str, list[float]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for impl, curve in curves.items():
        ax.plot(range(len(curve)), curve, label=impl, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats per byte)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and markdown results")
    parser.add_argument("--impls",
                        help=f"comma-separated attention implementations, of {', '.join(IMPLEMENTATIONS)} "
                             "(default: all but sdpa; attnfuse,sdpa_cudnn,sdpa_flash with --convergence)")
    parser.add_argument("--layers", type=int,
                        help="decoder layers (default: the most that fit --memory-budget-gib by the estimate, "
                             "18 at the defaults; 4 with --convergence)")
    parser.add_argument("--memory-budget-gib", type=float, default=122.0,
                        help="budget of the estimated peak that picks the default --layers (default 122: an "
                             "H200's 139 GiB less room for workspaces, compilation and fragmentation)")
    parser.add_argument("--seqs", default="2048,4096,8192",
                        help="sequence lengths, comma-separated (default 2048,4096,8192; --convergence uses the first)")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per timed step, B*S (default 16384)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first, compilation included (default 3)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps; the median is reported (default 10)")
    parser.add_argument("--compile", choices=("model", "layers", "none"), default="model",
                        help="torch.compile the whole model (default), each decoder layer, or nothing")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--convergence", action="store_true",
                        help="run the loss-curve comparison on pydoc_data.topics instead of the timed steps")
    parser.add_argument("--convergence-steps", type=int, default=300, help="steps of each curve (default 300)")
    parser.add_argument("--convergence-tokens", type=int, default=8192, help="tokens per step (default 8192)")
    add_model_args(parser)
    args = parser.parse_args(argv)
    default = "attnfuse,sdpa_cudnn,sdpa_flash" + ("" if args.convergence else ",flex_attention")
    args.impls = (args.impls or default).split(",")
    unknown = sorted(set(args.impls) - set(IMPLEMENTATIONS))
    if unknown:
        parser.error(f"unknown --impls {', '.join(unknown)} (choose from {', '.join(IMPLEMENTATIONS)})")
    args.seqs = [int(s) for s in args.seqs.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # read at CUDA's first use
    tokens = args.convergence_tokens if args.convergence else args.tokens
    if args.layers is None:
        args.layers = 4 if args.convergence else fit_layers(args, tokens, args.memory_budget_gib)
    args.out.mkdir(parents=True, exist_ok=True)
    config = llama_config(args, args.layers, max(args.seqs))
    meta = {**environment(torch.device(args.device)), "model": describe(config), "layers": args.layers,
            "dtype": args.dtype,
            "compile": args.compile if args.compile == "none" else f"{args.compile} ({args.compile_backend})",
            "tokens": tokens, "parameters": parameters(config), "estimate_gib": estimate(config, tokens),
            "config": config.to_diff_dict(), "notes": [ROPE_NOTE]}
    est = meta["estimate_gib"]
    print(f"Llama {meta['model']}: {meta['parameters'] / 1e9:.2f} B parameters, estimated eager peak "
          f"{est['total']:.1f} GiB at {tokens} tokens a step", flush=True)
    if args.convergence:
        run_convergence(args, meta)
    else:
        run_timed(args, meta)


if __name__ == "__main__":
    main()
