"""Paged KV caches at the API: argument checks of paged programs, the opt-in value check,
and `attnfuse.inference.append_paged_kv` (RoPE on the new keys, writes only the new rows,
argument errors), then a decode loop that appends and attends, against the float64
reference of the same attention on contiguous keys."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "lowering"))
from paged_programs import BR, inputs, paged  # noqa: E402

import attnfuse  # noqa: E402
from attnfuse import reference  # noqa: E402
from attnfuse.api import AttnfuseArgumentError  # noqa: E402
from attnfuse.inference import append_paged_kv  # noqa: E402

PROGRAM = paged(score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])
_FN: list[attnfuse.api.AttentionFunction] = []


def fn() -> attnfuse.api.AttentionFunction:
    if not _FN:
        _FN.append(attnfuse.compile(PROGRAM.text))
    return _FN[0]


def args() -> list[Any]:
    return inputs(PROGRAM, (5, 37, 70), 1)


# ============================================================================ program calls


@pytest.mark.parametrize(("index", "value", "message"), [
    (3, lambda a: a[3][:2], r"argument 3 'bt': expected shape \[B=3, max_pages=\d+\], got \(2, \d+\)"),
    (4, lambda a: a[4][:2], r"argument 4 'lens': expected shape \[B=3\], got \(2,\)"),
    (4, lambda a: a[4].long(), r"argument 4 'lens': expected dtype torch.int32, got torch.int64"),
    (3, lambda a: a[3].float(), r"argument 3 'bt': expected dtype torch.int32, got torch.float32"),
    (2, lambda a: a[2][:-1], r"argument 2 'vc': expected shape \[pages=\d+, 2, 8, 32\]"),
    (1, lambda a: a[1][:0], r"argument 2 'vc': expected shape \[pages=0, 2, 8, 32\]"),
])
def test_argument_errors(index: int, value: Any, message: str) -> None:
    call = args()
    call[index] = value(call)
    with pytest.raises(AttnfuseArgumentError, match=message):
        fn()(*call)


def test_empty_pool() -> None:
    call = args()
    call[1], call[2] = call[1][:0], call[2][:0]
    with pytest.raises(AttnfuseArgumentError, match="argument 1 'kc': a page pool needs at least one page"):
        fn()(*call)


def test_value_check_is_opt_in() -> None:
    """Without the check a bad block table runs (clamped, in bounds); with it, an error
    names the entry."""
    call = args()
    call[3][1, 0] = 1000
    out = fn()(*call)
    assert torch.isfinite(out).all()
    checked = attnfuse.compile(PROGRAM.text)
    checked.check_page_values = True
    with pytest.raises(AttnfuseArgumentError, match=r"argument 3 'bt': block_table\[1, 0\] = 1000 is not a page"):
        checked(*call)
    call = args()
    call[4][2] = 10_000
    with pytest.raises(AttnfuseArgumentError, match=r"argument 4 'lens': kv_lens\[2\] = 10000 is not in \[0, \d+\]"):
        checked(*call)
    checked(*args())  # good values pass
    checked.check_page_values = False
    assert not fn().check_page_values  # (one runner for both compilations)


def test_value_check_needs_a_paged_program() -> None:
    contiguous = attnfuse.compile(attnfuse.attention(4, 32, kv_heads=2).causal().build())
    with pytest.raises(ValueError, match="reads no KV cache through kv_lens"):
        contiguous.check_page_values = True


# ============================================================================ append


def _rope_program(heads: int, dim: int, options: str) -> str:
    ty = f"tensor<?x{heads}x?x{dim}xf32>"
    return (f"func.func @r(%k: {ty}, %pos: tensor<?x?xi32>) -> {ty} {{\n"
            f"  %r = attn.rope %k positions %pos {options} : {ty}, tensor<?x?xi32>\n  func.return %r : {ty}\n}}")


def _cache(seed: int = 0, pages: int = 24, page: int = 8, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(pages, 2, page, 32, generator=g).to(dtype)
    v_cache = torch.randn(pages, 2, page, 48, generator=g).to(dtype)
    table = torch.randperm(pages, generator=g)[:15].view(3, 5).to(torch.int32)
    return [k_cache, v_cache, table, torch.tensor([5, 20, 0], dtype=torch.int32)]


ROPES = {
    "half": ({"theta": 10000.0}, "{theta = 10000.0}"),
    "interleaved_partial": ({"theta": 500000.0, "style": "interleaved", "rotary_dim": 16},
                            '{theta = 500000.0, style = "interleaved", rotary_dim = 16}'),
    "llama3": ({"theta": 500000.0, "scaling": "llama3", "factor": 8.0, "original_max_position": 16},
               '{theta = 500000.0, scaling = "llama3", factor = 8.0, original_max_position = 16}'),
    "yarn": ({"theta": 10000.0, "scaling": "yarn", "factor": 4.0, "original_max_position": 32},
             '{theta = 10000.0, scaling = "yarn", factor = 4.0, original_max_position = 32}'),
}


@pytest.mark.parametrize("rope", [*ROPES, None])
def test_append_writes_rotated_keys_into_their_pages(rope: str | None) -> None:
    """Key j = kv_lens[b] + i lands in row j % 8 of page block_table[b, j // 8], rotated at
    position j; values copied; every other row of the pools is untouched."""
    k_cache, v_cache, table, lens = _cache()
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(3, 2, 11, 32, generator=g), torch.randn(3, 2, 11, 48, generator=g)
    before = k_cache.clone(), v_cache.clone()
    new_lens = append_paged_kv(k_cache, v_cache, table, lens, k, v, rope=ROPES[rope][0] if rope else None)
    assert new_lens.tolist() == [16, 31, 11] and lens.tolist() == [5, 20, 0]
    positions = (lens.view(-1, 1) + torch.arange(11)).to(torch.int32)
    want = reference.run(_rope_program(2, 32, ROPES[rope][1]), k, positions) if rope else k.double()
    written = torch.zeros(k_cache.shape[0], 8, dtype=torch.bool)
    for b in range(3):
        for i in range(11):
            j = int(lens[b]) + i
            page, row = int(table[b, j // 8]), j % 8
            written[page, row] = True
            assert (k_cache[page, :, row].double() - want[b, :, i]).abs().max() < 1e-5
            assert torch.equal(v_cache[page, :, row], v[b, :, i])
    for pool, old in zip((k_cache, v_cache), before):
        assert torch.equal(pool.transpose(1, 2)[~written], old.transpose(1, 2)[~written])


def test_append_vllm_layout_view() -> None:
    """A [num_pages, page_size, Hkv, D] cache passes as .transpose(1, 2), no copy."""
    k_cache, v_cache, table, lens = _cache()
    k_nhd, v_nhd = k_cache.transpose(1, 2).contiguous(), v_cache.transpose(1, 2).contiguous()
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(3, 2, 4, 32, generator=g), torch.randn(3, 2, 4, 48, generator=g)
    append_paged_kv(k_cache, v_cache, table, lens, k, v, rope={"theta": 10000.0})
    append_paged_kv(k_nhd.transpose(1, 2), v_nhd.transpose(1, 2), table, lens, k, v, rope={"theta": 10000.0})
    assert torch.equal(k_nhd.transpose(1, 2), k_cache) and torch.equal(v_nhd.transpose(1, 2), v_cache)


def _append_args() -> list[Any]:
    k_cache, v_cache, table, lens = _cache()
    return [k_cache, v_cache, table, lens, torch.randn(3, 2, 4, 32), torch.randn(3, 2, 4, 48)]


@pytest.mark.parametrize(("index", "value", "message"), [
    (2, lambda a: a[2].long(), "argument 'block_table': expected dtype torch.int32, got torch.int64"),
    (3, lambda a: a[3][:2], r"argument 'kv_lens': expected shape \[B=3\] \(rows of block_table\), got \(2,\)"),
    (4, lambda a: a[4][:, :1], r"argument 'k': expected shape \[B=3, Hkv=2, Sn, D=32\], got \(3, 1, 4, 32\)"),
    (5, lambda a: a[5][:, :, :2], r"argument 'v': expected shape \[B=3, Hkv=2, Sn=4, Dv=48\], got \(3, 2, 2, 48\)"),
    (1, lambda a: a[1][:, :, :4], r"argument 'v_cache': expected shape \[num_pages=24, Hkv=2, page_size=8, Dv\]"),
    (4, lambda a: a[4].half(), "argument 'k': expected dtype torch.float32, got torch.float16"),
    (0, lambda a: a[0][0], r"argument 'k_cache': expected a \[num_pages, Hkv, page_size, D\] tensor, got shape"),
    (0, lambda a: a[0][:0], "argument 'k_cache': a page pool needs at least one page"),
])
def test_append_argument_errors(index: int, value: Any, message: str) -> None:
    call = _append_args()
    call[index] = value(call)
    if index == 0 and call[0].dim() == 4:
        call[1] = call[1][:0]
    with pytest.raises(AttnfuseArgumentError, match=message):
        append_paged_kv(*call)


def test_append_value_check_and_bounds() -> None:
    """Keys past the block table: an error with `check_values`, else not written."""
    call = _append_args()
    call[3] = torch.tensor([5, 38, 0], dtype=torch.int32)  # 38 + 4 > 5 pages x 8
    with pytest.raises(AttnfuseArgumentError, match=r"kv_lens\[1\] = 38 plus 4 new keys is not in \[0, 40\]"):
        append_paged_kv(*call, check_values=True)
    before = call[0].clone()
    append_paged_kv(*call)
    changed = (before != call[0]).any(3).any(1)  # [page, row]
    last = int(call[2][1, 4])
    # 4 keys each for sequences 0 and 2; keys 38 and 39 of sequence 1 (40 and 41 do not fit)
    assert int(changed.sum()) == 10 and changed[last, 6:].all()
    call = _append_args()
    call[2][0, 1] = -1  # key 5 + 3 = 8 lands in the second page
    with pytest.raises(AttnfuseArgumentError, match=r"block_table\[0, 1\] = -1 is not a page of the pool"):
        append_paged_kv(*call, check_values=True)


def test_bad_rope_options() -> None:
    with pytest.raises(ValueError, match="bad rope options .*: option 'style' must be one of half, interleaved"):
        append_paged_kv(*_append_args(), rope={"style": "diagonal"})
    with pytest.raises(ValueError, match="rope option 'theta' must be an int, float or str"):
        append_paged_kv(*_append_args(), rope={"theta": None})


# ============================================================================ decode loop


def test_decode_loop_append_then_attend() -> None:
    """Prefill 13 tokens, then 3 decode steps of 1 and a speculative step of 4: append
    (RoPE on the new keys) then attend with RoPE on the new queries at the cache offset.
    Each step matches the float64 reference of the contiguous program that rotates all
    keys at their positions."""
    heads, hkv, d, page = 4, 2, 32, 8
    rope = "{theta = 10000.0}"
    program = paged(heads, hkv, d, dtype="f32", page=page, rope=rope,
                    score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])
    q_t, k_t = f"tensor<?x{heads}x?x{d}xf32>", f"tensor<?x{hkv}x?x{d}xf32>"
    contiguous = (
        f"func.func @c(%q: {q_t}, %k: {k_t}, %v: {k_t}, %qpos: tensor<?x?xi32>, %kpos: tensor<?x?xi32>) -> {q_t} {{\n"
        f"  %qr = attn.rope %q positions %qpos {rope} : {q_t}, tensor<?x?xi32>\n"
        f"  %kr = attn.rope %k positions %kpos {rope} : {k_t}, tensor<?x?xi32>\n"
        f"  %s = attn.scores %qr, %kr : {q_t}, {k_t} -> !attn.scores<?x{heads}x?x?xf32>\n"
        f'  %m = attn.mask causal %s {{align = "bottom_right"}} : !attn.scores<?x{heads}x?x?xf32>\n'
        f"  %p = attn.softmax %m : !attn.scores<?x{heads}x?x?xf32> -> !attn.probs<?x{heads}x?x?xf32>\n"
        f"  %o = attn.weighted_sum %p, %v : !attn.probs<?x{heads}x?x?xf32>, {k_t} -> {q_t}\n"
        f"  func.return %o : {q_t}\n}}")
    attention = attnfuse.compile(program.text)
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.zeros(12, hkv, page, d), torch.zeros(12, hkv, page, d)
    table = torch.randperm(12, generator=g)[:8].view(2, 4).to(torch.int32)
    lens = torch.zeros(2, dtype=torch.int32)
    keys, values = torch.zeros(2, hkv, 0, d), torch.zeros(2, hkv, 0, d)
    for step in (13, 1, 1, 1, 4):
        k, v = torch.randn(2, hkv, step, d, generator=g), torch.randn(2, hkv, step, d, generator=g)
        q = torch.randn(2, heads, step, d, generator=g)
        lens = append_paged_kv(k_cache, v_cache, table, lens, k, v, rope={"theta": 10000.0})
        keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
        total = keys.shape[2]
        qpos = (torch.arange(total - step, total)).repeat(2, 1).to(torch.int32)
        kpos = torch.arange(total).repeat(2, 1).to(torch.int32)
        out = attention(q, k_cache, v_cache, table, lens, qpos)
        want = reference.run(contiguous, q, keys, values, qpos, kpos)
        assert (out.double() - want).abs().max() < 1e-4
