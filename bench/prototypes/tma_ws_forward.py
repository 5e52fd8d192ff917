"""Prototype kernels (run 14, not part of the compiler): causal GQA forward on pre-rotated
inputs with device-side TMA descriptors (4-D reshaped, 2-D flattened, 2-D per (batch,
head)) and optional warp specialization, to decide what the tile lowering should emit.
Run by run_tma_ws.py."""
import triton
import triton.language as tl


@triton.jit
def _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, MASK: tl.constexpr):
    qk = tl.dot(q, tl.trans(k))
    if MASK:
        keep = offs_m[:, None] >= (start_n + offs_n[None, :])
        qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_ij[:, None]
    else:
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_ij, l_i


@triton.jit
def proto_fwd(Q, K, V, Out, LSE,
              sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_s,
              B, S, qk_scale,
              H: tl.constexpr, GROUP: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
              WS: tl.constexpr, ONE_LOOP: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    HKV: tl.constexpr = H // GROUP
    dq = tl.make_tensor_descriptor(Q, shape=[B, H, S, D], strides=[sq_b, sq_h, sq_s, 1], block_shape=[1, 1, BM, D])
    dk = tl.make_tensor_descriptor(K, shape=[B, HKV, S, D], strides=[sk_b, sk_h, sk_s, 1], block_shape=[1, 1, BN, D])
    dv = tl.make_tensor_descriptor(V, shape=[B, HKV, S, D], strides=[sv_b, sv_h, sv_s, 1], block_shape=[1, 1, BN, D])
    do = tl.make_tensor_descriptor(Out, shape=[B, H, S, D], strides=[so_b, so_h, so_s, 1], block_shape=[1, 1, BM, D])
    start_m = pid_m * BM
    offs_m = start_m + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    q = dq.load([b, h, start_m, 0]).reshape(BM, D)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.full([BM], 1.0, tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    hi = tl.minimum(S, start_m + BM)
    if ONE_LOOP:
        for start_n in tl.range(0, hi, BN, warp_specialize=WS):
            k = dk.load([b, hk, start_n, 0]).reshape(BN, D)
            v = dv.load([b, hk, start_n, 0]).reshape(BN, D)
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, True)
    else:
        for start_n in tl.range(0, start_m, BN, warp_specialize=WS):
            k = dk.load([b, hk, start_n, 0]).reshape(BN, D)
            v = dv.load([b, hk, start_n, 0]).reshape(BN, D)
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, False)
        for start_n in tl.range(start_m, hi, BN):
            k = dk.load([b, hk, start_n, 0]).reshape(BN, D)
            v = dv.load([b, hk, start_n, 0]).reshape(BN, D)
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, True)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    tl.store(LSE + bh * S + offs_m, m_i, mask=offs_m < S)
    do.store([b, h, start_m, 0], acc.to(Out.dtype.element_ty).reshape(1, 1, BM, D))


@triton.jit
def proto2_fwd(Q, K, V, Out, LSE,
              sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_s,
              B, S, qk_scale,
              H: tl.constexpr, GROUP: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
              WS: tl.constexpr, ONE_LOOP: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    HKV: tl.constexpr = H // GROUP
    dq = tl.make_tensor_descriptor(Q, shape=[B * H * S, D], strides=[sq_s, 1], block_shape=[BM, D])
    dk = tl.make_tensor_descriptor(K, shape=[B * HKV * S, D], strides=[sk_s, 1], block_shape=[BN, D])
    dv = tl.make_tensor_descriptor(V, shape=[B * HKV * S, D], strides=[sv_s, 1], block_shape=[BN, D])
    do = tl.make_tensor_descriptor(Out, shape=[B * H * S, D], strides=[so_s, 1], block_shape=[BM, D])
    start_m = pid_m * BM
    offs_m = start_m + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    q = dq.load([bh * S + start_m, 0])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.full([BM], 1.0, tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    hi = tl.minimum(S, start_m + BM)
    if ONE_LOOP:
        for start_n in tl.range(0, hi, BN, warp_specialize=WS):
            k = dk.load([(b * HKV + hk) * S + start_n, 0])
            v = dv.load([(b * HKV + hk) * S + start_n, 0])
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, True)
    else:
        for start_n in tl.range(0, start_m, BN, warp_specialize=WS):
            k = dk.load([(b * HKV + hk) * S + start_n, 0])
            v = dv.load([(b * HKV + hk) * S + start_n, 0])
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, False)
        for start_n in tl.range(start_m, hi, BN):
            k = dk.load([(b * HKV + hk) * S + start_n, 0])
            v = dv.load([(b * HKV + hk) * S + start_n, 0])
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, True)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    tl.store(LSE + bh * S + offs_m, m_i, mask=offs_m < S)
    do.store([bh * S + start_m, 0], acc.to(Out.dtype.element_ty))


@triton.jit
def proto3_fwd(Q, K, V, Out, LSE,
              sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_s,
              B, S, qk_scale,
              H: tl.constexpr, GROUP: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
              WS: tl.constexpr, ONE_LOOP: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    HKV: tl.constexpr = H // GROUP
    dq = tl.make_tensor_descriptor(Q + b.to(tl.int64) * sq_b + h.to(tl.int64) * sq_h, shape=[S, D], strides=[sq_s, 1], block_shape=[BM, D])
    dk = tl.make_tensor_descriptor(K + b.to(tl.int64) * sk_b + hk.to(tl.int64) * sk_h, shape=[S, D], strides=[sk_s, 1], block_shape=[BN, D])
    dv = tl.make_tensor_descriptor(V + b.to(tl.int64) * sv_b + hk.to(tl.int64) * sv_h, shape=[S, D], strides=[sv_s, 1], block_shape=[BN, D])
    do = tl.make_tensor_descriptor(Out + b.to(tl.int64) * so_b + h.to(tl.int64) * so_h, shape=[S, D], strides=[so_s, 1], block_shape=[BM, D])
    start_m = pid_m * BM
    offs_m = start_m + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    q = dq.load([start_m, 0])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.full([BM], 1.0, tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    hi = tl.minimum(S, start_m + BM)
    if ONE_LOOP:
        for start_n in tl.range(0, hi, BN, warp_specialize=WS):
            k = dk.load([start_n, 0])
            v = dv.load([start_n, 0])
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, True)
    else:
        for start_n in tl.range(0, start_m, BN, warp_specialize=WS):
            k = dk.load([start_n, 0])
            v = dv.load([start_n, 0])
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, False)
        for start_n in tl.range(start_m, hi, BN):
            k = dk.load([start_n, 0])
            v = dv.load([start_n, 0])
            acc, m_i, l_i = _step(q, k, v, acc, m_i, l_i, offs_m, start_n, offs_n, qk_scale, True)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    tl.store(LSE + bh * S + offs_m, m_i, mask=offs_m < S)
    do.store([start_m, 0], acc.to(Out.dtype.element_ty))
