"""The reference semantics, op by op, against independent float64 torch implementations.

Every program is written here as text; the expected values come from hand-written torch
(SDPA, HF / Meta / YaRN / ALiBi-paper formulas transcribed independently), never from
`attnfuse.reference` itself.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from xdsl.dialects.builtin import ModuleOp

from attnfuse import rng
from attnfuse.reference import ReferenceError, alibi_slopes, parse_program, run
from attnfuse.reference.regions import RegionEvaluationError

TOL = {"rtol": 1e-10, "atol": 1e-10}
B, SQ, SKV = 2, 7, 13


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def qkv(
    hq: int = 4, hkv: int = 4, d: int = 16, dv: int | None = None, sq: int = SQ, skv: int = SKV
):
    return (
        rand(B, hq, sq, d, seed=1),
        rand(B, hkv, skv, d, seed=2),
        rand(B, hkv, skv, dv or d, seed=3),
    )


def tt(h: int, d: int) -> str:
    return f"tensor<?x{h}x?x{d}xf32>"


def program(
    score_ops: tuple[str, ...] | list[str] = (),
    *,
    hq: int = 4,
    hkv: int = 4,
    d: int = 16,
    dv: int | None = None,
    extra: str = "",
    prep: str = "",
    qk: tuple[str, str] = ("%q", "%k"),
    scale: str = "",
    softmax: str = ": $S",
    dropout: str = "",
    lse: bool = False,
) -> str:
    """An attention func. Score ops read `$in` (the previous scores) and `$S` (their type)
    and are chained in order; `softmax` is the text after its input; `dropout` the options
    of an attn.dropout on seed operand `%seed`."""
    dv = dv or d
    s_ty, p_ty, o_ty = f"!attn.scores<?x{hq}x?x?xf32>", f"!attn.probs<?x{hq}x?x?xf32>", tt(hq, dv)
    lines = [
        prep,
        f"%s0 = attn.scores {qk[0]}, {qk[1]} {scale} : {tt(hq, d)}, {tt(hkv, d)} -> {s_ty}",
    ]
    for i, text in enumerate(score_ops):
        lines.append(f"%s{i + 1} = " + text.replace("$in", f"%s{i}").replace("$S", s_ty))
    sm = f"attn.softmax %s{len(score_ops)} {softmax.replace('$S', s_ty)}"
    results = f"{o_ty}, tensor<?x{hq}x?xf32>" if lse else o_ty
    lines.append(
        f"%p, %lse = {sm} -> {p_ty}, tensor<?x{hq}x?xf32>" if lse else f"%p = {sm} -> {p_ty}"
    )
    probs = "%p"
    if dropout:
        lines.append(f"%pd = attn.dropout %p, %seed {{{dropout}}} : {p_ty}, i64")
        probs = "%pd"
    lines.append(f"%o = attn.weighted_sum {probs}, %v : {p_ty}, {tt(hkv, dv)} -> {o_ty}")
    ret = f"%o, %lse : {results}" if lse else f"%o : {o_ty}"
    return (
        f"func.func @f(%q: {tt(hq, d)}, %k: {tt(hkv, d)}, %v: {tt(hkv, dv)}{extra}) -> ({results}) {{\n"
        + "\n".join(line for line in lines if line)
        + f"\nfunc.return {ret}\n}}"
    )


def hand_attention(q, k, v, *, scale=None, keep=None, bias=None, cap=None, sinks=None, mod=None):
    """Independent attention: einsum, torch.softmax / logsumexp, NaN rows -> 0."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if bias is not None:
        s = s + bias
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    if mod is not None:
        s = mod(s)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        col = sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        full = torch.cat([s, col], dim=-1)
        p, lse = torch.softmax(full, -1)[..., :-1], torch.logsumexp(full, -1)
    else:
        p, lse = torch.softmax(s, -1), torch.logsumexp(s, -1)
    return torch.nan_to_num(p, nan=0.0) @ v, lse


def keep_from(fn, sq: int = SQ, skv: int = SKV, b: int = B) -> torch.Tensor:
    """A [b, 1, sq, skv] keep mask from a Python predicate fn(b, q, kv)."""
    return torch.tensor(
        [[[[bool(fn(bi, i, j)) for j in range(skv)] for i in range(sq)]] for bi in range(b)]
    )


# ------------------------------------------------------------------ scores & layout


def test_plain_attention_matches_sdpa():
    q, k, v = qkv()
    out = run(program(), q, k, v)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL)


def test_explicit_scale_gqa_and_value_head_dim():
    q, k, v = qkv(hq=6, hkv=2, d=8, dv=5)
    text = program(hq=6, hkv=2, d=8, dv=5, scale="{scale = 0.3}")
    expect = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(run(text, q, k, v), expect, **TOL)
    scores = run(text, q, k, v, return_all=True)["s0"]
    torch.testing.assert_close(scores[:, 5], q[:, 5] @ k[:, 1].transpose(-1, -2) * 0.3, **TOL)


# ---------------------------------------------------------------------------- masks


@pytest.mark.parametrize("sq,skv", [(SQ, SKV), (SKV, SKV)])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_causal(sq, skv, align):
    q, k, v = qkv(sq=sq, skv=skv)
    off = skv - sq if align == "bottom_right" else 0
    text = program([f'attn.mask causal $in {{align = "{align}"}} : $S'])
    keep = keep_from(lambda b, i, j: j <= i + off, sq, skv)
    expect = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(run(text, q, k, v), expect, **TOL)


@pytest.mark.parametrize(
    "options,left,right",
    [
        ("left = 3", 3, None),
        ("right = 2", None, 2),
        ("left = 2, right = 1", 2, 1),
        ('align = "bottom_right", left = 4', 4, None),
    ],
)
def test_sliding_window(options, left, right):
    q, k, v = qkv()
    off = SKV - SQ if "bottom_right" in options else 0

    def keep(b, i, j):
        lo_ok = left is None or j >= i + off - left
        hi_ok = right is None or j <= i + off + right
        return lo_ok and hi_ok

    text = program([f"attn.mask sliding_window $in {{{options}}} : $S"])
    out = run(text, q, k, v)
    expect, _ = hand_attention(q, k, v, keep=keep_from(keep))
    torch.testing.assert_close(out, expect, **TOL)


def test_document_one_and_two_operands():
    ids = torch.tensor(
        [[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3], [5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 7, 7]],
        dtype=torch.int32,
    )
    q, k, v = qkv(sq=SKV)
    text = program(
        ["attn.mask document $in, %ids : $S, tensor<?x?xi32>"], extra=", %ids: tensor<?x?xi32>"
    )
    keep = keep_from(lambda b, i, j: ids[b, i] == ids[b, j], SKV, SKV)
    torch.testing.assert_close(
        run(text, q, k, v, ids), F.scaled_dot_product_attention(q, k, v, attn_mask=keep), **TOL
    )

    q, k, v = qkv()
    ids_q = ids[:, -SQ:]
    two = program(
        ["attn.mask document $in, %iq, %ik : $S, tensor<?x?xi32>, tensor<?x?xi32>"],
        extra=", %iq: tensor<?x?xi32>, %ik: tensor<?x?xi32>",
    )
    keep = keep_from(lambda b, i, j: ids_q[b, i] == ids[b, j])
    torch.testing.assert_close(
        run(two, q, k, v, ids_q, ids),
        F.scaled_dot_product_attention(q, k, v, attn_mask=keep),
        **TOL,
    )
    with pytest.raises(ReferenceError, match="q_len == kv_len"):
        run(text, q, k, v, ids)


def test_prefix_lm_static_and_operand():
    q, k, v = qkv()
    text = program(["attn.mask prefix_lm $in {prefix = 5} : $S"])
    keep = keep_from(lambda b, i, j: j <= i or j < 5)
    torch.testing.assert_close(
        run(text, q, k, v), F.scaled_dot_product_attention(q, k, v, attn_mask=keep), **TOL
    )
    prefix = torch.tensor([2, 9], dtype=torch.int32)
    text = program(["attn.mask prefix_lm $in, %n : $S, tensor<?xi32>"], extra=", %n: tensor<?xi32>")
    keep = keep_from(lambda b, i, j: j <= i or j < prefix[b])
    torch.testing.assert_close(
        run(text, q, k, v, prefix), F.scaled_dot_product_attention(q, k, v, attn_mask=keep), **TOL
    )


CUSTOM = """attn.mask custom $in, %len : $S, tensor<?xi32> {
^bb0(%b: index, %h: index, %qi: index, %ki: index, %l: tensor<?xi32>):
  %n = tensor.extract %l[%b] : tensor<?xi32>
  %ni = arith.index_cast %n : i32 to index
  %in_len = arith.cmpi slt, %ki, %ni : index
  %d = arith.subi %qi, %ki : index
  %c3 = arith.constant 3 : index
  %r = arith.remsi %d, %c3 : index
  %c0 = arith.constant 0 : index
  %every3 = arith.cmpi eq, %r, %c0 : index
  %first = arith.cmpi eq, %ki, %c0 : index
  %stride = arith.ori %every3, %first : i1
  %keep = arith.andi %in_len, %stride : i1
  attn.yield %keep : i1
}"""


def test_custom_mask_with_capture_and_composition():
    q, k, v = qkv()
    lengths = torch.tensor([9, 13], dtype=torch.int32)
    text = program(
        ['attn.mask causal $in {align = "bottom_right"} : $S', CUSTOM],
        extra=", %len: tensor<?xi32>",
    )
    off = SKV - SQ

    def keep(b, i, j):
        d = i - j
        return j <= i + off and j < lengths[b] and (math.fmod(d, 3) == 0 or j == 0)

    expect = F.scaled_dot_product_attention(q, k, v, attn_mask=keep_from(keep))
    torch.testing.assert_close(run(text, q, k, v, lengths), expect, **TOL)


# ---------------------------------------------------------------- bias and softcap


def paper_slopes(n: int) -> list[float]:
    """get_slopes from the ALiBi paper's reference code (max_bias = 8)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [8, 6, 12, 1])
def test_alibi_default_slopes(heads):
    torch.testing.assert_close(
        alibi_slopes(heads), torch.tensor(paper_slopes(heads), dtype=torch.float64), **TOL
    )
    q, k, v = qkv(hq=heads, hkv=1)
    text = program(["attn.bias alibi $in : $S"], hq=heads, hkv=1)
    qi, kj = torch.arange(SQ).view(-1, 1), torch.arange(SKV).view(1, -1)
    bias = torch.tensor(paper_slopes(heads), dtype=torch.float64).view(1, -1, 1, 1) * (kj - qi)
    expect = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    torch.testing.assert_close(run(text, q, k, v), expect, **TOL)


def test_alibi_max_bias_and_slopes_operand():
    assert alibi_slopes(8, 4.0).tolist() == pytest.approx(
        [2 ** (-4 * (i + 1) / 8) for i in range(8)], rel=1e-14
    )
    assert alibi_slopes(6, 4.0).tolist() == pytest.approx(
        [2**-1, 2**-2, 2**-3, 2**-4, 2**-0.5, 2**-1.5], rel=1e-14
    )
    q, k, v = qkv()
    slopes = rand(4, seed=7)
    text = program(
        ["attn.bias alibi $in slopes %sl : $S, tensor<4xf32>"], extra=", %sl: tensor<4xf32>"
    )
    bias = slopes.view(1, -1, 1, 1) * (torch.arange(SKV).view(1, -1) - torch.arange(SQ).view(-1, 1))
    torch.testing.assert_close(
        run(text, q, k, v, slopes), hand_attention(q, k, v, bias=bias)[0], **TOL
    )


@pytest.mark.parametrize("shape", [(1, 4, SQ, SKV), (B, 1, 1, SKV), (1, 1, SQ, 1), (B, 4, SQ, SKV)])
def test_bias_tensor_broadcast(shape):
    q, k, v = qkv()
    bias = rand(*shape, seed=11)
    ty = "x".join(str(d) for d in shape) + "xf32"
    text = program([f"attn.bias tensor $in, %bb : $S, tensor<{ty}>"], extra=f", %bb: tensor<{ty}>")
    torch.testing.assert_close(
        run(text, q, k, v, bias), F.scaled_dot_product_attention(q, k, v, attn_mask=bias), **TOL
    )


def test_softcap_then_causal():
    q, k, v = qkv()
    q = q * 6  # large logits, so the cap matters
    text = program(["attn.softcap $in {cap = 2.5} : $S", "attn.mask causal $in : $S"])
    expect, _ = hand_attention(q, k, v, cap=2.5, keep=keep_from(lambda b, i, j: j <= i))
    torch.testing.assert_close(run(text, q, k, v), expect, **TOL)


# ----------------------------------------------------------------------- score_mod


def hand_scores(q, k, scale=None):
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    return q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)


SCORE_MOD_TABLE = """attn.score_mod $in, %tab : $S, tensor<4xf32> {
^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index, %t: tensor<4xf32>):
  %w = tensor.extract %t[%h] : tensor<4xf32>
  %y = arith.mulf %x, %w : f32
  %d = arith.subi %ki, %qi : index
  %di = arith.index_cast %d : index to i64
  %df = arith.sitofp %di : i64 to f32
  %c = arith.constant 0.125 : f32
  %z = arith.mulf %df, %c : f32
  %r = arith.addf %y, %z : f32
  attn.yield %r : f32
}"""


def test_score_mod_with_capture():
    q, k, v = qkv()
    tab = rand(4, seed=5)
    text = program([SCORE_MOD_TABLE, "attn.mask causal $in : $S"], extra=", %tab: tensor<4xf32>")
    rel = (torch.arange(SKV).view(1, -1) - torch.arange(SQ).view(-1, 1)).double()

    def mod(s):
        return s * tab.view(1, -1, 1, 1) + 0.125 * rel

    expect, _ = hand_attention(q, k, v, mod=mod, keep=keep_from(lambda b, i, j: j <= i))
    torch.testing.assert_close(run(text, q, k, v, tab), expect, **TOL)


def score_mod_program(body: str, yield_value: str, extra_arg: str = "", extra_ty: str = "") -> str:
    block_extra = f", %c0tab: {extra_ty}" if extra_ty else ""
    region = (
        f"attn.score_mod $in{', %tab' if extra_arg else ''} : $S{', ' + extra_ty if extra_ty else ''} {{\n"
        f"^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index{block_extra}):\n{body}\n"
        f"  attn.yield {yield_value} : f32\n}}"
    )
    return program([region], extra=extra_arg)


FLOAT_CASES = {
    "exp_tanh": (
        "%a = math.tanh %x : f32\n%r = math.exp %a : f32",
        lambda x: torch.exp(torch.tanh(x)),
    ),
    "log_log2": (
        (
            "%m = arith.mulf %x, %x : f32\n%one = arith.constant 1.0 : f32\n%a = arith.addf %m, %one : f32\n"
            "%l = math.log %a : f32\n%l2 = math.log2 %a : f32\n%r = arith.subf %l, %l2 : f32"
        ),
        lambda x: torch.log(x * x + 1) - torch.log2(x * x + 1),
    ),
    "sqrt_rsqrt_abs": (
        (
            "%a = math.absf %x : f32\n%s = math.sqrt %a : f32\n%two = arith.constant 2.0 : f32\n"
            "%b2 = arith.addf %a, %two : f32\n%rs = math.rsqrt %b2 : f32\n%r = arith.mulf %s, %rs : f32"
        ),
        lambda x: torch.sqrt(x.abs()) / torch.sqrt(x.abs() + 2),
    ),
    "powf_divf_negf": (
        (
            "%a = math.absf %x : f32\n%p = arith.constant 1.5 : f32\n%w = math.powf %a, %p : f32\n"
            "%n = arith.negf %w : f32\n%three = arith.constant 3.0 : f32\n%r = arith.divf %n, %three : f32"
        ),
        lambda x: -(x.abs() ** 1.5) / 3,
    ),
    "sin_cos_erf_exp2": (
        (
            "%s = math.sin %x : f32\n%c = math.cos %x : f32\n%e = math.erf %x : f32\n%t = math.exp2 %x : f32\n"
            "%m = arith.mulf %s, %c : f32\n%a = arith.addf %m, %e : f32\n%r = arith.addf %a, %t : f32"
        ),
        lambda x: torch.sin(x) * torch.cos(x) + torch.erf(x) + torch.exp2(x),
    ),
    "floor_ceil_max_min": (
        (
            "%f = math.floor %x : f32\n%c = math.ceil %x : f32\n%lo = arith.constant -0.5 : f32\n"
            "%hi = arith.constant 0.25 : f32\n%mx = arith.maximumf %x, %lo : f32\n%mn = arith.minimumf %mx, %hi : f32\n"
            "%a = arith.addf %f, %c : f32\n%r = arith.addf %a, %mn : f32"
        ),
        lambda x: torch.floor(x) + torch.ceil(x) + x.clamp(-0.5, 0.25),
    ),
    "cmpf_select_ext_trunc": (
        (
            "%z = arith.constant 0.0 : f32\n%neg = arith.cmpf olt, %x, %z : f32\n%e = arith.extf %x : f32 to f64\n"
            "%t = arith.truncf %e : f64 to f32\n%n = arith.negf %t : f32\n%r = arith.select %neg, %n, %t : f32"
        ),
        lambda x: x.abs(),
    ),
}


@pytest.mark.parametrize("name", sorted(FLOAT_CASES))
def test_score_mod_float_ops(name):
    body, fn = FLOAT_CASES[name]
    q, k, v = qkv()
    s = hand_scores(q, k) * 3
    values = run(score_mod_program(body, "%r"), q * 3, k, v, return_all=True)
    torch.testing.assert_close(values["s1"], fn(s), **TOL)


def wrap(x: int, bits: int) -> int:
    return (x + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


INT_PRELUDE = "%d = arith.subi %qi, %ki : index\n%d32 = arith.index_cast %d : index to i32\n%c3 = arith.constant 3 : i32\n"
INT_CASES = {
    "divsi": ("%r = arith.divsi %d32, %c3 : i32", lambda b, h, i, j: math.trunc((i - j) / 3)),
    "floordivsi": ("%r = arith.floordivsi %d32, %c3 : i32", lambda b, h, i, j: (i - j) // 3),
    "remsi": ("%r = arith.remsi %d32, %c3 : i32", lambda b, h, i, j: int(math.fmod(i - j, 3))),
    "div_by_zero": (
        "%z = arith.constant 0 : i32\n%r = arith.divsi %d32, %z : i32",
        lambda b, h, i, j: 0,
    ),
    "addi_wraps_i32": (
        "%big = arith.constant 2147483647 : i32\n%hi = arith.index_cast %h : index to i32\n%r = arith.addi %big, %hi : i32",
        lambda b, h, i, j: wrap(2147483647 + h, 32),
    ),
    "muli_maxsi_minsi_xori": (
        (
            "%m = arith.muli %d32, %d32 : i32\n%mx = arith.maxsi %m, %c3 : i32\n%mn = arith.minsi %d32, %c3 : i32\n"
            "%xo = arith.xori %mx, %mn : i32\n%r = arith.subi %xo, %c3 : i32"
        ),
        lambda b, h, i, j: (max((i - j) ** 2, 3) ^ min(i - j, 3)) - 3,
    ),
    "trunci_extsi": (
        (
            "%c100 = arith.constant 100 : i32\n%m = arith.muli %d32, %c100 : i32\n%t = arith.trunci %m : i32 to i8\n"
            "%r = arith.extsi %t : i8 to i32"
        ),
        lambda b, h, i, j: wrap((i - j) * 100, 8),
    ),
    "cmpi_unsigned_and_i1_casts": (
        (
            "%c5 = arith.constant 5 : index\n%u = arith.cmpi ult, %d, %c5 : index\n%z = arith.constant 0 : i32\n"
            "%neg = arith.cmpi slt, %d32, %z : i32\n%e1 = arith.extui %u : i1 to i32\n%e2 = arith.extsi %neg : i1 to i32\n"
            "%c10 = arith.constant 10 : i32\n%s = arith.muli %e1, %c10 : i32\n%r = arith.addi %s, %e2 : i32"
        ),
        lambda b, h, i, j: 10 * int(0 <= i - j < 5) - int(i - j < 0),
    ),
    "batch_index_and_or": (
        (
            "%bi = arith.index_cast %b : index to i32\n%one = arith.constant 1 : i32\n%isb1 = arith.cmpi eq, %bi, %one : i32\n"
            "%z = arith.constant 0 : i32\n%pos = arith.cmpi sgt, %d32, %z : i32\n%a = arith.andi %isb1, %pos : i1\n"
            "%o = arith.ori %isb1, %pos : i1\n%ea = arith.extui %a : i1 to i32\n%eo = arith.extui %o : i1 to i32\n"
            "%c2 = arith.constant 2 : i32\n%eo2 = arith.muli %eo, %c2 : i32\n%r = arith.addi %ea, %eo2 : i32"
        ),
        lambda b, h, i, j: int(b == 1 and i > j) + 2 * int(b == 1 or i > j),
    ),
}


@pytest.mark.parametrize("name", sorted(INT_CASES))
def test_score_mod_integer_ops(name):
    body, fn = INT_CASES[name]
    q, k, v = qkv()
    text = score_mod_program(INT_PRELUDE + body + "\n%f = arith.sitofp %r : i32 to f32", "%f")
    got = run(text, q, k, v, return_all=True)["s1"]
    expect = torch.tensor(
        [
            [[[fn(b, h, i, j) for j in range(SKV)] for i in range(SQ)] for h in range(4)]
            for b in range(B)
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got, expect, **TOL)


def test_score_mod_2d_capture_gathers():
    q, k, v = qkv()
    table = rand(SQ, SKV, seed=9)
    body = "%w = tensor.extract %c0tab[%qi, %ki] : tensor<?x?xf32>\n%r = arith.addf %x, %w : f32"
    text = score_mod_program(body, "%r", ", %tab: tensor<?x?xf32>", "tensor<?x?xf32>")
    values = run(text, q, k, v, table, return_all=True)
    torch.testing.assert_close(values["s1"], hand_scores(q, k) + table, **TOL)


def test_unsupported_region_op_is_named():
    q, k, v = qkv()
    text = score_mod_program("%r = math.atan %x : f32", "%r")
    with pytest.raises(
        RegionEvaluationError, match="cannot evaluate 'math.atan' in attn.score_mod"
    ):
        run(text, q, k, v)


# ------------------------------------------------------------------------- softmax


def test_lse_without_sinks():
    q, k, v = qkv()
    out, lse = run(program(["attn.mask causal $in : $S"], lse=True), q, k, v)
    e_out, e_lse = hand_attention(q, k, v, keep=keep_from(lambda b, i, j: j <= i))
    torch.testing.assert_close(out, e_out, **TOL)
    torch.testing.assert_close(lse, e_lse, **TOL)
    s = hand_scores(q, k).masked_fill(~keep_from(lambda b, i, j: j <= i), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), **TOL)


def test_sinks_and_lse():
    q, k, v = qkv(hq=4, hkv=2)
    sinks = rand(4, seed=13) * 2
    text = program(
        ["attn.mask sliding_window $in {left = 3} : $S"],
        hkv=2, extra=", %sk: tensor<4xf32>", softmax="sinks %sk : $S, tensor<4xf32>", lse=True,
    )  # fmt: skip
    out, lse = run(text, q, k, v, sinks)
    e_out, e_lse = hand_attention(q, k, v, keep=keep_from(lambda b, i, j: j >= i - 3), sinks=sinks)
    torch.testing.assert_close(out, e_out, **TOL)
    torch.testing.assert_close(lse, e_lse, **TOL)


@pytest.mark.parametrize("with_sinks", [False, True])
def test_fully_masked_rows_are_zero_with_finite_gradients(with_sinks):
    sq, skv = 9, 5  # bottom_right causal: rows q < 4 see no key
    q, k, v = (t.clone().requires_grad_() for t in qkv(sq=sq, skv=skv))
    sinks = rand(4, seed=3).requires_grad_()
    extra, softmax = (
        (", %sk: tensor<4xf32>", "sinks %sk : $S, tensor<4xf32>") if with_sinks else ("", ": $S")
    )
    text = program(
        ['attn.mask causal $in {align = "bottom_right"} : $S'],
        extra=extra,
        softmax=softmax,
        lse=True,
    )
    out, lse = run(text, q, k, v, *((sinks,) if with_sinks else ()))
    assert torch.equal(out[:, :, :4], torch.zeros_like(out[:, :, :4]))
    dead_lse = (
        sinks.detach().view(1, -1, 1).expand(B, 4, 4)
        if with_sinks
        else torch.full((B, 4, 4), float("-inf"))
    )
    assert torch.equal(lse[:, :, :4].detach(), dead_lse.double())
    live, live_lse = hand_attention(*(t.detach() for t in (q, k, v)), keep=keep_from(lambda b, i, j: j <= i - 4, sq, skv),
                                    sinks=sinks.detach() if with_sinks else None)  # fmt: skip
    torch.testing.assert_close(out[:, :, 4:], live[:, :, 4:], **TOL)
    torch.testing.assert_close(lse[:, :, 4:], live_lse[:, :, 4:], **TOL)
    (
        out.square().sum() + lse.sum()
    ).backward()  # lse.sum() is -inf without sinks: still finite grads
    for t in (q, k, v, sinks) if with_sinks else (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[:, :, :4], torch.zeros_like(q.grad[:, :, :4]))


def test_gradcheck_softcap_alibi_sinks():
    shape = {"hq": 2, "hkv": 1, "d": 4}
    text = program(
        ["attn.bias alibi $in {max_bias = 4.0} : $S", "attn.softcap $in {cap = 1.5} : $S",
         'attn.mask causal $in {align = "bottom_right"} : $S'],
        **shape, extra=", %sk: tensor<2xf32>", softmax="sinks %sk : $S, tensor<2xf32>", lse=True,
    )  # fmt: skip
    module = parse_program(text)
    g = torch.Generator().manual_seed(4)
    inputs = (
        torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True),
        torch.randn(1, 1, 5, 4, generator=g, dtype=torch.float64, requires_grad=True),
        torch.randn(1, 1, 5, 4, generator=g, dtype=torch.float64, requires_grad=True),
        torch.randn(2, generator=g, dtype=torch.float64, requires_grad=True),
    )
    assert torch.autograd.gradcheck(lambda *a: run(module, *a), inputs)


def test_gradcheck_prep_ops_and_score_mod_capture():
    prep = (
        "%qn = attn.qk_norm %q weight %nw {weight_offset = 1.0} : tensor<?x2x?x4xf32>, tensor<4xf32>\n"
        "%qr = attn.rope %qn {rotary_dim = 2} : tensor<?x2x?x4xf32>"
    )
    mod = SCORE_MOD_TABLE.replace("tensor<4xf32>", "tensor<2xf32>")
    text = program(
        [mod],
        hq=2,
        hkv=2,
        d=4,
        prep=prep,
        qk=("%qr", "%k"),
        extra=", %nw: tensor<4xf32>, %tab: tensor<2xf32>",
    )
    module = parse_program(text)
    g = torch.Generator().manual_seed(5)
    shapes = [(1, 2, 3, 4), (1, 2, 4, 4), (1, 2, 4, 4), (4,), (2,)]
    inputs = tuple(
        torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes
    )
    assert torch.autograd.gradcheck(lambda *a: run(module, *a), inputs)


# ---------------------------------------------------------------------------- rope


def hf_rope(x, inv_freq, positions, style, attention_scaling=1.0):
    """HF-style application: cat(freqs, freqs) / GPT-J repeat_interleave tables, rotate_half."""
    rd = 2 * inv_freq.numel()
    freqs = positions.double()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], -1) if style == "half" else freqs.repeat_interleave(2, -1)
    cos, sin = emb.cos() * attention_scaling, emb.sin() * attention_scaling
    if positions.dim() == 2:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    xr, xp = x[..., :rd], x[..., rd:]
    if style == "half":
        rotated = torch.cat([-xr[..., rd // 2 :], xr[..., : rd // 2]], -1)
    else:
        rotated = torch.stack([-xr[..., 1::2], xr[..., 0::2]], -1).flatten(-2)
    return torch.cat([xr * cos + rotated * sin, xp], -1)


def default_inv_freq(theta: float, rd: int) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)


def meta_llama3(freqs, factor, low_freq_factor, high_freq_factor, old_context_len):
    """`apply_scaling` from Meta's llama-models (a per-frequency loop)."""
    low_freq_wavelen, high_freq_wavelen = (
        old_context_len / low_freq_factor,
        old_context_len / high_freq_factor,
    )
    out, kinds = [], set()
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(freq)
            kinds.add("high")
        elif wavelen > low_freq_wavelen:
            out.append(freq / factor)
            kinds.add("low")
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor
            )
            out.append((1 - smooth) * freq / factor + smooth * freq)
            kinds.add("medium")
    assert kinds == {"high", "low", "medium"}, "the case must exercise all three bands"
    return torch.tensor(out, dtype=torch.float64)


def yarn_paper(theta, rd, factor, orig, beta_fast, beta_slow, truncate):
    """YaRN's reference (jquesnelle/yarn `_yarn_find_correction_range`, ramp mask), per element."""

    def correction_dim(rot):
        return (rd * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rd - 1)
    if low == high:
        high += 0.001
    out = []
    for i in range(rd // 2):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrapolate = 1.0 - ramp
        base = theta ** (2 * i / rd)
        out.append((1 / (factor * base)) * (1 - extrapolate) + (1 / base) * extrapolate)
    return torch.tensor(out, dtype=torch.float64)


ROPE_CASES = {
    "half_full": ("", "half", lambda d: default_inv_freq(10000.0, d), 16, 1.0),
    "interleaved_partial": ('{style = "interleaved", theta = 500.0, rotary_dim = 8}', "interleaved", lambda d: default_inv_freq(500.0, 8), 16, 1.0),
    "half_partial": ("{rotary_dim = 10}", "half", lambda d: default_inv_freq(10000.0, 10), 16, 1.0),
    "linear": ('{scaling = "linear", factor = 4.0}', "half", lambda d: default_inv_freq(10000.0, d) / 4, 16, 1.0),
    "llama3": (
        '{theta = 10000.0, scaling = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 1024}',
        "half", lambda d: meta_llama3(default_inv_freq(10000.0, d), 8.0, 1.0, 4.0, 1024), 32, 1.0,
    ),
    "yarn_truncated": (
        '{theta = 150000.0, scaling = "yarn", factor = 32.0, original_max_position = 4096}',
        "half", lambda d: yarn_paper(150000.0, d, 32.0, 4096, 32.0, 1.0, True), 64, 0.1 * math.log(32.0) + 1,
    ),
    "yarn_gpt_oss": (
        '{theta = 150000.0, scaling = "yarn", factor = 32.0, original_max_position = 4096, truncate = 0, beta_fast = 32.0, beta_slow = 1.0}',
        "half", lambda d: yarn_paper(150000.0, d, 32.0, 4096, 32.0, 1.0, False), 64, 0.1 * math.log(32.0) + 1,
    ),
    "yarn_interleaved_partial_attention_factor": (
        '{style = "interleaved", rotary_dim = 24, scaling = "yarn", factor = 4.0, original_max_position = 256, beta_fast = 16.0, beta_slow = 2.0, attention_factor = 1.5}',
        "interleaved", lambda d: yarn_paper(10000.0, 24, 4.0, 256, 16.0, 2.0, True), 32, 1.5,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ROPE_CASES))
@pytest.mark.parametrize("positions", ["index", "offset", "operand_1d", "operand_2d"])
def test_rope(name, positions):
    opts, style, inv_freq_fn, d, attention_scaling = ROPE_CASES[name]
    q, k, v = qkv(d=d)
    pos_q, pos_k = torch.arange(SQ), torch.arange(SKV)
    extra, args, kw_q, kw_k = "", (), "", ""
    if positions == "offset":
        opts = "{offset = 37}" if not opts else opts[:-1] + ", offset = 37}"
        pos_q, pos_k = pos_q + 37, pos_k + 37
    elif positions.startswith("operand"):
        shape_q, shape_k = ((SQ,), (SKV,)) if positions == "operand_1d" else ((B, SQ), (B, SKV))
        pos_q = torch.randint(0, 5000, shape_q, generator=torch.Generator().manual_seed(8))
        pos_k = torch.randint(0, 5000, shape_k, generator=torch.Generator().manual_seed(9))
        pty = "tensor<?xi32>" if positions == "operand_1d" else "tensor<?x?xi64>"
        extra, args = f", %pq: {pty}, %pk: {pty}", (pos_q.int(), pos_k)
        kw_q, kw_k = " positions %pq", " positions %pk"
    tq, tk = tt(4, d), tt(4, d)
    types_q, types_k = (f"{tq}, {pty}", f"{tk}, {pty}") if kw_q else (tq, tk)
    prep = (
        f"%qr = attn.rope %q{kw_q} {opts} : {types_q}\n%kr = attn.rope %k{kw_k} {opts} : {types_k}"
    )
    text = program(d=d, prep=prep, qk=("%qr", "%kr"), extra=extra)
    values = run(text, q, k, v, *args, return_all=True)
    inv_freq = inv_freq_fn(d)
    q_rot, k_rot = (
        hf_rope(q, inv_freq, pos_q, style, attention_scaling),
        hf_rope(k, inv_freq, pos_k, style, attention_scaling),
    )
    torch.testing.assert_close(values["qr"], q_rot, **TOL)
    torch.testing.assert_close(values["kr"], k_rot, **TOL)
    torch.testing.assert_close(values["o"], F.scaled_dot_product_attention(q_rot, k_rot, v), **TOL)


def test_llama3_example_matches_sdpa():
    with open("examples/llama3.attn") as f:
        text = f.read()
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, h, 5, 128, generator=g, dtype=torch.float64) for h in (32, 8, 8))
    inv_freq, pos = default_inv_freq(500000.0, 128), torch.arange(5)
    expect = F.scaled_dot_product_attention(
        hf_rope(q, inv_freq, pos, "half"),
        hf_rope(k, inv_freq, pos, "half"),
        v,
        is_causal=True,
        enable_gqa=True,
    )
    torch.testing.assert_close(
        run(text, q.float(), k.float(), v.float()), expect.float().double(), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(run(text, q, k, v), expect, **TOL)


# ------------------------------------------------------------------------- qk_norm


@pytest.mark.parametrize("weighted,offset", [(False, None), (True, None), (True, 1.0)])
def test_qk_norm(weighted, offset):
    q, k, v = qkv()
    wq, wk = rand(16, seed=21), rand(16, seed=22)
    opts = "{eps = 0.01" + (f", weight_offset = {offset}" if offset is not None else "") + "}"
    if weighted:
        prep = (f"%qn = attn.qk_norm %q weight %wq {opts} : {tt(4, 16)}, tensor<16xf32>\n"
                f"%kn = attn.qk_norm %k weight %wk {opts} : {tt(4, 16)}, tensor<16xf32>")  # fmt: skip
        extra, args = ", %wq: tensor<16xf32>, %wk: tensor<16xf32>", (wq, wk)
    else:
        prep = f"%qn = attn.qk_norm %q {opts} : {tt(4, 16)}\n%kn = attn.qk_norm %k {opts} : {tt(4, 16)}"
        extra, args = "", ()
    values = run(
        program(prep=prep, qk=("%qn", "%kn"), extra=extra), q, k, v, *args, return_all=True
    )
    off = offset or 0.0
    qn = F.rms_norm(q, (16,), wq + off if weighted else None, eps=0.01)
    kn = F.rms_norm(k, (16,), wk + off if weighted else None, eps=0.01)
    torch.testing.assert_close(values["qn"], qn, **TOL)
    torch.testing.assert_close(values["kn"], kn, **TOL)
    torch.testing.assert_close(values["o"], F.scaled_dot_product_attention(qn, kn, v), **TOL)


# ------------------------------------------------------------------------- dropout


def hand_dropout_keep(
    seed: int, b_count: int, h_count: int, sq: int, skv: int, p: float
) -> torch.Tensor:
    """Per (b, h): `tl.rand(seed + ((b*H + h) << 32) wrapped to int64, q*Skv + kv) >= f32(p)`."""
    keep = torch.empty(b_count, h_count, sq, skv, dtype=torch.bool)
    for b in range(b_count):
        for h in range(h_count):
            key = (seed + ((b * h_count + h) << 32) + 2**63) % 2**64 - 2**63
            u = rng.rand(key, torch.arange(sq * skv)).view(sq, skv)
            keep[b, h] = u >= torch.tensor(p, dtype=torch.float32)
    return keep


@pytest.mark.parametrize("seed", [1234, 2**33 + 5, -7, 2**63 - 1])
def test_dropout(seed):
    q, k, v = qkv()
    text = program(["attn.mask causal $in : $S"], extra=", %seed: i64", dropout="p = 0.3")
    keep = hand_dropout_keep(seed, B, 4, SQ, SKV, 0.3)
    assert 0.5 < keep.double().mean() < 0.9
    s = hand_scores(q, k).masked_fill(~keep_from(lambda b, i, j: j <= i), float("-inf"))
    expect = (torch.softmax(s, -1) * keep / 0.7) @ v
    torch.testing.assert_close(run(text, q, k, v, seed), expect, **TOL)
    torch.testing.assert_close(run(text, q, k, v, torch.tensor(seed)), expect, **TOL)


def test_dropout_zero_is_identity():
    q, k, v = qkv()
    text = program(extra=", %seed: i64", dropout="p = 0.0")
    torch.testing.assert_close(
        run(text, q, k, v, 99), F.scaled_dot_product_attention(q, k, v), **TOL
    )


# ------------------------------------------------------------------- calling rules


def test_argument_checks():
    q, k, v = qkv()
    text = program(["attn.mask prefix_lm $in, %n : $S, tensor<?xi32>"], extra=", %n: tensor<?xi32>")
    with pytest.raises(ReferenceError, match=r"@f takes 4 arguments, got 3"):
        run(text, q, k, v)
    with pytest.raises(
        ReferenceError,
        match=r"argument 2 'v': expected shape \[\?, 4, \?, 16\], got \(2, 3, 13, 16\)",
    ):
        run(text, q, k, v[:, :3], torch.tensor([1, 2]))
    with pytest.raises(
        ReferenceError, match=r"argument 3 'n': expected shape \[\?\], got \(2, 1\)"
    ):
        run(text, q, k, v, torch.tensor([[1], [2]]))
    with pytest.raises(ReferenceError, match=r"argument 3 'n': expected an integer tensor"):
        run(text, q, k, v, torch.tensor([1.0, 2.0]))
    with pytest.raises(ReferenceError, match=r"argument 0 'q': expected a float tensor"):
        run(text, q.long(), k, v, torch.tensor([1, 2]))
    seeded = program(extra=", %seed: i64", dropout="p = 0.1")
    with pytest.raises(ReferenceError, match=r"argument 3 'seed': expected an int"):
        run(seeded, q, k, v, 1.5)


def test_float32_inputs_are_cast_and_keep_gradients():
    q, k, v = (t.float().requires_grad_() for t in qkv())
    out = run(program(), q, k, v)
    assert out.dtype == torch.float64
    out.sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32


def test_module_entry_and_result_tuple():
    q, k, v = qkv()
    text = program() + "\n" + program(["attn.mask causal $in : $S"], lse=True).replace("@f", "@g")
    module = parse_program(text)
    assert isinstance(module, ModuleOp)
    torch.testing.assert_close(run(module, q, k, v), F.scaled_dot_product_attention(q, k, v), **TOL)
    out, lse = run(module, q, k, v, entry="g")
    torch.testing.assert_close(
        out, hand_attention(q, k, v, keep=keep_from(lambda b, i, j: j <= i))[0], **TOL
    )
    assert lse.shape == (B, 4, SQ)
    with pytest.raises(ReferenceError, match="no func.func @h"):
        run(module, q, k, v, entry="h")


BLOCK_MASK = """attn.mask custom $in, %blocks, %win : $S, tensor<?x?xi1>, i32 {
^bb0(%b: index, %h: index, %qi: index, %ki: index, %t: tensor<?x?xi1>, %w: i32):
  %c4 = arith.constant 4 : index
  %qb = arith.divsi %qi, %c4 : index
  %kb = arith.divsi %ki, %c4 : index
  %block = tensor.extract %t[%qb, %kb] : tensor<?x?xi1>
  %d = arith.subi %qi, %ki : index
  %d32 = arith.index_cast %d : index to i32
  %near = arith.cmpi sle, %d32, %w : i32
  %keep = arith.andi %block, %near : i1
  attn.yield %keep : i1
}"""


def test_custom_mask_with_i1_table_and_scalar_capture():
    q, k, v = qkv()
    blocks = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    text = program([BLOCK_MASK], extra=", %blocks: tensor<?x?xi1>, %win: i32")
    keep = keep_from(lambda b, i, j: bool(blocks[i // 4, j // 4]) and i - j <= 2)
    expect, _ = hand_attention(q, k, v, keep=keep)
    torch.testing.assert_close(run(text, q, k, v, blocks, 2), expect, **TOL)


def test_score_mod_float_scalar_capture():
    q, k, v = qkv()
    region = """attn.score_mod $in, %t : $S, f32 {
^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index, %temp: f32):
  %r = arith.divf %x, %temp : f32
  attn.yield %r : f32
}"""
    values = run(program([region], extra=", %t: f32"), q, k, v, 0.7, return_all=True)
    torch.testing.assert_close(values["s1"], hand_scores(q, k) / 0.7, **TOL)
