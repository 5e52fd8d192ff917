"""`attn.rope %q {align = "bottom_right"}`: RoPE on a decode step's new queries at the
end of the keys, `kv_len(b) - Sq + i`, with no positions operand.

Through the Triton interpreter against the float64 reference, within PyTorch's own
error in the same dtype: contiguous K/V (Skv), a contiguous cache with lengths and a
paged cache (`kv_lens[b]`), decode calls (the split-KV kernels) and prefill chunks (the
forward kernel). The reference itself is checked against the same program written with
the positions operand. Then the errors.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from paged_programs import BR, PagedProgram, assert_matches_reference, inputs, paged
from split_kv_check import launches
from test_cache_lengths import cache_inputs, contiguous

import attnfuse
from attnfuse import reference
from attnfuse.diagnostics import LocatedError
from attnfuse.pass_manager import PassFailedError
from attnfuse.program import ProgramError
from attnfuse.testing import with_dtype

ROPE = '{theta = 10000.0, scaling = "linear", factor = 2.0}'
LENS = (5, 37, 70)


def dense(hq: int, hkv: int, *, offset: int = 0) -> str:
    """Contiguous decode program (f32), RoPE'd queries aligned bottom-right."""
    q_t, k_t = f"tensor<?x{hq}x?x32xf32>", f"tensor<?x{hkv}x?x32xf32>"
    s_t, p_t = f"!attn.scores<?x{hq}x?x?xf32>", f"!attn.probs<?x{hq}x?x?xf32>"
    return f"""func.func @f(%q: {q_t}, %k: {k_t}, %v: {k_t}) -> {q_t} {{
  %qr = attn.rope %q {{theta = 10000.0, offset = {offset}, align = "bottom_right"}} : {q_t}
  %s = attn.scores %qr, %k : {q_t}, {k_t} -> {s_t}
  %m = attn.mask causal %s {{align = "bottom_right"}} : {s_t}
  %p = attn.softmax %m : {s_t} -> {p_t}
  %o = attn.weighted_sum %p, %v : {p_t}, {k_t} -> {q_t}
  func.return %o : {q_t}
}}
"""


def with_positions(text: str) -> str:
    """`text` with its bottom-right rope written as a `[B, Sq]` positions operand."""
    text = text.replace("%v: tensor", "%pos: tensor<?x?xi32>, %v: tensor", 1)
    return re.sub(r'attn\.rope (%\w+) \{(.*?), offset = (\d+), align = "bottom_right"\} : ([^\n]+)',
                  r"attn.rope \1 positions %pos {\2} : \4, tensor<?x?xi32>", text)


def bottom_right(program: PagedProgram) -> PagedProgram:
    """A `paged(rope=...)` program with the positions operand replaced by the alignment."""
    text = program.text.replace(", %pos: tensor<?x?xi32>", "")
    text = re.sub(r"attn\.rope (%\w+) positions %pos \{(.*?)\} : ([^,\n]+), tensor<\?x\?xi32>",
                  r'attn.rope \1 {\2, align = "bottom_right"} : \3', text)
    assert 'align = "bottom_right"} :' in text and "%pos" not in text
    extras = [e for e in program.extras if e != "pos"]
    return PagedProgram(text, program.page_size, extras, program.last_scores, program.heads)


@pytest.mark.parametrize(("q_len", "kv_len", "offset"), [(1, 50, 0), (3, 50, 0), (24, 50, 7), (50, 50, 0)])
def test_reference_is_the_positions_program(q_len: int, kv_len: int, offset: int) -> None:
    """Query i sits at `Skv - Sq + i + offset`: the reference of the aligned program is
    the program with those positions given."""
    g = torch.Generator().manual_seed(q_len)
    q = torch.randn(2, 4, q_len, 32, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, kv_len, 32, generator=g, dtype=torch.float64) for _ in range(2))
    pos = (kv_len - q_len + offset + torch.arange(q_len, dtype=torch.int32)).expand(2, q_len)
    text = dense(4, 2, offset=offset)
    got = reference.run(text, q, k, v)
    want = reference.run(with_positions(text), q, k, pos, v)  # %pos comes before %v
    assert torch.equal(got, want)
    top_left = reference.run(text.replace(', align = "bottom_right"', ""), q, k, v)
    assert torch.equal(got, top_left) == (kv_len - q_len + offset == offset)


@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (8, 2)])
@pytest.mark.parametrize(("q_len", "dtype"), [(1, torch.float32), (4, torch.float16), (24, torch.float16),
                                              (24, torch.float32)])
def test_contiguous_decode_and_prefill(hq: int, hkv: int, q_len: int, dtype: torch.dtype) -> None:
    """Split-KV (Sq * group fits its tile) and the forward kernel (24 x 8 / 2 = 96 rows do
    not), within PyTorch's own error; no RoPE table kernel and no positions argument."""
    text = dense(hq, hkv, offset=3)
    text = text if dtype == torch.float32 else with_dtype(text, "f16")
    g = torch.Generator().manual_seed(q_len + hq)
    q = torch.randn(3, hq, q_len, 32, generator=g).to(dtype)
    k, v = (torch.randn(3, hkv, 70, 32, generator=g).to(dtype) for _ in range(2))
    fn = attnfuse.compile(text)
    out = fn(q, k, v)
    want = reference.run(text, q, k, v)
    pos = (70 - q_len + 3 + torch.arange(q_len, dtype=torch.int32)).expand(3, q_len).contiguous()
    rotated = reference.run(text.replace(', align = "bottom_right"', ""), q, k, v)  # top-left positions
    torch_out = torch.nn.functional.scaled_dot_product_attention(
        _rope(q, pos), k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1),
        attn_mask=torch.ones(q_len, 70, dtype=torch.bool).tril(70 - q_len))
    ours, theirs = (float((x.double() - want).abs().max()) for x in (out, torch_out))
    assert ours <= 4 * theirs + 1e-6, (ours, theirs)
    assert float((rotated - want).abs().max()) > 100 * theirs  # the alignment matters here
    assert not any("rope_table" in name or "prologue" in name for name in launches(fn, [q, k, v]))


def _rope(q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """PyTorch RoPE (theta 1e4, half style) of `q` at `pos` [B, Sq], in q's dtype."""
    half = q.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(0, half, dtype=torch.float64) * 2 / q.shape[-1])
    angle = pos.double()[:, None, :, None] * freq
    cos, sin = angle.cos().to(q.dtype), angle.sin().to(q.dtype)
    a, b = q[..., :half], q[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


PROGRAMS = {
    "paged": lambda: bottom_right(paged(rope=ROPE, score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])),
    "paged_qk_norm_group4": lambda: bottom_right(paged(
        hq=8, rope='{theta = 500000.0, style = "interleaved", rotary_dim = 16}', qk_norm=True,
        score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])),
}


def _run(program: PagedProgram, cache: str, q_len: int, dtype: torch.dtype) -> tuple[Any, list[Any], Any]:
    if cache == "lengths":
        program = contiguous(program)
        args: list[Any] = cache_inputs(program, LENS, q_len, seed=q_len, dtype=dtype)
    else:
        args = inputs(program, LENS, q_len, seed=q_len, dtype=dtype)
    fn = attnfuse.compile(program.text)
    return fn, args, assert_matches_reference(program, args, fn(*args))


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("cache", ["paged", "lengths"])
@pytest.mark.parametrize("q_len", [1, 4, 37])
def test_caches_align_with_each_sequence(name: str, cache: str, q_len: int) -> None:
    """Each sequence's queries end at its own `kv_lens[b]` (5, 37, 70): split-KV for 1 and
    4 new tokens, the forward kernel for 37 (a prefill chunk); NaN rows past every
    length in the contiguous cache."""
    fn, args, out = _run(PROGRAMS[name](), cache, q_len, torch.float16)
    ran = launches(fn, args)
    assert not any("rope_table" in name for name in ran), ran
    assert any("split_kv" in name for name in ran) == (q_len < 37), ran


def test_f32_paged_decode() -> None:
    _run(bottom_right(paged(dtype="f32", rope=ROPE, score_ops=[f"attn.mask causal {{x}} {BR} : {{s}}"])),
         "paged", 4, torch.float32)


def test_errors_point_at_the_rope() -> None:
    text = dense(4, 2)
    k_side = text.replace('%qr = attn.rope %q {theta = 10000.0, offset = 0, align = "bottom_right"} : '
                          "tensor<?x4x?x32xf32>\n", "").replace(
        "%s = attn.scores %qr, %k", '%kr = attn.rope %k {align = "bottom_right"} : tensor<?x2x?x32xf32>\n'
        "  %s = attn.scores %q, %kr")
    with pytest.raises((ProgramError, PassFailedError, LocatedError), match="applies to Q's rope, not K's"):
        attnfuse.compile(k_side)
    both = with_positions(text).replace("{theta = 10000.0}", '{theta = 10000.0, align = "bottom_right"}')
    with pytest.raises(Exception, match='either positions or align = "bottom_right"'):
        attnfuse.compile(both)
    pinned = text.replace('offset = 0, align = "bottom_right"}', 'offset = 0, align = "bottom_right", placement = "prekernel"}')
    with pytest.raises((ProgramError, PassFailedError, LocatedError), match="cannot be placed in a pre-kernel"):
        attnfuse.compile(pinned)
    packed = (attnfuse.attention(4, 32, kv_heads=2, dtype="f32").rope(on="q", align="bottom_right")
              .causal(align="bottom_right").packed().build().source)
    with pytest.raises((ProgramError, PassFailedError, LocatedError), match="not supported on a packed batch"):
        attnfuse.compile(packed)


def test_no_backward() -> None:
    """Decoding only: asking for a gradient says why (positions train)."""
    fn = attnfuse.compile(dense(4, 2))
    q = torch.randn(1, 4, 3, 32, requires_grad=True)
    k, v = torch.randn(1, 2, 9, 32), torch.randn(1, 2, 9, 32)
    with pytest.raises(Exception, match='align = "bottom_right" is for decoding'):
        fn(q, k, v).sum().backward()


def test_builder_writes_it() -> None:
    program = (attnfuse.attention(32, 128, kv_heads=8).rope(theta=500000.0, on="q", align="bottom_right")
               .causal(align="bottom_right").cache_lengths().build())
    assert 'align = "bottom_right"' in program.source.split("attn.rope")[1].split("\n")[0]
    assert "%pos" not in program.source
