"""Focused linear attention (mmpola.ops.flatten) in Triton kernels, forward and backward.

Layout and math as in :mod:`mmpola.ops.flatten`: q (B, N, C), k, v (B, n, C), heads are column slices
of d = C / h channels (read through the tensors' strides, never copied into a (B, h, N, d) layout).
With a = (relu(x) + 1e-6) / s and p = a**f, the feature map is y = p * c, c = ||a|| / ||p|| per
token, its norms over all C channels (across heads). Every kernel loads its inputs in their dtype,
computes in float32 and writes its outputs in the inputs' dtype; the (d, d) products use ``tl.dot``
in full float32 precision.

Forward:

1. token statistics (q and k, one launch each): c = ||a|| / ||p|| and 1 / ||a||**2 per token, a
   pass over all C channels of a block of tokens (two float32 numbers per token: all that couples
   the heads).
2. key reduction, grid (B * h, key chunks): each program forms phi(k) of its tokens and writes its
   partial KV = phi(k)^T v / n (d, d) and M = mean(phi(k)) (d) as one record; one ``.sum`` over the
   chunks gives both (deterministic, no atomics; the backward's partial dKV and dM likewise). The
   chunks fill the GPU when B * h is small (PVT stage 1: h = 1).
3. query pass, grid (B * h, query blocks): out = phi(q) KV / (phi(q) . M + eps).

Saved for backward: the inputs, the token statistics and the per-head KV and M. The feature maps
are recomputed in the backward kernels, never stored. A key bias (the models' key positional
encoding) is added where the keys are read (token statistics, key reduction, key backward): k + bias is
never a tensor, and k's gradient, summed over the batch the bias is shared by, is the bias's.

Backward (g = dL/dout, den = phi(q) . M + eps, gd = g / den, dden = -(g . out) / den per head):

4. query reduction, grid (B * h, query chunks): partial dKV = phi(q)^T gd and dM = sum dden phi(q);
   the feature map's backward needs G = sum over ALL channels of dL/dphi * phi, which is
   -eps * sum_heads dden for the queries (the output is scale-free in phi(q) but for eps): the kernel
   writes dden per (token, head).
5. query gradient, grid (B * h, query chunks): dL/dphi(q) = gd KV^T + dden M, then the feature map's
   backward (mmpola.ops.flatten._FocusedFeatureMap) to dq, and a partial of dL/ds per chunk.
6. key pass, grid (B * h, key chunks): dv = phi(k) dKV / n, and G's per-head part dv . v + phi(k) . dM / n.
7. key gradient: dL/dphi(k) = (v dKV^T + dM) / n, the feature map's backward to dk and dL/ds.

With one head nothing couples the heads: 4 and 5 (and 6 and 7) run as one kernel. The kernels read the
raw scale and compute s = softplus(scale) themselves; 5 and 7 write their chunks' parts of the raw
scale's gradient (dL/ds times ds/dscale = sigmoid(scale)) into one buffer, summed once. float64 inputs
(tests, through the interpreter) are computed in float32 and returned in float64.
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
from .flatten import _KERNEL_EPS, _check_shapes
from .triton_support import (
    cdiv,
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

__all__ = ['flatten_attention_triton']

if triton_available() is None:
    import triton
    import triton.language as tl

    # what the token kernels are tuned over on a GPU (triton_support.tunable): tokens a block and warps,
    # among the blocks no longer than _blocks' for the head dim (the chunks are multiples of it)
    _TUNED = [triton.Config({'BLOCK_T': block}, num_warps=warps) for block in (16, 32, 64) for warps in (4, 8)]
    _FOCUS_KEY = ['BLOCK_D', 'FOCUS', 'INT_FOCUS']

    def _fitting(configs, named_args, **kwargs):
        return [config for config in configs if config.kwargs['BLOCK_T'] <= _blocks(kwargs['BLOCK_D'])[0]]

    def _fitting_key_backward(configs, named_args, **kwargs):
        """:func:`_fitting`, with one head's blocks no longer than :func:`_one_head_key_block` (its key backward,
        LOCAL_G: dv, dk and G in one program)."""
        longest = _one_head_key_block(kwargs['BLOCK_D'], named_args['k_ptr'].dtype) if kwargs['LOCAL_G'] else None
        return [config for config in _fitting(configs, named_args, **kwargs)
                if longest is None or config.kwargs['BLOCK_T'] <= longest]

    @triton.jit
    def _power(a, FOCUS: tl.constexpr, INT_FOCUS: tl.constexpr):
        """a ** FOCUS for a > 0 (repeated products for an integer power)."""
        if INT_FOCUS:
            p = a
            for _ in tl.static_range(FOCUS - 1):
                p = p * a
        else:
            p = tl.exp2(FOCUS * tl.log2(a))
        return p

    @triton.jit
    def _scale(scale_ptr, cols, mask):
        """The raw scale of channels ``cols`` and s = softplus(scale) (1 on the masked lanes)."""
        raw = tl.load(scale_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        return raw, tl.where(mask, softplus(raw), 1.0)

    @triton.jit
    def _token_stats_kernel(x_ptr, bias_ptr, scale_ptr, stats_ptr, T, C, sxb, sxt, sxc, sbb, sbt, sbc,
                            FOCUS: tl.constexpr, INT_FOCUS: tl.constexpr, KERNEL_EPS: tl.constexpr,
                            BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BIAS: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        mt = offs_t < T
        sum_a2 = tl.zeros((BLOCK_T,), dtype=tl.float32)
        sum_p2 = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            mc = offs_c < C
            m2 = mt[:, None] & mc[None, :]
            x = tl.load(x_ptr + b * sxb + offs_t[:, None] * sxt + offs_c[None, :] * sxc, mask=m2, other=0.0)
            x = add_key_bias(x.to(tl.float32), bias_ptr + b * sbb + offs_t[:, None] * sbt + offs_c[None, :] * sbc,
                             m2, BIAS)
            _, s = _scale(scale_ptr, offs_c, mc)
            a = (tl.maximum(x, 0.0) + KERNEL_EPS) / s[None, :]  # > 0, also where masked
            p = tl.where(m2, _power(a, FOCUS, INT_FOCUS), 0.0)
            a = tl.where(m2, a, 0.0)
            sum_a2 += tl.sum(a * a, axis=1)
            sum_p2 += tl.sum(p * p, axis=1)
        sum_a2 = tl.where(mt, sum_a2, 1.0)
        sum_p2 = tl.where(mt, sum_p2, 1.0)
        row = stats_ptr + (b * T + offs_t) * 2
        tl.store(row, tl.sqrt(sum_a2 / sum_p2), mask=mt)
        tl.store(row + 1, 1.0 / sum_a2, mask=mt)

    @triton.jit
    def _features(x_ptr, scale_ptr, stats_ptr, b, head, offs_t, T, limit, d, sxb, sxt, sxc,
                  FOCUS: tl.constexpr, INT_FOCUS: tl.constexpr, KERNEL_EPS: tl.constexpr, BLOCK_D: tl.constexpr,
                  bias_ptr, sbb, sbt, sbc, BIAS: tl.constexpr):
        """(x, a, phi(x), c, 1 / ||a||**2) of a block of tokens (of T) in one head; 0 where masked (from
        token ``limit`` on). ``BIAS``: x with the key bias at ``bias_ptr`` added (add_key_bias)."""
        mt = offs_t < limit
        offs_d = tl.arange(0, BLOCK_D)
        md = offs_d < d
        m2 = mt[:, None] & md[None, :]
        cols = head * d + offs_d
        x = tl.load(x_ptr + b * sxb + offs_t[:, None] * sxt + cols[None, :] * sxc, mask=m2, other=0.0)
        x = add_key_bias(x.to(tl.float32), bias_ptr + b * sbb + offs_t[:, None] * sbt + cols[None, :] * sbc, m2, BIAS)
        _, s = _scale(scale_ptr, cols, md)
        a = (tl.maximum(x, 0.0) + KERNEL_EPS) / s[None, :]
        row = stats_ptr + (b * T + offs_t) * 2
        c = tl.load(row, mask=mt, other=0.0)
        inv_r2 = tl.load(row + 1, mask=mt, other=0.0)
        y = tl.where(m2, _power(a, FOCUS, INT_FOCUS) * c[:, None], 0.0)
        return x, a, y, inv_r2

    @triton.jit
    def _feature_backward(dy, x, a, y, inv_r2, big_g, s, FOCUS: tl.constexpr):
        """(dL/dx, dL/da) from dL/dphi (mmpola.ops.flatten._FocusedFeatureMap), G = sum(dL/dphi * phi)."""
        coef = (big_g * inv_r2)[:, None]
        grad_a = FOCUS * (y / a) * (dy - coef * y) + coef * a
        grad_x = tl.where(x > 0, grad_a / s[None, :], 0.0)
        return grad_x, grad_a

    @triton.jit
    def _store_scale_gradient(ptr, acc_ds, raw_s, s, offs_d, md):
        """A chunk's part of dL/dscale from acc_ds = sum(dL/da * a) over its tokens: a = (relu(x) + eps) / s
        gives dL/ds = -acc_ds / s, and ds/dscale = sigmoid(scale)."""
        tl.store(ptr + offs_d, -acc_ds / s * sigmoid_parts(raw_s)[0], mask=md)

    @triton.jit
    def _head(H, d, BLOCK_D: tl.constexpr):
        """The program's head (grid axis 0: batch * head), its batch and head, its chunk (grid axis 1) and
        the head dim lanes with their mask."""
        pid = tl.program_id(0)
        b, head = batch_and_head(pid, H)
        offs_d = tl.arange(0, BLOCK_D)
        return pid, b, head, tl.program_id(1), offs_d, offs_d < d

    @triton.jit
    def _load_head_summary(ptr, pid, d, offs_d, md):
        """The (d, d) matrix and the (d,) vector of head ``pid``'s record (0 on the padded lanes)."""
        record = ptr + pid * (d * d + d)
        mat = tl.load(record + offs_d[:, None] * d + offs_d[None, :], mask=md[:, None] & md[None, :], other=0.0)
        return mat, tl.load(record + d * d + offs_d, mask=md, other=0.0)

    @triton.jit
    def _store_head_summary(ptr, part, mat, vec, d, offs_d, md):
        """Store a (d, d) matrix and then a (d,) vector as record ``part`` of d * d + d floats (the unpadded
        lanes): the records of a head's chunks follow each other, so one sum over the chunks gives both."""
        record = ptr + part * (d * d + d)
        tl.store(record + offs_d[:, None] * d + offs_d[None, :], mat, mask=md[:, None] & md[None, :])
        tl.store(record + d * d + offs_d, vec, mask=md)

    @triton.jit
    def _tile_rows(start, hi, d, head, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        """The tile of a chunk of tokens from ``start`` (the chunk ends at ``hi``): its token indices, their
        mask, the (tokens, lanes) mask and the head's column indices (1, BLOCK_D)."""
        offs_t = start + tl.arange(0, BLOCK_T)
        offs_d = tl.arange(0, BLOCK_D)
        mt = offs_t < hi
        return offs_t, mt, mt[:, None] & (offs_d < d)[None, :], (head * d + offs_d)[None, :]

    @tunable(_TUNED, _FOCUS_KEY, _fitting)
    @triton.jit
    def _key_reduce_kernel(k_ptr, bias_ptr, v_ptr, scale_ptr, stats_ptr, parts_ptr, n, d, H, tokens_per_chunk,
                           inv_n, skb, skt, skc, sbb, sbt, sbc, svb, svt, svc,
                           FOCUS: tl.constexpr, INT_FOCUS: tl.constexpr, KERNEL_EPS: tl.constexpr,
                           BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BIAS: tl.constexpr):
        pid, b, head, chunk, offs_d, md = _head(H, d, BLOCK_D)
        acc_kv = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
        acc_m = tl.zeros((BLOCK_D,), dtype=tl.float32)
        lo = chunk * tokens_per_chunk
        hi = tl.minimum(lo + tokens_per_chunk, n)  # a chunk's tail tile stops at its end, whatever BLOCK_T
        for start in range(lo, hi, BLOCK_T):
            offs_t, _, m2, cols = _tile_rows(start, hi, d, head, BLOCK_T, BLOCK_D)
            _, _, y, _ = _features(k_ptr, scale_ptr, stats_ptr, b, head, offs_t, n, hi, d, skb, skt, skc,
                                   FOCUS, INT_FOCUS, KERNEL_EPS, BLOCK_D, bias_ptr, sbb, sbt, sbc, BIAS)
            vv = tl.load(v_ptr + b * svb + offs_t[:, None] * svt + cols * svc, mask=m2, other=0.0).to(tl.float32)
            acc_kv = tl.dot(tl.trans(y), vv, acc_kv, input_precision='ieee')
            acc_m += tl.sum(y, axis=0)
        _store_head_summary(parts_ptr, pid * tl.num_programs(1) + chunk, acc_kv * inv_n, acc_m * inv_n, d, offs_d, md)

    @tunable(_TUNED, _FOCUS_KEY, _fitting)
    @triton.jit
    def _query_kernel(q_ptr, scale_ptr, stats_ptr, summary_ptr, out_ptr, N, d, H, eps,
                      sqb, sqt, sqc, sob, sot, soc,
                      FOCUS: tl.constexpr, INT_FOCUS: tl.constexpr, KERNEL_EPS: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        pid, b, head, block, offs_d, md = _head(H, d, BLOCK_D)
        kv, m = _load_head_summary(summary_ptr, pid, d, offs_d, md)
        offs_t = block * BLOCK_T + tl.arange(0, BLOCK_T)
        _, _, y, _ = _features(q_ptr, scale_ptr, stats_ptr, b, head, offs_t, N, N, d, sqb, sqt, sqc,
                               FOCUS, INT_FOCUS, KERNEL_EPS, BLOCK_D, q_ptr, 0, 0, 0, False)
        num = tl.dot(y, kv, input_precision='ieee')
        den = tl.sum(y * m[None, :], axis=1) + eps
        out = num / den[:, None]
        m2 = (offs_t < N)[:, None] & md[None, :]
        tl.store(out_ptr + b * sob + offs_t[:, None] * sot + (head * d + offs_d)[None, :] * soc,
                 out.to(out_ptr.dtype.element_ty), mask=m2)

    @tunable(_TUNED, _FOCUS_KEY + ['REDUCE', 'WRITE_DX', 'LOCAL_G'], _fitting)
    @triton.jit(do_not_specialize=['ds_records'])  # varies with the input size: one compilation for all
    def _query_backward_kernel(q_ptr, g_ptr, scale_ptr, stats_ptr, summary_ptr, dparts_ptr, dden_ptr, dq_ptr,
                               ds_part_ptr, ds_records, N, d, H, eps, tokens_per_chunk,
                               sqb, sqt, sqc, sgb, sgt, sgc, sdb, sdt, sdc,
                               REDUCE: tl.constexpr, WRITE_DX: tl.constexpr, LOCAL_G: tl.constexpr,
                               FOCUS: tl.constexpr, INT_FOCUS: tl.constexpr, KERNEL_EPS: tl.constexpr,
                               BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        """REDUCE: the partial dKV, dM of the chunk (and dden per token and head unless LOCAL_G);
        WRITE_DX: dq and the chunk's part of dL/dscale (G from dden of this head if LOCAL_G, else from
        dden_ptr), record ``chunk`` of the head's ``ds_records``."""
        pid, b, head, chunk, offs_d, md = _head(H, d, BLOCK_D)
        kv, m = _load_head_summary(summary_ptr, pid, d, offs_d, md)
        raw_s, s = _scale(scale_ptr, head * d + offs_d, md)
        acc_dkv = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
        acc_dm = tl.zeros((BLOCK_D,), dtype=tl.float32)
        acc_ds = tl.zeros((BLOCK_D,), dtype=tl.float32)
        lo = chunk * tokens_per_chunk
        hi = tl.minimum(lo + tokens_per_chunk, N)
        for start in range(lo, hi, BLOCK_T):
            offs_t, mt, m2, cols = _tile_rows(start, hi, d, head, BLOCK_T, BLOCK_D)
            x, a, y, inv_r2 = _features(q_ptr, scale_ptr, stats_ptr, b, head, offs_t, N, hi, d, sqb, sqt, sqc,
                                        FOCUS, INT_FOCUS, KERNEL_EPS, BLOCK_D, q_ptr, 0, 0, 0, False)
            g = tl.load(g_ptr + b * sgb + offs_t[:, None] * sgt + cols * sgc, mask=m2, other=0.0).to(tl.float32)
            num = tl.dot(y, kv, input_precision='ieee')
            rden = 1.0 / (tl.sum(y * m[None, :], axis=1) + eps)
            gd = g * rden[:, None]
            dden = -tl.sum(gd * num, axis=1) * rden
            if REDUCE:
                acc_dkv = tl.dot(tl.trans(y), gd, acc_dkv, input_precision='ieee')
                acc_dm += tl.sum(dden[:, None] * y, axis=0)
                if not LOCAL_G:
                    tl.store(dden_ptr + (b * N + offs_t) * H + head, dden, mask=mt)
            if WRITE_DX:
                dy = tl.dot(gd, tl.trans(kv), input_precision='ieee') + dden[:, None] * m[None, :]
                if LOCAL_G:
                    big_g = -eps * dden
                else:
                    big_g = -eps * tl.load(dden_ptr + b * N + offs_t, mask=mt, other=0.0)
                grad_x, grad_a = _feature_backward(dy, x, a, y, inv_r2, big_g, s, FOCUS)
                tl.store(dq_ptr + b * sdb + offs_t[:, None] * sdt + cols * sdc,
                         grad_x.to(dq_ptr.dtype.element_ty), mask=m2)
                acc_ds += tl.sum(tl.where(m2, grad_a * a, 0.0), axis=0)
        part = pid * tl.num_programs(1) + chunk
        if REDUCE:
            _store_head_summary(dparts_ptr, part, acc_dkv, acc_dm, d, offs_d, md)
        if WRITE_DX:
            _store_scale_gradient(ds_part_ptr + (pid * ds_records + chunk) * d, acc_ds, raw_s, s, offs_d, md)

    @tunable(_TUNED, _FOCUS_KEY + ['WRITE_DV', 'WRITE_DX', 'LOCAL_G'], _fitting_key_backward)
    @triton.jit(do_not_specialize=['ds_records'])  # varies with the input size: one compilation for all
    def _key_backward_kernel(k_ptr, bias_ptr, v_ptr, scale_ptr, stats_ptr, dsummary_ptr, gk_ptr, dk_ptr, dv_ptr,
                             ds_part_ptr, ds_records, n, d, H, tokens_per_chunk, inv_n,
                             skb, skt, skc, sbb, sbt, sbc, svb, svt, svc, sdkb, sdkt, sdkc, sdvb, sdvt, sdvc,
                             WRITE_DV: tl.constexpr, WRITE_DX: tl.constexpr, LOCAL_G: tl.constexpr,
                             FOCUS: tl.constexpr, INT_FOCUS: tl.constexpr, KERNEL_EPS: tl.constexpr,
                             BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BIAS: tl.constexpr):
        """WRITE_DV: dv (and this head's part of G per key unless LOCAL_G); WRITE_DX: dk and the
        chunk's part of dL/dscale (G of this head if LOCAL_G, else summed over the heads in gk_ptr), record
        ``chunk`` of the head's ``ds_records``."""
        pid, b, head, chunk, offs_d, md = _head(H, d, BLOCK_D)
        dkv, dm = _load_head_summary(dsummary_ptr, pid, d, offs_d, md)
        raw_s, s = _scale(scale_ptr, head * d + offs_d, md)
        acc_ds = tl.zeros((BLOCK_D,), dtype=tl.float32)
        lo = chunk * tokens_per_chunk
        hi = tl.minimum(lo + tokens_per_chunk, n)
        for start in range(lo, hi, BLOCK_T):
            offs_t, mt, m2, cols = _tile_rows(start, hi, d, head, BLOCK_T, BLOCK_D)
            x, a, y, inv_r2 = _features(k_ptr, scale_ptr, stats_ptr, b, head, offs_t, n, hi, d, skb, skt, skc,
                                        FOCUS, INT_FOCUS, KERNEL_EPS, BLOCK_D, bias_ptr, sbb, sbt, sbc, BIAS)
            vv = tl.load(v_ptr + b * svb + offs_t[:, None] * svt + cols * svc, mask=m2, other=0.0).to(tl.float32)
            if WRITE_DV:
                dv = tl.dot(y, dkv, input_precision='ieee') * inv_n
                tl.store(dv_ptr + b * sdvb + offs_t[:, None] * sdvt + cols * sdvc,
                         dv.to(dv_ptr.dtype.element_ty), mask=m2)
                if not LOCAL_G:
                    g_head = tl.sum(dv * vv, axis=1) + tl.sum(y * dm[None, :], axis=1) * inv_n
                    tl.store(gk_ptr + (b * n + offs_t) * H + head, g_head, mask=mt)
            if WRITE_DX:
                dy = (tl.dot(vv, tl.trans(dkv), input_precision='ieee') + dm[None, :]) * inv_n
                if LOCAL_G:
                    big_g = tl.sum(dy * y, axis=1)
                else:
                    big_g = tl.load(gk_ptr + b * n + offs_t, mask=mt, other=0.0)
                grad_x, grad_a = _feature_backward(dy, x, a, y, inv_r2, big_g, s, FOCUS)
                tl.store(dk_ptr + b * sdkb + offs_t[:, None] * sdkt + cols * sdkc,
                         grad_x.to(dk_ptr.dtype.element_ty), mask=m2)
                acc_ds += tl.sum(tl.where(m2, grad_a * a, 0.0), axis=0)
        if WRITE_DX:
            _store_scale_gradient(ds_part_ptr + (pid * ds_records + chunk) * d, acc_ds, raw_s, s, offs_d, md)


def _blocks(d):
    """(BLOCK_T, BLOCK_D, num_warps) for head dim d (tl.dot needs every dim >= 16)."""
    block_d = max(16, next_power_of_2(d))
    block_t = 64 if block_d <= 64 else 32
    return block_t, block_d, 4 if block_d <= 64 else 8


# the default configs (BLOCK_T, num_warps) of the query pass and of the backward kernels on a GPU, per head-dim
# block, where they are not _blocks': those spill registers (``tools/check_triton_kernels.py --untuned``)
_GPU_QUERY_DEFAULTS = {64: (32, 8)}
_GPU_BACKWARD_DEFAULTS = {32: (32, 8), 64: (16, 8), 128: (16, 8)}


def _one_head_key_block(block_d, dtype):
    """The longest token block of one head's key backward (dv, dk and G in one program) for keys of ``dtype`` at
    head-dim block ``block_d``, where it is shorter than _blocks': 16 in float32 from 128 on (32-token blocks
    take 177 KiB of shared memory there, more than an A100 gives a block: ``make check-kernels``), else None."""
    return 16 if block_d >= 128 and dtype == torch.float32 else None


# the warps of its default config on a GPU there (_GPU_BACKWARD_DEFAULTS' 8 spill more on an H100)
_GPU_ONE_HEAD_KEY_WARPS = 4


def _defaults(d, device):
    """The default configs (triton_support.launch) of the key reduction, the query pass and the backward
    kernels for head dim d: _blocks' token block and warps, on a GPU the tables' where they have one."""
    block_t, block_d, warps = _blocks(d)
    base = (block_t, warps)
    queries = backward = base
    if kernel_target(device).gpu:
        queries = _GPU_QUERY_DEFAULTS.get(block_d, base)
        backward = _GPU_BACKWARD_DEFAULTS.get(block_d, base)
    return [dict(BLOCK_T=block, num_warps=num_warps) for block, num_warps in (base, queries, backward)]


def _programs_target(device):
    """About how many programs fill the device (a few per SM); a handful under the interpreter."""
    target = kernel_target(device)
    return 4 * target.sm_count if target.gpu else 8


def _chunks(tokens, block_t, rows, device):
    """(chunks, tokens per chunk, a multiple of ``block_t``) splitting ``tokens`` for ``rows`` programs each."""
    tiles = cdiv(tokens, block_t)
    chunks = max(1, min(tiles, cdiv(_programs_target(device), rows)))
    per = cdiv(tiles, chunks)
    return cdiv(tiles, per), per * block_t


def _focus_args(focusing_factor):
    focus = float(focusing_factor)
    if focus.is_integer() and focus >= 1:
        return dict(FOCUS=int(focus), INT_FOCUS=True, KERNEL_EPS=_KERNEL_EPS)
    return dict(FOCUS=focus, INT_FOCUS=False, KERNEL_EPS=_KERNEL_EPS)


def _token_stats(x, scale, focus, bias=None):
    B, T, C = x.shape
    stats = torch.empty((B, T, 2), device=x.device, dtype=torch.float32)
    block_t, block_c = 32, min(128, max(16, next_power_of_2(C)))
    bias_ptr, bias_strides = key_bias_args(bias, x)
    launch(_token_stats_kernel, (B, cdiv(T, block_t)), x, bias_ptr, scale, stats, T, C, *x.stride(),
           *bias_strides, **focus, BLOCK_T=block_t, BLOCK_C=block_c, BIAS=bias is not None, num_warps=4)
    return stats


def _flatten_forward(q, k, v, scale, bias, num_heads, focusing_factor, eps):
    """The forward kernels on q (B, N, C), k, v (B, n, C) of any strides, the raw scale (C, ) in float32 and the
    key bias (:func:`~mmpola.ops.dispatch.key_bias_operand`) or None; returns (the output (B, N, C) in q's dtype,
    what :func:`_flatten_backward` takes)."""
    if focusing_factor <= 0:
        raise ValueError(f'focusing_factor must be positive, got {focusing_factor}')
    B, N, C = q.shape
    n, H = k.shape[1], num_heads
    d = C // H
    focus = _focus_args(focusing_factor)
    block_t, block_d, _ = _blocks(d)
    keys, queries, _ = _defaults(d, q.device)
    stats_q, stats_k = _token_stats(q, scale, focus), _token_stats(k, scale, focus, bias)
    chunks, per = _chunks(n, block_t, B * H, q.device)
    # per key chunk: KV / n (d x d) and M / n (d) as one record, summed over the chunks once
    parts = torch.empty((B * H, chunks, d * d + d), device=q.device, dtype=torch.float32)
    bias_ptr, bias_strides = key_bias_args(bias, k)
    launch(_key_reduce_kernel, (B * H, chunks), k, bias_ptr, v, scale, stats_k, parts, n, d, H, per, 1.0 / n,
           *k.stride(), *bias_strides, *v.stride(), **focus, BLOCK_D=block_d, default=keys, BIAS=bias is not None)
    summary = parts.sum(1)
    out = torch.empty((B, N, C), device=q.device, dtype=q.dtype)
    launch(_query_kernel, lambda meta: (B * H, cdiv(N, meta['BLOCK_T'])), q, scale, stats_q, summary, out,
           N, d, H, eps, *q.stride(), *out.stride(), **focus, BLOCK_D=block_d, default=queries)
    return out, ((q, k, v, scale, stats_q, stats_k, summary, bias), (H, focusing_factor, eps))


def _flatten_backward(saved, options, g, grads=None):
    """(dL/dq, dL/dk, dL/dv, dL/dscale (C, ) in float32, dL/dbias or None) from the output's gradient g (any
    strides) and what :func:`_flatten_forward` returned beside the output; ``grads``: the tensors of q's, k's and
    v's shapes and dtypes, any strides, to write their gradients into."""
    q, k, v, scale, stats_q, stats_k, summary, bias = saved
    H, focusing_factor, eps = options
    B, N, C = q.shape
    n, d = k.shape[1], C // H
    dev, f32 = q.device, torch.float32
    focus = _focus_args(focusing_factor)
    block_t, block_d, _ = _blocks(d)
    blocks = dict(BLOCK_D=block_d, default=_defaults(d, dev)[2])
    one = H == 1

    # queries: dKV, dM (and dden per head), then dq and their part of dL/ds
    chunks, per = _chunks(N, block_t, B * H, dev)
    dparts = torch.empty((B * H, chunks, d * d + d), device=dev, dtype=f32)
    chunks_k, per_k = _chunks(n, block_t, B * H, dev)
    # each head's records of dL/dscale: its query chunks', then its key chunks'
    ds_parts = torch.empty((B, H, chunks + chunks_k, d), device=dev, dtype=f32)
    dden = dq = torch.empty((B, N, C), device=dev, dtype=q.dtype) if grads is None else grads[0]
    if not one:
        dden = torch.empty((B, N, H), device=dev, dtype=f32)
    args = (q, g, scale, stats_q, summary, dparts, dden, dq, ds_parts, chunks + chunks_k, N, d, H, eps, per,
            *q.stride(), *g.stride(), *dq.stride())
    grid = (B * H, chunks)
    if one:
        launch(_query_backward_kernel, grid, *args, REDUCE=True, WRITE_DX=True, LOCAL_G=True, **focus, **blocks)
    else:
        launch(_query_backward_kernel, grid, *args, REDUCE=True, WRITE_DX=False, LOCAL_G=False, **focus, **blocks)
        dden_sum = dden.sum(-1)
        args = args[:6] + (dden_sum,) + args[7:]
        launch(_query_backward_kernel, grid, *args, REDUCE=False, WRITE_DX=True, LOCAL_G=False, **focus, **blocks)
    dsummary = dparts.sum(1)

    # keys: dv (and G per head), then dk and their part of dL/ds
    if grads is None:
        dk = torch.empty((B, n, C), device=dev, dtype=k.dtype)
        dv = torch.empty((B, n, C), device=dev, dtype=v.dtype)
    else:
        dk, dv = grads[1:]
    gk = dk if one else torch.empty((B, n, H), device=dev, dtype=f32)
    bias_ptr, bias_strides = key_bias_args(bias, k)
    args = (k, bias_ptr, v, scale, stats_k, dsummary, gk, dk, dv, ds_parts[:, :, chunks:], chunks + chunks_k, n, d,
            H, per_k, 1.0 / n, *k.stride(), *bias_strides, *v.stride(), *dk.stride(), *dv.stride())
    grid = (B * H, chunks_k)
    keys = dict(blocks, BIAS=bias is not None)
    longest = _one_head_key_block(block_d, k.dtype)
    if one and longest and kernel_target(dev).gpu:  # the interpreter keeps _blocks'
        keys['default'] = dict(BLOCK_T=longest, num_warps=_GPU_ONE_HEAD_KEY_WARPS)
    if one:
        launch(_key_backward_kernel, grid, *args, WRITE_DV=True, WRITE_DX=True, LOCAL_G=True, **focus, **keys)
    else:
        launch(_key_backward_kernel, grid, *args, WRITE_DV=True, WRITE_DX=False, LOCAL_G=False, **focus, **keys)
        args = args[:6] + (gk.sum(-1),) + args[7:]
        launch(_key_backward_kernel, grid, *args, WRITE_DV=False, WRITE_DX=True, LOCAL_G=False, **focus, **keys)
    return dq, dk, dv, ds_parts.sum((0, 2)).reshape(C), None if bias is None else key_bias_gradient(dk, bias)


class _FlattenTriton(torch.autograd.Function):
    """Focused linear attention; forward and backward in the Triton kernels of this module."""

    @staticmethod
    def forward(ctx, q, k, v, scale, bias, num_heads, focusing_factor, eps):
        out, (saved, ctx.options) = _flatten_forward(q, k, v, scale, bias, num_heads, focusing_factor, eps)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return (*_flatten_backward(ctx.saved_tensors, ctx.options, g), None, None, None)


def flatten_attention_triton(q, k, v, scale, num_heads, focusing_factor=3, eps=1e-6, key_bias=None):
    """Same function as :func:`mmpola.ops.flatten.flatten_attention_reference`, in Triton kernels
    (module docstring); float32 inside whatever the inputs' dtype, output in q's dtype. ``key_bias``
    (broadcastable to k, any strides) is added to the keys where the kernels read them, in their dtype:
    the result of ``k + key_bias`` without that tensor (its gradient is k's, summed over the broadcast
    dims)."""
    _check_shapes(q, k, v, scale, num_heads)
    reason = triton_unsupported(q.device, q.dtype, head_dim=q.shape[-1] // num_heads)
    if reason is not None:
        raise AttnImplUnavailable(f"attn_impl='triton' (flatten_attention) cannot run here: {reason}")
    empty = empty_attention('flatten_attention', (q, k, v, scale, key_bias))
    if empty is not None:
        return empty
    raw = scale.float().reshape(-1).contiguous()  # the kernels apply softplus
    key_bias = key_bias_operand('flatten_attention', k, key_bias)
    return apply_function(_FlattenTriton, q, k, v, raw, key_bias, num_heads, focusing_factor, float(eps))


attention_op('flatten').register('triton', flatten_attention_triton, supports=triton_unsupported,
                                 preferred_on=('cuda',), fp32_inside=True, key_bias=True)
