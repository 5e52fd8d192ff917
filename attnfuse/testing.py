"""Random inputs for attention programs, and dtype-justified tolerances.

Used by the test suite and the GPU checks: `make_inputs` reads a program's signature and
builds fresh random arguments for it (never zeros): q/k/v ~ N(0, 1); position ids
`arange(S)` (plus a random shift); document ids as sorted random segments; prefix lengths
in [0, S]; norm weights ~ 1 + 0.1 N(0, 1); sinks, slopes and bias tables ~ N(0, 1) at
the right scale; seeds as Python ints. For a packed batch, `batch` sequences of random
lengths up to `q_len` / `kv_len` (the first that long, the last of length 1 from three
sequences on; equal lengths for q and k when `q_len == kv_len` or one cu_seqlens serves
both) and their cu_seqlens.
"""

from __future__ import annotations

from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerType, TensorType

from attnfuse.runtime.checks import torch_dtype

TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    # (atol, rtol) of |out - ref| <= atol + rtol * |ref|. The kernel rounds rotated /
    # normalised q and k to the input dtype before QK^T and P to it before PV, and the
    # output once more: a few roundings of the dtype's unit (bf16 2^-8, fp16 2^-11,
    # fp32 2^-24 relative), amplified by exp where scores are large.
    torch.float32: (1e-4, 1e-4),
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2.5e-2, 2.5e-2),
}


def _segments(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    ids = torch.zeros(batch, length, dtype=torch.int32)
    for row in range(batch):
        cuts = torch.randint(1, max(2, length), (3,), generator=generator).sort().values
        for cut in cuts:
            ids[row, int(cut):] += 1
    return ids


def packed_lengths(batch: int, longest: int, generator: torch.Generator) -> list[int]:
    """Lengths of `batch` packed sequences: random in [1, longest], the first `longest`,
    the last 1 when there are three or more."""
    lengths = torch.randint(1, longest + 1, (batch,), generator=generator).tolist()
    lengths[0] = longest
    if batch >= 3:
        lengths[-1] = 1
    return lengths


def cu_seqlens(lengths: list[int], device: str | torch.device = "cpu") -> torch.Tensor:
    """The int32 cumulative lengths `[0, l0, l0 + l1, ...]`."""
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32,
                        device=device)


def _packed_sides(function: func.FuncOp) -> dict[int, str]:
    """Argument index -> "q" / "k" of the cu_seqlens of a packed program (empty if none)."""
    from attnfuse.analysis.packing import packed_batch
    from attnfuse.program import analyze

    program = analyze(function)
    packing = packed_batch(program)
    if packing is None:
        return {}
    return {index: {"Sq": "q", "Skv": "k"}[side] for index, side in reversed(packing.arguments(program))}


def make_inputs(
    function: func.FuncOp,
    batch: int,
    q_len: int,
    kv_len: int,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> list[Any]:
    """Random arguments for `function` (an attention program's func.func)."""
    g = torch.Generator().manual_seed(seed)
    args: list[Any] = []
    packed = _packed_sides(function)
    if packed:
        lengths = {"q": packed_lengths(batch, q_len, g)}
        shared = len(packed) == 1  # one cu_seqlens for both sides
        lengths["k"] = lengths["q"] if q_len == kv_len or shared else packed_lengths(batch, kv_len, g)
        q_len, kv_len, batch = sum(lengths["q"]), sum(lengths["k"]), 1
    for index, arg in enumerate(function.args):
        ty = arg.type
        name = arg.name_hint or ""
        if not isinstance(ty, TensorType):
            assert isinstance(ty, IntegerType)
            args.append(int(torch.randint(0, 2**40, (1,), generator=g)))
            continue
        shape = list(ty.get_shape())
        dtype = torch_dtype(ty.element_type)
        seq = q_len if index == 0 else kv_len
        if index in packed:
            args.append(cu_seqlens(lengths[packed[index]], device))
        elif len(shape) == 4 and index < 3:
            shape = [batch, shape[1], seq, shape[3]]
            args.append(torch.randn(shape, generator=g).to(dtype).to(device))
        elif len(shape) == 4:  # bias table, broadcast dims stay 1
            full = [batch, shape[1], q_len, kv_len]
            shape = [1 if d == 1 else full[i] for i, d in enumerate(shape)]
            args.append(torch.randn(shape, generator=g).to(dtype).to(device))
        elif dtype in (torch.int32, torch.int64):
            if len(shape) in (1, 2) and "pos" in name:  # key positions: [Skv] or [B, Skv]
                rows = batch if len(shape) == 2 else 1
                pos = torch.arange(kv_len).repeat(rows, 1) + torch.randint(0, 64, (rows, 1), generator=g)
                args.append((pos if len(shape) == 2 else pos[0]).to(dtype).to(device))
            elif len(shape) == 2:
                args.append(_segments(batch, kv_len, g).to(dtype).to(device))
            else:
                args.append(torch.randint(0, kv_len + 1, (batch,), generator=g).to(dtype).to(device))
        elif len(shape) == 1:
            n = shape[0] if shape[0] > 0 else kv_len
            values = torch.randn(n, generator=g)
            if "w" in name or "weight" in name:
                values = 1.0 + 0.1 * values
            args.append(values.to(dtype).to(device))
        else:
            args.append(torch.randn([max(d, 1) for d in shape], generator=g).to(dtype).to(device))
    return args


def max_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref|, with NaN anywhere counted as infinite."""
    diff = (out.detach().double().cpu() - ref.detach().double().cpu()).abs()
    if torch.isnan(diff).any():
        return float("inf")
    return float(diff.max()) if diff.numel() else 0.0


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Check `out` against the float64 reference with the tolerance of `dtype`
    (default: out's dtype); -inf entries (lse of empty rows) must match exactly."""
    atol, rtol = TOLERANCE[dtype or out.dtype]
    got, want = out.detach().double().cpu(), ref.detach().double().cpu()
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert not torch.isnan(got).any(), "NaN in the output"
    same_inf = (got == want) & torch.isinf(want)
    finite = ~same_inf
    excess = ((got - want).abs() - (atol + rtol * want.abs()))[finite]
    if excess.numel() and float(excess.max()) > 0:
        worst = int(excess.argmax())
        raise AssertionError(
            f"max error {max_error(got[finite], want[finite]):.3e} exceeds atol={atol} rtol={rtol} "
            f"(worst: got {float(got[finite][worst]):.6f}, want {float(want[finite][worst]):.6f})"
        )


def with_dtype(text: str, dtype: str) -> str:
    """A program's text with its q/k/v element type (bf16, f16 or f32) replaced."""
    import re

    return re.sub(r"(tensor<[^<>]*x)(bf16|f16|f32)>", lambda m: m.group(1) + dtype + ">" if m.group(1).count("x") == 4 else m.group(0), text)


__all__ = ["TOLERANCE", "assert_close", "cu_seqlens", "make_inputs", "max_error", "packed_lengths", "with_dtype"]


GRAD_TOLERANCE: dict[torch.dtype, float] = {
    # max |grad - ref| / max |ref|: gradients sum over a whole sequence of rounded
    # products (dS in the input dtype before the dK/dQ dots), so they are checked
    # relative to their largest entry.
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 3e-2,
}


def assert_grad_close(got: torch.Tensor | None, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """A gradient against the float64 reference's, relative to the reference's max."""
    assert got is not None, f"{what}: no gradient"
    got64, want64 = got.detach().double().cpu(), want.detach().double().cpu()
    assert torch.isfinite(got64).all(), f"{what}: non-finite gradient"
    scale = float(want64.abs().max()) or 1.0
    err = float((got64 - want64).abs().max()) / scale
    assert err <= GRAD_TOLERANCE[dtype], f"{what}: relative error {err:.2e} > {GRAD_TOLERANCE[dtype]}"
