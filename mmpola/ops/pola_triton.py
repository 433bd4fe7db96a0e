"""Pola attention in Triton kernels, forward and backward (implementation ``'triton'`` of the ``'pola'`` op).

Same function and signature as :func:`mmpola.ops.pola.pola_attention_reference` (layout, options and
the math: mmpola/ops/pola.py). Per head, with x = t / s, the feature map of a query or key row t is
``[x+ || x-] = [relu(x)^p || relu(-x)^p]`` (d wide each, one ``exp2(p * log2|x|)`` per element); the
keys give ``KV+ = x+^T v / n``, ``KV- = x-^T v / n`` (d x d each) and the key means ``m+``, ``m-``; the
queries give, per output column c, ``num = x+ @ W+ + x- @ W-`` with ``W+ = KV+, W- = KV-`` on the
same-sign columns (c < d/2) and swapped on the opposite-sign ones, and the normalisers
``x+ . m+ + x- . m-`` (same sign) and ``x- . m+ + x+ . m-`` (opposite sign). This is the (2d, d+2)
matrix W of :func:`~mmpola.ops.pola.pola_attention_fast` held as two d x d halves and two vectors.

Forward, two kernels:

1. key pass, grid (B*h, key chunks): each program sums ``x+^T v``, ``x-^T v`` (``tl.dot``) and the
   token sums of x+, x- over its chunk of keys and writes them as one fp32 record per chunk; one torch
   ``.sum`` over the chunks (deterministic, no atomics) gives the per-head summaries;
2. query pass, grid (B*h, query blocks): feature map, W+- and m+- from the summaries (the 1/n
   applied on load), both numerators (two ``tl.dot``), both normalisers and the division, written in
   the input dtype.

Saved for backward: q, k, v (as given), the raw scale and power and the per-head summaries (KV+, KV-,
key sums): no (B, h, N, 2d) feature map is stored; the backward kernels recompute them. A key bias (the
models' key positional encoding) is added where the keys are read, in both directions: k + bias is
never a tensor, and k's gradient, summed over the batch the bias is shared by, is the bias's (one sum,
written in the bias's own layout).

Backward, two kernels:

1. query pass, grid (B*h, query chunks): recomputes the query features, numerators and normalisers;
   writes dL/dq; per chunk one record of the partial sums of dL/dW+ = x+^T (g z), dL/dW- and dL/dm+-
   (the normalisers' gradients) and the query tokens' part of dL/dscale and dL/dpower;
2. key pass, grid (B*h, key chunks), after a torch ``.sum`` over the query chunks: recomputes the key
   features; dL/dKV+- are dL/dW+- with W's column swap undone; writes dL/dk and dL/dv; per chunk the
   key tokens' part of dL/dscale and dL/dpower (the first chunk adds the query tokens' part), so that one
   ``.sum`` over the chunks, and over the batch for parameters the batch shares, gives their gradients.

The feature-map backward is that of :func:`~mmpola.ops.pola._feature_map_backward`: with
gm = g+ * x+ + g- * x- (disjoint supports), dL/dt = p * gm / t (0 at t = 0), dL/ds = -p * sum(gm) / s,
dL/dp = sum(gm * ln|x|) (0 where x = 0: no NaN). Every kernel reads the raw parameters and computes
s = softplus(scale) and p = 1 + alpha * sigmoid(power) itself, and the backward kernels multiply their
partial sums by ds/dscale and dp/dpower: no torch op runs on the parameters but that one sum. A
parameter shared by the batch (the models') is read with batch stride 0.

Inputs: float32, float16 or bfloat16 (float64 under the interpreter, computed in float64), any strides
(views of a projection need no copy); computed in float32 (float64), output in q's dtype. The d x d
products run on tensor cores: three TF32 products each (about fp32 accuracy) for float32 inputs, one
TF32 product for float16 / bfloat16 inputs (whose own rounding is coarser); float32 at d = 128 in IEEE
fp32. Head dims of any even size (blocks padded to a power of two >= 16, masked).

On a GPU each kernel is tuned (triton_support.tunable) over its token block and warps, among the blocks
no longer than :func:`_launch_config`'s (what fits an A100's shared memory); the chunks are multiples of
that block and a block stops at its chunk's end, so the partial sums do not depend on the config.
"""
import torch

from .dispatch import (
    AttnImplUnavailable,
    apply_function,
    attention_op,
    empty_attention,
    key_bias_gradient,
    key_bias_operand,
)
from .pola import _check_shapes
from .triton_support import (
    cdiv,
    dot_precision,
    kernel_target,
    key_bias_args,
    launch,
    next_power_of_2,
    triton_available,
    triton_unsupported,
    tunable,
)

if triton_available() is None:
    from .triton_support import add_key_bias, batch_and_head, sigmoid_parts, softplus

__all__ = ['pola_attention_triton']

if triton_available() is None:
    import triton
    import triton.language as tl

    def _tuned(block_name):
        """What a kernel is tuned over on a GPU (triton_support.tunable): tokens a block and warps, one stage
        (no prefetch buffers in shared memory: the d x d operands take most of it)."""
        return [triton.Config({block_name: block}, num_warps=warps, num_stages=1) for block in (16, 32, 64)
                for warps in (4, 8)]

    def _fitting(direction):
        """The configs of blocks no longer than :func:`_launch_config`'s for the head dim block (``direction``
        1: forward kernels, 2: backward kernels): what fits the shared memory of an A100."""
        def prune(configs, named_args, **kwargs):
            limit = _launch_config(kwargs['BD'])[direction][0]
            return [config for config in configs if next(iter(config.kwargs.values())) <= limit]
        return prune

    _TUNED_KEY = ['BD', 'PREC']

    @triton.jit
    def _features(t, s, p):
        """x = t / s -> (x+, x-, log2|x|): relu(x)^p, relu(-x)^p (one exp2 per element; 0 at x = 0)."""
        x = t / s[None, :]
        ax = tl.abs(x)
        nonzero = ax > 0
        lx = tl.log2(tl.where(nonzero, ax, 1.0))
        mag = tl.where(nonzero, tl.exp2(p[None, :] * lx), 0.0)
        xp = tl.where(x > 0, mag, 0.0)
        return xp, mag - xp, lx

    @triton.jit
    def _mm(a, b, acc, PREC: tl.constexpr):
        """acc + a @ b, accumulated in acc's dtype (float32; float64 under the interpreter)."""
        return tl.dot(a, b, acc, input_precision=PREC, out_dtype=acc.dtype)

    @triton.jit
    def _load_rows(base, offs_n, offs_d, n, d, stride_n, stride_d, ACC: tl.constexpr):
        mask = (offs_n[:, None] < n) & (offs_d[None, :] < d)
        return tl.load(base + offs_n[:, None] * stride_n + offs_d[None, :] * stride_d, mask=mask,
                       other=0.0).to(ACC)

    @triton.jit
    def _load_keys(k_base, b_base, offs_n, offs_d, n, d, sk_n, sk_d, sb_n, sb_d, BIAS: tl.constexpr,
                   ACC: tl.constexpr):
        """Key rows, with the key bias added (``BIAS``; triton_support.add_key_bias)."""
        mask = (offs_n[:, None] < n) & (offs_d[None, :] < d)
        t = _load_rows(k_base, offs_n, offs_d, n, d, sk_n, sk_d, ACC)
        return add_key_bias(t, b_base + offs_n[:, None] * sb_n + offs_d[None, :] * sb_d, mask, BIAS)

    @triton.jit
    def _store_rows(base, value, offs_n, offs_d, n, d, stride_n, stride_d):
        mask = (offs_n[:, None] < n) & (offs_d[None, :] < d)
        tl.store(base + offs_n[:, None] * stride_n + offs_d[None, :] * stride_d,
                 value.to(base.dtype.element_ty), mask=mask)

    @triton.jit
    def _head(scale_ptr, power_ptr, H, d, ss_b, ss_h, ss_d, sp_b, sp_h, sp_d, alpha, BD: tl.constexpr,
              ACC: tl.constexpr):
        """The program's head (grid axis 0: batch * head), its batch and head index, the head dim lanes, the
        head's raw parameters (0 on the padded lanes, read through their strides: broadcast views need
        no copy) and s = softplus(scale), p = 1 + alpha * sigmoid(power)."""
        bh = tl.program_id(0)
        b, h = batch_and_head(bh, H)
        offs_d = tl.arange(0, BD)
        raw_s = tl.load(scale_ptr + b * ss_b + h * ss_h + offs_d * ss_d, mask=offs_d < d, other=0.0).to(ACC)
        raw_p = tl.load(power_ptr + b * sp_b + h * sp_h + offs_d * sp_d, mask=offs_d < d, other=0.0).to(ACC)
        s = softplus(raw_s)
        p = 1.0 + alpha * sigmoid_parts(raw_p)[0]
        return bh, b, h, offs_d, raw_s, raw_p, s, p

    @triton.jit
    def _parameter_gradients(gm_sum, gm_log, raw_s, raw_p, s, p, alpha):
        """The partial gradients of the raw scale and power, from sum(gm) and sum(gm * log2|x|): dL/ds =
        -p sum(gm) / s times ds/dscale = sigmoid(scale); dL/dp = ln 2 sum(gm * log2|x|) times dp/dpower =
        alpha sigmoid(power) (1 - sigmoid(power))."""
        return (-p * gm_sum / s * sigmoid_parts(raw_s)[0],
                gm_log * (0.6931471805599453 * alpha) * sigmoid_parts(raw_p)[1])

    @triton.jit
    def _store_vectors(ptr, u, w, BD: tl.constexpr):
        """Two BD vectors, one after the other."""
        offs_d = tl.arange(0, BD)
        tl.store(ptr + offs_d, u)
        tl.store(ptr + BD + offs_d, w)

    @triton.jit
    def _numerators(qp, qm, w_pos, w_neg, m_pos, m_neg, same, eps, PREC: tl.constexpr):
        """num = x+ @ W+ + x- @ W- and the reciprocal normalisers of a block of queries: same-sign,
        opposite-sign, and per output column (``same``: the same-sign columns)."""
        num = _mm(qm, w_neg, _mm(qp, w_pos, tl.zeros(qp.shape, dtype=qp.dtype), PREC), PREC)
        z_same = 1.0 / (tl.sum(qp * m_pos[None, :] + qm * m_neg[None, :], axis=1) + eps)
        z_opp = 1.0 / (tl.sum(qm * m_pos[None, :] + qp * m_neg[None, :], axis=1) + eps)
        return num, z_same, z_opp, tl.where(same, z_same[:, None], z_opp[:, None])

    @tunable(_tuned('BLOCK_N'), _TUNED_KEY, _fitting(1))
    @triton.jit
    def _pola_fwd_keys(k_ptr, b_ptr, v_ptr, scale_ptr, power_ptr, part_ptr, H, n, d, chunk, alpha,
                       sk_b, sk_h, sk_n, sk_d, sb_b, sb_h, sb_n, sb_d, sv_b, sv_h, sv_n, sv_d,
                       ss_b, ss_h, ss_d, sp_b, sp_h, sp_d,
                       BLOCK_N: tl.constexpr, BD: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                       BIAS: tl.constexpr):
        """Per key chunk: x+^T v, x-^T v (BD x BD each) and the token sums of x+, x- (fp32 partials)."""
        bh, b, h, offs_d, raw_s, raw_p, s, p = _head(scale_ptr, power_ptr, H, d, ss_b, ss_h, ss_d, sp_b, sp_h, sp_d,
                                                     alpha, BD, ACC)
        c = tl.program_id(1)
        num_chunks = tl.num_programs(1)
        k_base = k_ptr + b * sk_b + h * sk_h
        b_base = b_ptr + b * sb_b + h * sb_h
        v_base = v_ptr + b * sv_b + h * sv_h
        kv_pos = tl.zeros((BD, BD), dtype=ACC)
        kv_neg = tl.zeros((BD, BD), dtype=ACC)
        sum_pos = tl.zeros((BD, ), dtype=ACC)
        sum_neg = tl.zeros((BD, ), dtype=ACC)
        hi = tl.minimum(c * chunk + chunk, n)  # a chunk's tail block stops at its end, whatever BLOCK_N
        for start in range(c * chunk, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            kt = _load_keys(k_base, b_base, offs_n, offs_d, hi, d, sk_n, sk_d, sb_n, sb_d, BIAS, ACC)
            kp, km, _ = _features(kt, s, p)
            vt = _load_rows(v_base, offs_n, offs_d, hi, d, sv_n, sv_d, ACC)
            kv_pos = _mm(tl.trans(kp), vt, kv_pos, PREC)
            kv_neg = _mm(tl.trans(km), vt, kv_neg, PREC)
            sum_pos += tl.sum(kp, axis=0)
            sum_neg += tl.sum(km, axis=0)
        _store_summary(part_ptr + (bh * num_chunks + c) * (2 * BD * BD + 2 * BD), kv_pos, kv_neg, sum_pos, sum_neg,
                       BD)

    @triton.jit
    def _store_summary(ptr, a_pos, a_neg, u_pos, u_neg, BD: tl.constexpr):
        """One summary record: two BD x BD matrices, then two BD vectors."""
        offs_d = tl.arange(0, BD)
        square = offs_d[:, None] * BD + offs_d[None, :]
        tl.store(ptr + square, a_pos)
        tl.store(ptr + BD * BD + square, a_neg)
        _store_vectors(ptr + 2 * BD * BD, u_pos, u_neg, BD)

    @triton.jit
    def _load_summaries(ptr, half, scale, BD: tl.constexpr, ACC: tl.constexpr):
        """From a record (KV+, KV-, key sums), times ``scale``: W+, W- (KV+ / KV- on the same-sign
        columns, swapped on the opposite-sign ones) and m+, m-."""
        offs_d = tl.arange(0, BD)
        square = offs_d[:, None] * BD + offs_d[None, :]
        kv_pos = tl.load(ptr + square).to(ACC) * scale
        kv_neg = tl.load(ptr + BD * BD + square).to(ACC) * scale
        same = offs_d[None, :] < half
        m_pos = tl.load(ptr + 2 * BD * BD + offs_d).to(ACC) * scale
        m_neg = tl.load(ptr + 2 * BD * BD + BD + offs_d).to(ACC) * scale
        return tl.where(same, kv_pos, kv_neg), tl.where(same, kv_neg, kv_pos), m_pos, m_neg

    @tunable(_tuned('BLOCK_M'), _TUNED_KEY, _fitting(1))
    @triton.jit
    def _pola_fwd_queries(q_ptr, scale_ptr, power_ptr, sum_ptr, o_ptr, H, N, d, half, inv_n, eps, alpha,
                          sq_b, sq_h, sq_n, sq_d, so_b, so_h, so_n, so_d, ss_b, ss_h, ss_d, sp_b, sp_h, sp_d,
                          BLOCK_M: tl.constexpr, BD: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):
        """Per query block: both numerators (x+ @ W+ + x- @ W-), both normalisers, the output."""
        bh, b, h, offs_d, raw_s, raw_p, s, p = _head(scale_ptr, power_ptr, H, d, ss_b, ss_h, ss_d, sp_b, sp_h, sp_d,
                                                     alpha, BD, ACC)
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        w_pos, w_neg, m_pos, m_neg = _load_summaries(sum_ptr + bh * (2 * BD * BD + 2 * BD), half, inv_n, BD, ACC)
        qp, qm, _ = _features(_load_rows(q_ptr + b * sq_b + h * sq_h, offs_m, offs_d, N, d, sq_n, sq_d, ACC), s, p)
        num, _, _, z = _numerators(qp, qm, w_pos, w_neg, m_pos, m_neg, offs_d[None, :] < half, eps, PREC)
        _store_rows(o_ptr + b * so_b + h * so_h, num * z, offs_m, offs_d, N, d, so_n, so_d)

    @tunable(_tuned('BLOCK_M'), _TUNED_KEY + ['JOIN'], _fitting(2))
    @triton.jit
    def _pola_bwd_queries(q_ptr, g_ptr, scale_ptr, power_ptr, sum_ptr, dq_ptr, part_ptr, H, N, d, half, inv_n, eps,
                          chunk, alpha, sq_b, sq_h, sq_n, sq_d, sg_b, sg_h, sg_n, sg_d, sdq_b, sdq_h, sdq_n, sdq_d,
                          ss_b, ss_h, ss_d, sp_b, sp_h, sp_d,
                          BLOCK_M: tl.constexpr, BD: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                          JOIN: tl.constexpr):
        """Per query chunk: dL/dq; a record of partial dL/dW+-, dL/dm+- and dL/dscale, dL/dpower.

        JOIN (:func:`_join_weight_grads`): dL/dW+ and dL/dW- as one product, g^T [x+ x-] (BD x 2 BD, the two
        feature maps' columns interleaved), instead of two square ones x+^T g, x-^T g."""
        bh, b, h, offs_d, raw_s, raw_p, s, p = _head(scale_ptr, power_ptr, H, d, ss_b, ss_h, ss_d, sp_b, sp_h, sp_d,
                                                     alpha, BD, ACC)
        c = tl.program_id(1)
        num_chunks = tl.num_programs(1)
        w_pos, w_neg, m_pos, m_neg = _load_summaries(sum_ptr + bh * (2 * BD * BD + 2 * BD), half, inv_n, BD, ACC)
        same = offs_d[None, :] < half
        q_base = q_ptr + b * sq_b + h * sq_h
        g_base = g_ptr + b * sg_b + h * sg_h
        dq_base = dq_ptr + b * sdq_b + h * sdq_h
        if JOIN:
            dw_t = tl.zeros((BD, 2 * BD), dtype=ACC)  # [c, 2j + sign] = dL/dW(sign)[j, c]
        else:
            dw_pos = tl.zeros((BD, BD), dtype=ACC)
            dw_neg = tl.zeros((BD, BD), dtype=ACC)
        dm_pos = tl.zeros((BD, ), dtype=ACC)
        dm_neg = tl.zeros((BD, ), dtype=ACC)
        gm_sum = tl.zeros((BD, ), dtype=ACC)
        gm_log = tl.zeros((BD, ), dtype=ACC)
        hi = tl.minimum(c * chunk + chunk, N)  # a chunk's tail block stops at its end, whatever BLOCK_M
        for start in range(c * chunk, hi, BLOCK_M):
            offs_m = start + tl.arange(0, BLOCK_M)
            qt = _load_rows(q_base, offs_m, offs_d, hi, d, sq_n, sq_d, ACC)
            g = _load_rows(g_base, offs_m, offs_d, hi, d, sg_n, sg_d, ACC)
            qp, qm, lx = _features(qt, s, p)
            num, z_same, z_opp, z = _numerators(qp, qm, w_pos, w_neg, m_pos, m_neg, same, eps, PREC)
            gn = g * z  # dL/dnum
            gout = gn * num  # g * out
            # dL/d(normaliser) = -z * sum over the branch's columns of g * out
            r_same = -z_same * tl.sum(tl.where(same, gout, 0.0), axis=1)
            r_opp = -z_opp * tl.sum(tl.where(same, 0.0, gout), axis=1)
            dqp = _mm(gn, tl.trans(w_pos), r_same[:, None] * m_pos[None, :] + r_opp[:, None] * m_neg[None, :], PREC)
            dqm = _mm(gn, tl.trans(w_neg), r_same[:, None] * m_neg[None, :] + r_opp[:, None] * m_pos[None, :], PREC)
            if JOIN:
                dw_t = _mm(tl.trans(gn), tl.reshape(tl.join(qp, qm), (BLOCK_M, 2 * BD)), dw_t, PREC)
            else:
                dw_pos = _mm(tl.trans(qp), gn, dw_pos, PREC)
                dw_neg = _mm(tl.trans(qm), gn, dw_neg, PREC)
            dm_pos += tl.sum(r_same[:, None] * qp + r_opp[:, None] * qm, axis=0)
            dm_neg += tl.sum(r_same[:, None] * qm + r_opp[:, None] * qp, axis=0)
            gm = dqp * qp + dqm * qm
            gm_sum += tl.sum(gm, axis=0)
            gm_log += tl.sum(gm * lx, axis=0)
            dq = p[None, :] * gm / tl.where(qt == 0, 1.0, qt)  # gm = 0 where t = 0
            _store_rows(dq_base, dq, offs_m, offs_d, hi, d, sdq_n, sdq_d)
        record = part_ptr + (bh * num_chunks + c) * (2 * BD * BD + 4 * BD)
        if JOIN:
            cols = tl.arange(0, 2 * BD)
            tl.store(record + (cols % 2)[None, :] * (BD * BD) + (cols // 2)[None, :] * BD + offs_d[:, None], dw_t)
            _store_vectors(record + 2 * BD * BD, dm_pos, dm_neg, BD)
        else:
            _store_summary(record, dw_pos, dw_neg, dm_pos, dm_neg, BD)
        ds, dp = _parameter_gradients(gm_sum, gm_log, raw_s, raw_p, s, p, alpha)
        _store_vectors(record + 2 * BD * BD + 2 * BD, ds, dp, BD)

    @tunable(_tuned('BLOCK_N'), _TUNED_KEY, _fitting(2))
    @triton.jit
    def _pola_bwd_keys(k_ptr, b_ptr, v_ptr, scale_ptr, power_ptr, dsum_ptr, dk_ptr, dv_ptr, part_ptr,
                       H, n, d, half, inv_n, chunk, alpha,
                       sk_b, sk_h, sk_n, sk_d, sb_b, sb_h, sb_n, sb_d, sv_b, sv_h, sv_n, sv_d,
                       sdk_b, sdk_h, sdk_n, sdk_d, sdv_b, sdv_h, sdv_n, sdv_d, ss_b, ss_h, ss_d, sp_b, sp_h, sp_d,
                       BLOCK_N: tl.constexpr, BD: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                       BIAS: tl.constexpr):
        """Per key chunk: dL/dk, dL/dv from dL/dKV+- and dL/dm+-; partial dL/dscale, dL/dpower (chunk 0: with
        the query tokens' part)."""
        bh, b, h, offs_d, raw_s, raw_p, s, p = _head(scale_ptr, power_ptr, H, d, ss_b, ss_h, ss_d, sp_b, sp_h, sp_d,
                                                     alpha, BD, ACC)
        c = tl.program_id(1)
        num_chunks = tl.num_programs(1)
        # dL/dW+- -> dL/dKV+- (the same column swap as W), with the 1/n of the key mean and of KV
        dkv_pos, dkv_neg, dm_pos, dm_neg = _load_summaries(dsum_ptr + bh * (2 * BD * BD + 4 * BD), half, inv_n, BD,
                                                           ACC)
        k_base = k_ptr + b * sk_b + h * sk_h
        b_base = b_ptr + b * sb_b + h * sb_h
        v_base = v_ptr + b * sv_b + h * sv_h
        dk_base = dk_ptr + b * sdk_b + h * sdk_h
        dv_base = dv_ptr + b * sdv_b + h * sdv_h
        gm_sum = tl.zeros((BD, ), dtype=ACC)
        gm_log = tl.zeros((BD, ), dtype=ACC)
        hi = tl.minimum(c * chunk + chunk, n)
        for start in range(c * chunk, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            kt = _load_keys(k_base, b_base, offs_n, offs_d, hi, d, sk_n, sk_d, sb_n, sb_d, BIAS, ACC)
            vt = _load_rows(v_base, offs_n, offs_d, hi, d, sv_n, sv_d, ACC)
            kp, km, lx = _features(kt, s, p)
            zero = tl.zeros((BLOCK_N, BD), dtype=ACC)
            dkp = _mm(vt, tl.trans(dkv_pos), zero + dm_pos[None, :], PREC)
            dkm = _mm(vt, tl.trans(dkv_neg), zero + dm_neg[None, :], PREC)
            dv = _mm(km, dkv_neg, _mm(kp, dkv_pos, zero, PREC), PREC)
            _store_rows(dv_base, dv, offs_n, offs_d, hi, d, sdv_n, sdv_d)
            gm = dkp * kp + dkm * km  # zero on padded rows (kp = km = 0 there)
            gm_sum += tl.sum(gm, axis=0)
            gm_log += tl.sum(gm * lx, axis=0)
            dk = p[None, :] * gm / tl.where(kt == 0, 1.0, kt)
            _store_rows(dk_base, dk, offs_n, offs_d, hi, d, sdk_n, sdk_d)
        ds, dp = _parameter_gradients(gm_sum, gm_log, raw_s, raw_p, s, p, alpha)
        # chunk 0 adds the query tokens' part (the last two vectors of the query backward's summed record):
        # one sum of these records over the chunks (and the batch) is then the parameters' gradient
        queries = dsum_ptr + bh * (2 * BD * BD + 4 * BD) + 2 * BD * BD + 2 * BD
        ds += tl.where(c == 0, tl.load(queries + offs_d).to(ACC), 0.0)
        dp += tl.where(c == 0, tl.load(queries + BD + offs_d).to(ACC), 0.0)
        _store_vectors(part_ptr + (bh * num_chunks + c) * 2 * BD, ds, dp, BD)


# the dtype of the kernels' partial sums per accumulator dtype
_WORK = {tl.float32: torch.float32, tl.float64: torch.float64} if triton_available() is None else {}

# Programs per streaming multiprocessor that the token-chunked kernels aim for
_PROGRAMS_PER_SM = 4


def _launch_config(d):
    """(head dim block, (token block, warps) of the forward kernels, (token block, warps) of the backward
    kernels) for head dim d. The backward kernels keep four d x d tiles live besides their token tiles,
    hence their shorter token blocks. With triton_support's ``dot_precision`` and one stage, no kernel needs
    more than 160 KiB of shared memory (H100 / H200, B200: 227 KiB, A100: 163 KiB); GPUs with less (99 KiB:
    sm_86, sm_89, sm_120) run float16 / bfloat16 inputs up to d = 64 and float32 up to d = 32
    (triton_support.SMALL_SHARED_MEMORY turns the rest down there)."""
    bd = max(16, next_power_of_2(d))
    if bd <= 32:
        return bd, (64, 4), (32, 8)
    if bd <= 64:
        return bd, (64, 8), (16, 8)
    return bd, (32, 8), (16, 8)


def _key_defaults(bd, dtype, forward, backward, target):
    """The default (token block, warps) of the forward and backward key kernels: on a GPU, shorter token
    blocks than the query kernels' where theirs spill registers (float32 inputs in the forward at head dims
    32 and 64, every dtype in the backward up to 32), so that untuned runs (triton_support.autotuning) take
    a config that keeps its tiles in registers (``tools/check_triton_kernels.py --untuned`` lists the
    defaults' spills). Elsewhere (the interpreter) the query kernels' blocks. ``target``: the
    :class:`~mmpola.ops.triton_support.KernelTarget` they run on."""
    if not target.gpu:
        return forward, backward
    if dtype == torch.float32 and bd in (32, 64):
        forward = (32 if bd == 32 else 16, forward[1])
    if bd <= 32:
        backward = (16, backward[1])
    return forward, backward


def _join_weight_grads(bd, target):
    """Whether the query backward computes dL/dW+ and dL/dW- as one product (its ``JOIN``).

    Triton gives the products of a kernel the warp layout of one of them, and a square product such as
    x+^T g (BD x BD) lines the warps up along its rows; every token tile then holds all its columns in
    every warp, more than the registers hold. Joined, the product is BD x 2 BD and the warps split the
    columns: at head dims up to 32, and up to 64 where the products are one warp's each
    (:attr:`~mmpola.ops.triton_support.KernelTarget.warp_products`: compute capability 8.x and 12.x) and in the
    interpreter, ``make check-kernels`` shows no spills where there were hundreds to thousands of bytes
    (docs/development.md). On sm_90 at head dims >= 64 the square products are warpgroup products, which
    leave the other products their column split (the joined one does not compile there for float16 /
    bfloat16 inputs with Triton 3.7), and on sm_100 the products are in tensor memory; at head dim 128 the
    joined accumulator alone is too large. ``target``: the :class:`~mmpola.ops.triton_support.KernelTarget` it
    runs on."""
    if bd <= 32 or bd > 64:
        return bd <= 32
    return target.warp_products or not target.gpu


def _chunking(tokens, heads, block, device):
    """(tokens per chunk, number of chunks) splitting ``tokens`` so that heads x chunks programs fill
    the device; a chunk is a multiple of ``block`` tokens."""
    blocks = cdiv(tokens, block)
    want = max(1, cdiv(_PROGRAMS_PER_SM * kernel_target(device).sm_count, heads))
    chunk = cdiv(blocks, min(blocks, want)) * block
    return chunk, cdiv(tokens, chunk)


def _pola_forward(q, k, v, scale, power, bias, alpha, eps):
    """The forward kernels on q, k, v (B, h, N|n, d) of any strides and the raw scale and power as (B', h, 1, d)
    views (:func:`_per_head`); returns (the output (B, h, N, d), a view of the tokens' layout (B, N, h, d), in
    q's dtype; what :func:`_pola_backward` takes)."""
    B, H, N, d = q.shape
    n = k.shape[2]
    bh = B * H
    bd, (block, warps), backward = _launch_config(d)
    wide = torch.float64 in (q.dtype, k.dtype, v.dtype, k.dtype if bias is None else bias.dtype)
    target = kernel_target(q.device)
    key_forward, key_backward = _key_defaults(bd, k.dtype, (block, warps), backward, target)
    acc = tl.float64 if wide else tl.float32
    options = dict(BD=bd, ACC=acc, PREC=dot_precision(torch.float64 if wide else q.dtype, bd))
    # the default config (triton_support.launch); one stage: no prefetch buffers in shared memory
    config = dict(num_warps=warps, num_stages=1)
    params = (*_head_strides(scale), *_head_strides(power))
    chunk, chunks = _chunking(n, bh, block, q.device)
    # per key chunk: KV+, KV- (bd x bd) and the key sums of x+, x- (bd each)
    parts = q.new_empty(bh, chunks, 2 * bd * bd + 2 * bd, dtype=_WORK[acc])
    bias_ptr, bias_strides = key_bias_args(bias, k)
    launch(_pola_fwd_keys, (bh, chunks), k, bias_ptr, v, scale, power, parts, H, n, d, chunk, alpha, *k.stride(),
           *bias_strides, *v.stride(), *params, BIAS=bias is not None,
           default=dict(BLOCK_N=key_forward[0], num_warps=key_forward[1], num_stages=1), **options)
    sums = parts.sum(1)
    # in the tokens' layout (B, N, h, d), seen as (B, h, N, d): the models merge the heads with a view
    out = torch.empty_strided((B, H, N, d), (N * H * d, d, H * d, 1), device=q.device, dtype=q.dtype)
    launch(
        _pola_fwd_queries, lambda meta: (bh, cdiv(N, meta['BLOCK_M'])), q, scale, power, sums, out, H, N,
        d, d // 2, 1.0 / n, eps, alpha, *q.stride(), *out.stride(), *params,
        default=dict(BLOCK_M=block, **config), **options)
    return out, ((q, k, v, scale, power, sums, bias),
                 (alpha, eps, backward, key_backward, _join_weight_grads(bd, target), options))


def _pola_backward(saved, config, grad_out, grads=None):
    """(dL/dq, dL/dk, dL/dv, dL/dscale, dL/dpower, dL/dbias or None) from the output's gradient (any strides) and
    what :func:`_pola_forward` returned beside the output; the gradients of q, k, v in their strides (``grads``:
    the tensors of q's, k's and v's shapes, any strides, to write them into instead), those of the parameters of
    their views' shapes."""
    q, k, v, scale, power, sums, bias = saved
    alpha, eps, (block, warps), key_backward, join, options = config
    B, H, N, d = q.shape
    n = k.shape[2]
    bh, bd = B * H, options['BD']
    params = (*_head_strides(scale), *_head_strides(power))
    dq, dk, dv = grads if grads is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    chunk, chunks = _chunking(N, bh, block, q.device)
    # per query chunk: dL/dW+, dL/dW- (bd x bd), dL/dm+, dL/dm-, dL/dscale, dL/dpower (bd each)
    parts = sums.new_empty(bh, chunks, 2 * bd * bd + 4 * bd)
    launch(
        _pola_bwd_queries, (bh, chunks), q, grad_out, scale, power, sums, dq, parts, H, N, d, d // 2, 1.0 / n,
        eps, chunk, alpha, *q.stride(), *grad_out.stride(), *dq.stride(), *params,
        JOIN=join, default=dict(BLOCK_M=block, num_warps=warps, num_stages=1),
        **options)
    query_sums = parts.sum(1)
    chunk, chunks = _chunking(n, bh, block, q.device)
    # per key chunk: dL/dscale, dL/dpower of its tokens (chunk 0: and of every query token)
    parts = sums.new_empty(bh, chunks, 2 * bd)
    bias_ptr, bias_strides = key_bias_args(bias, k)
    launch(
        _pola_bwd_keys, (bh, chunks), k, bias_ptr, v, scale, power, query_sums, dk, dv, parts,
        H, n, d, d // 2, 1.0 / n, chunk, alpha, *k.stride(), *bias_strides, *v.stride(), *dk.stride(),
        *dv.stride(), *params, BIAS=bias is not None,
        default=dict(BLOCK_N=key_backward[0], num_warps=key_backward[1], num_stages=1), **options)
    return (dq, dk, dv, *_summed_parameter_gradients(parts.view(B, H, chunks, 2, bd), scale.shape, power.shape),
            None if bias is None else key_bias_gradient(dk, bias))


class _PolaTriton(torch.autograd.Function):
    """The kernels' autograd: q, k, v (B, h, N|n, d) of any strides; the raw scale and power as (B', h, 1, d)
    views of any strides (:func:`_per_head`: B' = 1 for a parameter the batch shares, else B); the kernels
    apply softplus and 1 + alpha * sigmoid themselves, and their backward writes the gradients of the raw
    parameters, of those views' shapes."""

    @staticmethod
    def forward(ctx, q, k, v, scale, power, bias, alpha, eps):
        out, (saved, ctx.config) = _pola_forward(q, k, v, scale, power, bias, alpha, eps)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        return (*_pola_backward(ctx.saved_tensors, ctx.config, grad_out), None, None)


def _summed_parameter_gradients(parts, scale_shape, power_shape):
    """The raw scale's and power's gradients, of their (B', h, 1, d) shapes, from the key backward's records
    (B, h, chunks, 2, BD): one sum over the chunks, and over the batch too for parameters shared by the
    batch (B' = 1), laid out so that each gradient is contiguous (autograd accumulates it without a copy)."""
    B, H, _, _, bd = parts.shape
    d = scale_shape[-1]
    by_parameter = parts.permute(3, 0, 1, 2, 4)  # (2, B, h, chunks, BD)
    shared = scale_shape[0] == 1 and power_shape[0] == 1
    sums = by_parameter.sum((1, 3) if shared else 3)  # (2, h, BD) or (2, B, h, BD), contiguous
    batch = 1 if shared else B
    grads = []
    for i, shape in enumerate((scale_shape, power_shape)):
        # sums[i] seen as (B', h, 1, d), one view operator
        grad = sums.as_strided((batch, H, 1, d), (H * bd, bd, bd, 1), sums.storage_offset() + i * batch * H * bd)
        grads.append(grad if batch == shape[0] else grad.sum(0, keepdim=True))
    return grads


def _head_strides(param):
    """The strides of a (B', h, 1, d) parameter view along the batch (0 when B' = 1: shared by the batch),
    the heads and the head dim."""
    return param.stride(0) if param.shape[0] > 1 else 0, param.stride(1), param.stride(3)


def _per_head(param, lead, d, name):
    """A parameter as a (B', h, 1, d) view, no copy: B' = 1 for a parameter shared by the batch of q's
    (B, h) leading dims (the models' parameters: the kernels read it with batch stride 0, and the backward
    sums its gradient over the batch itself); else B' = B, or the batch of q's leading dims when they are
    not (B, h)."""
    shared = len(lead) == 2 and (param.dim() < 4 or param.shape[0] == 1)
    shape = (1, lead[1], 1, d) if shared else (*lead, 1, d)
    if param.shape == shape:  # the models' parameters: the view as it is (no operator)
        return param if len(lead) == 2 else param.reshape(-1, 1, 1, d)
    try:
        full = torch.broadcast_to(param, shape)
    except RuntimeError:
        raise ValueError(f"pola_attention_triton takes {name} constant along the tokens, broadcastable to "
                         f"{(*lead, 1, d)}; got shape {tuple(param.shape)} (use impl='fast')") from None
    return full if len(lead) == 2 else full.reshape(-1, 1, 1, d)


def pola_attention_triton(q, k, v, power, scale, alpha=4.0, eps=1e-6, key_bias=None):
    """Pola attention in Triton kernels; same arguments and result as
    :func:`~mmpola.ops.pola.pola_attention_reference` (q (B, h, N, d), k and v (B, h, n, d), any strides;
    power and scale broadcastable to (1, h, 1, d)). Computes in float32 whatever the input dtype
    (float16 / bfloat16 / float32; float64 in float64), returns q's dtype. ``key_bias`` (broadcastable to k,
    any strides) is added to the keys where the kernels read them, in their dtype: the result of
    ``k + key_bias`` without that tensor (its gradient is k's, summed over the broadcast dims)."""
    _check_shapes(q, k, v)
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f'pola_attention_triton takes q, k and v with the same leading (batch, head) dims; got '
                         f'q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}')
    reason = triton_unsupported(q.device, q.dtype, head_dim=q.shape[-1])
    if reason is not None:
        raise AttnImplUnavailable(f"attn_impl='triton' (pola_attention) cannot run here: {reason}")
    empty = empty_attention('pola_attention', (q, k, v, power, scale, key_bias))
    if empty is not None:
        return empty
    key_bias = key_bias_operand('pola_attention', k, key_bias)
    lead, (N, d), n = q.shape[:-2], q.shape[-2:], k.shape[-2]
    if q.dim() != 4:
        key_bias = None if key_bias is None else key_bias.expand(k.shape).reshape(-1, 1, n, d)
        q, k, v = q.reshape(-1, 1, N, d), k.reshape(-1, 1, n, d), v.reshape(-1, 1, n, d)
    wide = any(t is not None and t.dtype == torch.float64 for t in (q, k, v, key_bias))
    compute = torch.float64 if wide else torch.float32
    scale = _per_head(scale.to(compute), lead, d, 'scale')
    power = _per_head(power.to(compute), lead, d, 'power')
    out = apply_function(_PolaTriton, q, k, v, scale, power, key_bias, float(alpha), float(eps))
    return out.reshape(*lead, N, d)


attention_op('pola').register('triton', pola_attention_triton, supports=triton_unsupported, preferred_on=('cuda', ),
                              fp32_inside=True, key_bias=True)
