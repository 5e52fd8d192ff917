"""``attnfuse-opt --cost-report``: each placement's predicted time, the choice, the crossover."""

from __future__ import annotations

from attnfuse.cost.model import PLACEMENTS, AttentionShape, choose, crossover, crossover_closed_form, predict
from attnfuse.cost.target import Target

__all__ = ["cost_report"]


def _crossover_text(shape: AttentionShape, target: Target, other: str) -> str:
    found = crossover(shape, target, "fused", other)
    if found is None:
        return f"fused vs {other}: no crossover for S in [{shape.fused_block_m}, 4194304]"
    text = f"fused vs {other}: fused stops winning at S = {found}"
    if shape.causal and shape.window is None:
        text += f" (closed form S* = {crossover_closed_form(shape, target, other):.0f})"
    return text + f", batch x S = {shape.batch * shape.seq_len}"


def cost_report(name: str, shape: AttentionShape, target: Target) -> str:
    """The report for function ``name`` at ``shape`` on ``target``, as text."""
    mask = "causal" if shape.causal else "full"
    if shape.window is not None:
        mask += f", window {shape.window}"
    norms = [side for side, on in (("q", shape.q_norm), ("k", shape.k_norm)) if on]
    if norms:
        mask += f", QK-norm on {' and '.join(norms)}"
    lines = [
        f"// cost report: @{name} on {target.name}: B={shape.batch} Hq={shape.q_heads} "
        f"Hkv={shape.kv_heads} S={shape.seq_len} D={shape.head_dim} {shape.dtype} {mask} "
        f"tiles {shape.block_m}x{shape.block_n} (fused {shape.fused_block_m}x{shape.fused_block_n}), "
        f"{'the sm_90 Gluon' if shape.hopper else 'the Triton'} forward kernel's constants",
        "//   placement   fwd us (added)   fwd+bwd us (added)",
    ]
    for p in PLACEMENTS:
        fwd, both = predict(shape, target, p), predict(shape, target, p, backward=True)
        lines.append(
            f"//   {p:<10} {fwd.total * 1e6:9.1f} ({fwd.extra * 1e6:7.1f}) "
            f"{both.total * 1e6:11.1f} ({(both.extra + both.backward_transforms) * 1e6:7.1f})"
        )
    lines.append(f"//   choice: {choose(shape, target)} (forward), {choose(shape, target, backward=True)} (fwd+bwd)")
    for other in ("hybrid", "separate"):
        lines.append("//   " + _crossover_text(shape, target, other))
    table = predict(shape, target, "hybrid").table_build
    lines.append(f"//   cos/sin table build, once per shape class: {table * 1e6:.1f} us")
    lines.append("//   attention time: FLOPs at the target's matmul rate (a floor, the same for every placement)")
    return "\n".join(lines) + "\n"
