"""A contiguous KV cache with per-sequence lengths (`attn.scores %q, %k kv_lens %lens`)
through the Triton interpreter.

The cache is `[B, Hkv, capacity, D]`, sequence `b` holds its first `kv_lens[b]` keys, and
every row past them is NaN: the kernels must neither read them into a result nor let
them leak through a masked score. Decode (Sq = 1, 16: the split-KV kernels) and prefill
(Sq = 37: the forward kernel), every building block of the paged tests, f16 and f32,
against the float64 reference within PyTorch's own error in the same dtype.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from paged_programs import BR, PagedProgram, assert_matches_reference, extra_args, paged
from split_kv_check import launches, relative_error
from test_paged import BLOCKS

import attnfuse
from attnfuse import reference
from attnfuse.analysis.split_kv import default_rows
from attnfuse.api import AttnfuseArgumentError
from attnfuse.program import ProgramError, analyze

LENS = (5, 37, 70)
CAPACITY = 80


def contiguous(program: PagedProgram) -> PagedProgram:
    """`program` reading a contiguous cache with lengths instead of page pools."""
    text = program.text.replace(", %bt: tensor<?x?xi32>", "").replace(" block_table %bt", "")
    text = text.replace("tensor<?x?xi32>, tensor<?xi32> ->", "tensor<?xi32> ->")
    text = re.sub(rf"tensor<\?x(\d+)x{program.page_size}x", r"tensor<?x\1x?x", text)
    return PagedProgram(text, program.page_size, program.extras, program.last_scores, program.heads)


def cache_inputs(program: PagedProgram, lens: Sequence[int], q_len: int, *, seed: int = 0,
                 dtype: torch.dtype = torch.float16, capacity: int = CAPACITY) -> list[Any]:
    """q, NaN-padded caches of `capacity` keys per sequence, kv_lens, then the extras."""
    g = torch.Generator().manual_seed(seed)
    parsed = reference.parse_program(program.text)
    shapes = [a.type.get_shape() for a in next(iter(parsed.ops)).args[:3]]  # type: ignore[attr-defined]
    q = torch.randn(len(lens), shapes[0][1], q_len, shapes[0][3], generator=g).to(dtype)
    k, v = (torch.randn(len(lens), s[1], capacity, s[3], generator=g).to(dtype) for s in shapes[1:])
    for b, n in enumerate(lens):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    return [q, k, v, torch.tensor(lens, dtype=torch.int32), *extra_args(program, lens, q_len, g)]


_COMPILED: dict[str, attnfuse.api.AttentionFunction] = {}


def check(program: PagedProgram, q_len: int, lens: Sequence[int] = LENS, *, dtype: torch.dtype = torch.float16,
          seed: int = 0) -> torch.Tensor:
    """Run on fresh inputs; the kernel that served the call (split-KV when `Sq * group`
    rows fit its tile, else the forward kernel), and the error bound."""
    if program.text not in _COMPILED:
        _COMPILED[program.text] = attnfuse.compile(program.text)
    fn = _COMPILED[program.text]
    args = cache_inputs(program, lens, q_len, seed=seed, dtype=dtype)
    result = fn(*args)
    ran = launches(fn, args)
    group = program.heads // args[1].shape[1]
    rows = default_rows(analyze(next(iter(reference.parse_program(program.text).ops))))  # type: ignore[arg-type]
    assert ("f_fwd" in ran) == (q_len * group > rows), ran
    assert not any(name.endswith("_short") for name in ran), ran  # the paged kernel only
    return assert_matches_reference(program, args, result)


@pytest.mark.filterwarnings("ignore:.*aligned top-left")
@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("q_len", [1, 16, 37])
def test_building_block(block: str, q_len: int) -> None:
    check(contiguous(BLOCKS[block]()), q_len, seed=q_len)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (8, 1)])
@pytest.mark.parametrize("q_len", [1, 4, 20])
def test_shapes(q_len: int, hq: int, hkv: int, dtype: torch.dtype) -> None:
    """GQA groups 1 and 8 (MQA); V with another head dim; f16 and f32."""
    p = contiguous(paged(hq, hkv, 32, 48, "f16" if dtype == torch.float16 else "f32",
                         score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"]))
    p.heads = hq
    check(p, q_len, dtype=dtype)


def test_empty_and_full_sequences() -> None:
    """kv_lens 0 (output 0) and the whole capacity."""
    p = contiguous(paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"], lse=True))
    for q_len in (1, 20):
        out = check(p, q_len, (0, CAPACITY, 29))
        assert (out[0] == 0).all()


def test_one_launch_plan_serves_every_length() -> None:
    """A decode loop on a cache allocated once: lengths are data, so every step runs the
    launch plan of the first."""
    p = contiguous(paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"]))
    fn = attnfuse.compile(p.text.replace("@f(", "@growing_cache("))
    for step in range(4):
        args = cache_inputs(p, (5 + step, 9 + step, 1 + step), 1, seed=step)
        assert relative_error(fn(*args), reference.run(p.text, *args)) < 5e-3
    assert fn._host.plan_count() == 1  # noqa: SLF001


def test_value_checks_and_errors() -> None:
    p = contiguous(paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"]))
    fn = attnfuse.compile(p.text.replace("@f(", "@checked_cache("))
    args = cache_inputs(p, LENS, 1)
    args[3] = torch.tensor([5, CAPACITY + 1, 3], dtype=torch.int32)
    fn.check_page_values = True
    with pytest.raises(AttnfuseArgumentError, match=r"argument 3 '.*': kv_lens\[1\] = 81 is not in \[0, 80\]"):
        fn(*args)
    fn.check_page_values = False
    args[1][1], args[2][1] = args[1][1].nan_to_num(0.0), args[2][1].nan_to_num(0.0)
    out = fn(*args)  # unchecked: clamped to the capacity (80 keys), never past it
    assert not torch.isnan(out).any()
    want = reference.run(p.text, *args[:3], torch.tensor([5, CAPACITY, 3], dtype=torch.int32))
    assert relative_error(out, want) < 5e-3
    args[3] = torch.tensor([5, 6], dtype=torch.int32)
    with pytest.raises(AttnfuseArgumentError, match="argument 3"):
        fn(*args)


def test_no_backward_and_no_k_transforms() -> None:
    p = contiguous(paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"]))
    fn = attnfuse.compile(p.text.replace("@f(", "@inference_cache("))
    args = cache_inputs(p, LENS, 1)
    for b, n in enumerate(LENS):
        args[1][b, :, n:] = 0.0
        args[2][b, :, n:] = 0.0
    args[0].requires_grad_(True)
    with pytest.raises(RuntimeError, match="has no gradient: a KV cache with kv_lens"):
        fn(*args)
    with pytest.raises(ProgramError, match="attn.rope on K of a KV cache with kv_lens"):
        attnfuse.compile(contiguous(paged(k_rope=True)).text)


def test_append_into_a_contiguous_cache() -> None:
    """`append_paged_kv` writes into a contiguous cache read as a pool of one page of its
    whole capacity per sequence (block table `arange(B)[:, None]`), rotating the new
    keys; the attention then reads them through kv_lens."""
    from attnfuse.inference import append_paged_kv

    p = contiguous(paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"]))
    fn = attnfuse.compile(p.text.replace("@f(", "@appended_cache("))
    g = torch.Generator().manual_seed(11)
    k_cache, v_cache = (torch.zeros(3, 2, CAPACITY, 32).half() for _ in range(2))
    lens = torch.tensor([0, 5, 77], dtype=torch.int32)
    table = torch.arange(3, dtype=torch.int32).view(3, 1)
    k_new, v_new = (torch.randn(3, 2, 3, 32, generator=g).half() for _ in range(2))
    new_lens = append_paged_kv(k_cache, v_cache, table, lens, k_new, v_new, rope={"theta": 10000.0})
    assert new_lens.tolist() == [3, 8, 80]
    ty = "tensor<?x2x?x32xf32>"
    rope = (f"func.func @r(%k: {ty}, %pos: tensor<?x?xi32>) -> {ty} {{\n  %r = attn.rope %k positions %pos "
            f"{{theta = 10000.0}} : {ty}, tensor<?x?xi32>\n  func.return %r : {ty}\n}}")
    positions = (lens.view(3, 1) + torch.arange(3)).to(torch.int32)
    rotated = reference.run(rope, k_new.float(), positions)
    for b, n in enumerate(lens.tolist()):
        assert torch.equal(v_cache[b, :, n:n + 3], v_new[b])
        assert (k_cache[b, :, n:n + 3].double() - rotated[b]).abs().max() < 2e-3  # rotated at positions n..n+2
    q = torch.randn(3, 4, 1, 32, generator=g).half()
    out = fn(q, k_cache, v_cache, new_lens)
    assert relative_error(out, reference.run(p.text, q, k_cache, v_cache, new_lens)) < 5e-3
