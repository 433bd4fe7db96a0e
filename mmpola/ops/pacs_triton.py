"""PaCS attention (PolaFormer++) in Triton: forward and backward kernels (implementation ``'triton'``).

Same function and calling convention as :func:`mmpola.ops.pacs.pacs_attention_reference` (layout and
feature maps in :mod:`mmpola.ops.pacs`). The kernels load q, k, v (any strides, float32 / float16 /
bfloat16) and cast them to float32 in registers; every sum accumulates in float32 and the products of
the feature maps with the d x d summaries are ``tl.dot``.

Layout inside the kernels. With d the head dim and ``j = d / 2``, the 2d feature channels split into
four groups of j channels by sign s (the ``relu(x)`` half or the ``relu(-x)`` half) and parity p: group
(s, p) holds channels ``s * d + 2 i + p``, which come from input column ``2 i + p``. A rotary pair
(2i, 2i+1) is then the same lane of the groups (s, 0) and (s, 1), so the rotation is element-wise
between two tiles (one angle per pair, as :func:`mmpola.ops.pacs.rope_tables` makes the tables and
the fast path assumes). The value halves (v[..., :j] for the same-sign flow, v[..., j:] for the
opposite-sign flow) are two more j-wide tiles, and the opposite-sign flow is the same-sign one with q's
sign flipped and its own temperatures: one kernel serves both flows (a grid axis).

Passes (B x h heads, token blocks of BLOCK_N, chunks of several blocks; BLOCK_N and the warps are tuned
on the GPU, see ``_config``):

* forward, keys (grid flow x B*h x chunks): k' = exp(a(k)) - 1 and its rotation recomputed per
  block; each program writes its chunk's partial rotated key-value summaries (4 groups x (j, j) for
  its value half) and key sums, divided by N, into one record; one torch ``.sum`` over the chunks gives
  rope(k')^T v / N and mean(k').
* forward, queries (grid flow x B*h x token blocks): the flow's temperatures t = sigmoid(s) from the raw
  logits, its feature map of q, the normaliser against mean(k') (unrotated), the rotated map against the
  summary: that flow's half of the output.
* backward, queries (grid flow x B*h x chunks, two launches): the query maps recomputed in each. The first
  writes per-chunk partial sums of the gradient of the key-value summary; the second, from the summary, the
  gradient of q (through numerator, normaliser, exponent and ReLU split) per flow and per-chunk partial sums
  of the gradients of mean(k') (in the same record as the first's, summed over the chunks) and of the raw
  logits (through the sigmoid, in their channel order; summed over the batch and the chunks). Each holds
  four (j, j) tiles, the summary's gradient or the summary (both at once spill registers at head dims above
  64).
* backward, keys (grid B*h x token blocks, one launch per value half): k' recomputed; that half of v's
  gradient and its part of k's from the summed gradients of the summary (the half's four tiles) and of
  mean(k') (in the first). The first launch writes its part of k's gradient in float32, the second adds it
  (with all eight tiles, one program spills registers at head dims above 64).

The output and the gradients of q, k and v are written in the tokens' layout (B, N, h, d), seen as (B, h, N, d):
the models take q, k and v as head views of their tokens (B, N, C), and merge the output's heads, without a
copy either way.

The rotary tables are read where they are, (N, 2d) of any strides, at the even channels (one angle per
pair). Saved for backward: the inputs, the logits' (1, h, 1, 2d) views, the tables and the summaries
(rope(k')^T v / N and mean(k'), a few (j, j) tiles per head); no (B, h, N, 2d) feature map is stored.
``exp(x) - 1`` is evaluated with a series near 0, where ``exp`` rounds away the small result. float64 inputs
(the interpreter only) are computed in float32.
"""
import functools

import torch

from .dispatch import AttnImplUnavailable, apply_function, attention_op, empty_attention
from .pacs import _check_shapes
from .pola import _sum_to_shape
from .triton_support import cdiv, kernel_target, launch, next_power_of_2, triton_available, triton_unsupported, tunable

if triton_available() is None:
    from .triton_support import batch_and_head, sigmoid_parts

__all__ = ['pacs_attention_triton']

# On GPUs that give a block 99 KiB of shared memory every PaCS kernel has a config that fits up to head dim
# 128 in every dtype (its tiles are half the head dim wide; ``tools/check_triton_kernels.py --ops pacs
# --targets sm_86 sm_89``): wider than the other ops (triton_support.SMALL_SHARED_MEMORY)
_SMALL_SHARED_MEMORY = ((99 * 1024, {'half': 128, 'float32': 128}), )
_unsupported = functools.partial(triton_unsupported, small_shared_memory=_SMALL_SHARED_MEMORY)

if triton_available() is None:
    import triton
    import triton.language as tl

    # what the kernels are tuned over on a GPU (triton_support.tunable): tokens a block and warps; at head
    # dim 128 (BLOCK_J = 64) 16 tokens in one stage, what fits the backward's tiles in an A100's shared
    # memory (32 tokens in three stages take 242 KiB there). The token chunks of the reductions are
    # multiples of the largest block, whatever the config
    _TUNED = [triton.Config({'BLOCK_N': block}, num_warps=warps) for block in (16, 32, 64) for warps in (4, 8)]
    _TUNED += [triton.Config({'BLOCK_N': 16}, num_warps=warps, num_stages=1) for warps in (4, 8)]
    _TUNED_KEY = ['BLOCK_J', 'PRECISION']

    def _fitting(configs, named_args, **kwargs):
        """The configs of a head dim: one stage at BLOCK_J = 64, Triton's default stages below."""
        return [config for config in configs if (config.num_stages == 1) == (kwargs['BLOCK_J'] >= 64)]

    def _fitting_bwd_queries(configs, named_args, **kwargs):
        """:func:`_fitting`, without 64-token blocks from BLOCK_J = 32 on for the queries' backward: the tiles
        of its second pass take 184 KiB of shared memory there in three stages in float32 (more than an A100
        gives a block) and spill registers (``make check-kernels`` shows both)."""
        return [config for config in _fitting(configs, named_args, **kwargs)
                if kwargs['BLOCK_J'] < 32 or config.kwargs['BLOCK_N'] < 64]

    @triton.jit
    def _expm1_pos(x):
        """exp(x) - 1 for x >= 0: a series below 0.25 (relative error < 1e-9), exp(x) - 1 above."""
        series = x * (1.0 + x * (0.5 + x * (0.16666666666666666 + x * (0.041666666666666664 + x * (
            0.008333333333333333 + x * (0.001388888888888889 + x * 0.0001984126984126984))))))
        return tl.where(x < 0.25, series, tl.exp(x) - 1.0)

    @triton.jit
    def _tables(sin_ptr, cos_ptr, rows, lanes, mask, s_tn, s_tc, J):
        """sin, cos of the rotary pairs of the token rows, read from the (N, 2d) tables at the pairs' even
        channels (one angle per pair): those of the relu(x) groups (channels ``2 lanes``), then those of
        the relu(-x) groups (channels ``2 (J + lanes)``)."""
        ptr = rows[:, None] * s_tn + (2 * lanes)[None, :] * s_tc
        return (tl.load(sin_ptr + ptr, mask=mask, other=0.0).to(tl.float32),
                tl.load(cos_ptr + ptr, mask=mask, other=0.0).to(tl.float32),
                tl.load(sin_ptr + ptr + 2 * J * s_tc, mask=mask, other=0.0).to(tl.float32),
                tl.load(cos_ptr + ptr + 2 * J * s_tc, mask=mask, other=0.0).to(tl.float32))

    @triton.jit
    def _rotate(f_pe, f_po, f_ne, f_no, sin_p, cos_p, sin_n, cos_n):
        """The four groups of a feature map rotated pair-wise (even, odd lanes of one angle)."""
        return (f_pe * cos_p - f_po * sin_p, f_po * cos_p + f_pe * sin_p,
                f_ne * cos_n - f_no * sin_n, f_no * cos_n + f_ne * sin_n)

    @triton.jit
    def _dot4(a_pe, a_po, a_ne, a_no, b_pe, b_po, b_ne, b_no, PRECISION: tl.constexpr):
        """Sum over the four groups of a_g @ b_g (accumulated in that order)."""
        acc = tl.dot(a_pe, b_pe, input_precision=PRECISION)
        acc = tl.dot(a_po, b_po, acc, input_precision=PRECISION)
        acc = tl.dot(a_ne, b_ne, acc, input_precision=PRECISION)
        return tl.dot(a_no, b_no, acc, input_precision=PRECISION)

    @triton.jit
    def _head(H, J, AXIS: tl.constexpr, BLOCK_J: tl.constexpr):
        """The program's head (grid axis AXIS: batch * head), its batch and head, and the pair lanes with
        their mask."""
        bh = tl.program_id(AXIS)
        b, head = batch_and_head(bh, H)
        lanes = tl.arange(0, BLOCK_J)
        return bh, b, head, lanes, lanes < J

    @triton.jit
    def _means(mean, lanes, BLOCK_J: tl.constexpr):
        """The four groups of mean(k') stored from ``mean`` on, as (1, BLOCK_J) rows."""
        mean += lanes
        return (tl.load(mean)[None, :], tl.load(mean + BLOCK_J)[None, :], tl.load(mean + 2 * BLOCK_J)[None, :],
                tl.load(mean + 3 * BLOCK_J)[None, :])

    @triton.jit
    def _temperature(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c, channel, mask):
        """(sigmoid, its derivative) of the flow's logit at ``channel`` of the head (s1 for flow 0, else s2)."""
        s1 = tl.load(s1_ptr + head * s1h + channel * s1c, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(s2_ptr + head * s2h + channel * s2c, mask=mask, other=0.0).to(tl.float32)
        return sigmoid_parts(tl.where(flow == 0, s1, s2))

    @triton.jit
    def _temperatures(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c, lanes, lane_mask, D):
        """The flow's temperatures t = sigmoid(s) from its raw logits (``s1`` for the same-sign flow 0,
        ``s2`` for flow 1; rows of 2d channels per head), and dt/ds = t (1 - t), each as its four groups
        (s, p) of BLOCK_J lanes: channels ``s * d + 2 lanes + p``."""
        t_pe, dt_pe = _temperature(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c, 2 * lanes, lane_mask)
        t_po, dt_po = _temperature(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c, 2 * lanes + 1, lane_mask)
        t_ne, dt_ne = _temperature(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c, D + 2 * lanes, lane_mask)
        t_no, dt_no = _temperature(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c, D + 2 * lanes + 1, lane_mask)
        return t_pe, t_po, t_ne, t_no, dt_pe, dt_po, dt_ne, dt_no

    @triton.jit
    def _store_tiles(record, flow, t_pe, t_po, t_ne, t_no, scale, lanes, BLOCK_J: tl.constexpr):
        """A chunk's partial summary tiles, times ``scale``: the flow's four (BLOCK_J, BLOCK_J) tiles, groups
        in order and the two flows' tiles interleaved (4 groups, 2 flows) from ``record`` on."""
        size = BLOCK_J * BLOCK_J
        out = record + flow * size + lanes[:, None] * BLOCK_J + lanes[None, :]
        tl.store(out, t_pe * scale)
        tl.store(out + 2 * size, t_po * scale)
        tl.store(out + 4 * size, t_ne * scale)
        tl.store(out + 6 * size, t_no * scale)

    @triton.jit
    def _store_rows(rows_at, r_pe, r_po, r_ne, r_no, scale, row_mask, lanes, BLOCK_J: tl.constexpr):
        """A chunk's four partial rows, times ``scale`` (groups in order) from ``rows_at`` on, where ``row_mask``."""
        out = rows_at + lanes
        tl.store(out, r_pe * scale, mask=row_mask)
        tl.store(out + BLOCK_J, r_po * scale, mask=row_mask)
        tl.store(out + 2 * BLOCK_J, r_ne * scale, mask=row_mask)
        tl.store(out + 3 * BLOCK_J, r_no * scale, mask=row_mask)

    @triton.jit
    def _load_pairs(base, rows, lanes, mask, s_n, s_d):
        """Columns 2i and 2i+1 of a (N, d) tile as two (BLOCK_N, BLOCK_J) float32 tiles."""
        ptr = base + rows[:, None].to(tl.int64) * s_n + (2 * lanes)[None, :] * s_d
        return (tl.load(ptr, mask=mask, other=0.0).to(tl.float32),
                tl.load(ptr + s_d, mask=mask, other=0.0).to(tl.float32))

    @triton.jit
    def _spiky(x_even, x_odd, t_pe, t_po, t_ne, t_no):
        """a(x) = [relu(x) || relu(-x)] and exp(a(x) t) - 1 with the temperatures t, each as its four groups
        (s, p)."""
        a_pe = tl.maximum(x_even, 0.0)
        a_po = tl.maximum(x_odd, 0.0)
        a_ne = tl.maximum(-x_even, 0.0)
        a_no = tl.maximum(-x_odd, 0.0)
        return (a_pe, a_po, a_ne, a_no,
                _expm1_pos(a_pe * t_pe), _expm1_pos(a_po * t_po), _expm1_pos(a_ne * t_ne), _expm1_pos(a_no * t_no))

    @triton.jit
    def _keys(k_ptr, rows, lanes, mask, s_n, s_d):
        """Key columns (even, odd) and the four groups of k' = exp(a(k)) - 1."""
        k_e, k_o = _load_pairs(k_ptr, rows, lanes, mask, s_n, s_d)
        return (k_e, k_o, _expm1_pos(tl.maximum(k_e, 0.0)), _expm1_pos(tl.maximum(k_o, 0.0)),
                _expm1_pos(tl.maximum(-k_e, 0.0)), _expm1_pos(tl.maximum(-k_o, 0.0)))

    @triton.jit
    def _tile(ptr, lanes, BLOCK_J: tl.constexpr):
        """A (BLOCK_J, BLOCK_J) float32 summary tile stored row-major."""
        return tl.load(ptr + lanes[:, None] * BLOCK_J + lanes[None, :])

    @tunable(_TUNED, _TUNED_KEY, _fitting)
    @triton.jit
    def _pacs_fwd_keys_kernel(k_ptr, v_ptr, sin_ptr, cos_ptr, parts_ptr,
                              H, N, J, tokens_per_chunk, inv_n,
                              skb, skh, skn, skd, svb, svh, svn, svd, s_tn, s_tc,
                              BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr, PRECISION: tl.constexpr):
        flow = tl.program_id(0)
        bh, b, head, lanes, lane_mask = _head(H, J, 1, BLOCK_J)
        chunk = tl.program_id(2)
        chunks = tl.num_programs(2)
        k_base = k_ptr + b * skb + head * skh
        v_base = v_ptr + b * svb + head * svh + flow * J * svd
        kv_pe = tl.zeros((BLOCK_J, BLOCK_J), tl.float32)
        kv_po = tl.zeros((BLOCK_J, BLOCK_J), tl.float32)
        kv_ne = tl.zeros((BLOCK_J, BLOCK_J), tl.float32)
        kv_no = tl.zeros((BLOCK_J, BLOCK_J), tl.float32)
        sum_pe = tl.zeros((BLOCK_J,), tl.float32)
        sum_po = tl.zeros((BLOCK_J,), tl.float32)
        sum_ne = tl.zeros((BLOCK_J,), tl.float32)
        sum_no = tl.zeros((BLOCK_J,), tl.float32)
        lo = chunk * tokens_per_chunk
        hi = tl.minimum(lo + tokens_per_chunk, N)  # a chunk's tail block stops at its end, whatever BLOCK_N
        for start in range(lo, hi, BLOCK_N):
            rows = start + tl.arange(0, BLOCK_N)
            mask = (rows < hi)[:, None] & lane_mask[None, :]
            k_e, k_o, f_pe, f_po, f_ne, f_no = _keys(k_base, rows, lanes, mask, skn, skd)
            v = tl.load(v_base + rows[:, None].to(tl.int64) * svn + lanes[None, :] * svd, mask=mask,
                        other=0.0).to(tl.float32)
            sin_p, cos_p, sin_n, cos_n = _tables(sin_ptr, cos_ptr, rows, lanes, mask, s_tn, s_tc, J)
            r_pe, r_po, r_ne, r_no = _rotate(f_pe, f_po, f_ne, f_no, sin_p, cos_p, sin_n, cos_n)
            kv_pe = tl.dot(tl.trans(r_pe), v, kv_pe, input_precision=PRECISION)
            kv_po = tl.dot(tl.trans(r_po), v, kv_po, input_precision=PRECISION)
            kv_ne = tl.dot(tl.trans(r_ne), v, kv_ne, input_precision=PRECISION)
            kv_no = tl.dot(tl.trans(r_no), v, kv_no, input_precision=PRECISION)
            sum_pe += tl.sum(f_pe, axis=0)
            sum_po += tl.sum(f_po, axis=0)
            sum_ne += tl.sum(f_ne, axis=0)
            sum_no += tl.sum(f_no, axis=0)
        # this chunk's record (_fwd_record): its parts of rope(k')^T v / N and of mean(k') (written by flow 0)
        size = BLOCK_J * BLOCK_J
        record = parts_ptr + (bh * chunks + chunk) * (8 * size + 4 * BLOCK_J)
        _store_tiles(record, flow, kv_pe, kv_po, kv_ne, kv_no, inv_n, lanes, BLOCK_J)
        _store_rows(record + 8 * size, sum_pe, sum_po, sum_ne, sum_no, inv_n, (lanes < BLOCK_J) & (flow == 0), lanes,
                    BLOCK_J)

    @tunable(_TUNED, _TUNED_KEY, _fitting)
    @triton.jit
    def _pacs_fwd_queries_kernel(q_ptr, s1_ptr, s2_ptr, sin_ptr, cos_ptr, sums_ptr, out_ptr, eps,
                                 H, N, J,
                                 sqb, sqh, sqn, sqd, sob, soh, son, sod, s1h, s1c, s2h, s2c, s_tn, s_tc,
                                 BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr, PRECISION: tl.constexpr):
        flow = tl.program_id(0)
        bh, b, head, lanes, lane_mask = _head(H, J, 1, BLOCK_J)
        rows = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows < N)[:, None] & lane_mask[None, :]
        sign = 1.0 - 2.0 * flow  # the opposite-sign flow is the same-sign one of -q
        q_e, q_o = _load_pairs(q_ptr + b * sqb + head * sqh, rows, lanes, mask, sqn, sqd)
        t_pe, t_po, t_ne, t_no, _, _, _, _ = _temperatures(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c, lanes,
                                                           lane_mask, 2 * J)
        _, _, _, _, f_pe, f_po, f_ne, f_no = _spiky(q_e * sign, q_o * sign, t_pe, t_po, t_ne, t_no)
        size = BLOCK_J * BLOCK_J
        record = sums_ptr + bh * (8 * size + 4 * BLOCK_J)
        m_pe, m_po, m_ne, m_no = _means(record + 8 * size, lanes, BLOCK_J)
        z = tl.sum(f_pe * m_pe + f_po * m_po + f_ne * m_ne + f_no * m_no, axis=1)
        sin_p, cos_p, sin_n, cos_n = _tables(sin_ptr, cos_ptr, rows, lanes, mask, s_tn, s_tc, J)
        r_pe, r_po, r_ne, r_no = _rotate(f_pe, f_po, f_ne, f_no, sin_p, cos_p, sin_n, cos_n)
        kv = record + flow * size
        u = _dot4(r_pe, r_po, r_ne, r_no, _tile(kv, lanes, BLOCK_J), _tile(kv + 2 * size, lanes, BLOCK_J),
                  _tile(kv + 4 * size, lanes, BLOCK_J), _tile(kv + 6 * size, lanes, BLOCK_J), PRECISION)
        out = u * (1.0 / (z + eps))[:, None]
        ptr = out_ptr + b * sob + head * soh + rows[:, None].to(tl.int64) * son + (flow * J + lanes[None, :]) * sod
        tl.store(ptr, out.to(out_ptr.dtype.element_ty), mask=mask)

    @tunable(_TUNED, _TUNED_KEY + ['PART'], _fitting_bwd_queries)
    @triton.jit
    def _pacs_bwd_queries_kernel(q_ptr, g_ptr, s1_ptr, s2_ptr, sin_ptr, cos_ptr, sums_ptr, eps, inv_n,
                                 gq_ptr, parts_ptr, gs_ptr,
                                 H, N, J, tokens_per_chunk,
                                 sqb, sqh, sqn, sqd, sgb, sgh, sgn, sgd, s1h, s1c, s2h, s2c, s_tn, s_tc,
                                 PART: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr,
                                 PRECISION: tl.constexpr):
        flow = tl.program_id(0)
        bh, b, head, lanes, lane_mask = _head(H, J, 1, BLOCK_J)
        chunk = tl.program_id(2)
        chunks = tl.num_programs(2)
        sign = 1.0 - 2.0 * flow
        q_base = q_ptr + b * sqb + head * sqh
        g_base = g_ptr + b * sgb + head * sgh + flow * J * sgd
        t_pe, t_po, t_ne, t_no, _, _, _, _ = _temperatures(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c, lanes,
                                                           lane_mask, 2 * J)
        size = BLOCK_J * BLOCK_J
        record = sums_ptr + bh * (8 * size + 4 * BLOCK_J)
        kv = record + flow * size
        m_pe, m_po, m_ne, m_no = _means(record + 8 * size, lanes, BLOCK_J)
        gkv_pe = tl.zeros((BLOCK_J, BLOCK_J), tl.float32)
        gkv_po = tl.zeros((BLOCK_J, BLOCK_J), tl.float32)
        gkv_ne = tl.zeros((BLOCK_J, BLOCK_J), tl.float32)
        gkv_no = tl.zeros((BLOCK_J, BLOCK_J), tl.float32)
        gm_pe = tl.zeros((BLOCK_J,), tl.float32)
        gm_po = tl.zeros((BLOCK_J,), tl.float32)
        gm_ne = tl.zeros((BLOCK_J,), tl.float32)
        gm_no = tl.zeros((BLOCK_J,), tl.float32)
        gt_pe = tl.zeros((BLOCK_J,), tl.float32)
        gt_po = tl.zeros((BLOCK_J,), tl.float32)
        gt_ne = tl.zeros((BLOCK_J,), tl.float32)
        gt_no = tl.zeros((BLOCK_J,), tl.float32)
        lo = chunk * tokens_per_chunk
        hi = tl.minimum(lo + tokens_per_chunk, N)  # a chunk's tail block stops at its end, whatever BLOCK_N
        for start in range(lo, hi, BLOCK_N):
            rows = start + tl.arange(0, BLOCK_N)
            mask = (rows < hi)[:, None] & lane_mask[None, :]
            q_e, q_o = _load_pairs(q_base, rows, lanes, mask, sqn, sqd)
            q_e = q_e * sign
            q_o = q_o * sign
            a_pe, a_po, a_ne, a_no, f_pe, f_po, f_ne, f_no = _spiky(q_e, q_o, t_pe, t_po, t_ne, t_no)
            sin_p, cos_p, sin_n, cos_n = _tables(sin_ptr, cos_ptr, rows, lanes, mask, s_tn, s_tc, J)
            r_pe, r_po, r_ne, r_no = _rotate(f_pe, f_po, f_ne, f_no, sin_p, cos_p, sin_n, cos_n)
            rz = 1.0 / (tl.sum(f_pe * m_pe + f_po * m_po + f_ne * m_ne + f_no * m_no, axis=1) + eps)
            g = tl.load(g_base + rows[:, None].to(tl.int64) * sgn + lanes[None, :] * sgd, mask=mask,
                        other=0.0).to(tl.float32)
            # out = u / (z + eps): du = g / (z + eps), dz = -(g . u) / (z + eps)^2
            gu = g * rz[:, None]
            if PART == 0:  # the gradient of the summary (the rotated map's product with du)
                gkv_pe = tl.dot(tl.trans(r_pe), gu, gkv_pe, input_precision=PRECISION)
                gkv_po = tl.dot(tl.trans(r_po), gu, gkv_po, input_precision=PRECISION)
                gkv_ne = tl.dot(tl.trans(r_ne), gu, gkv_ne, input_precision=PRECISION)
                gkv_no = tl.dot(tl.trans(r_no), gu, gkv_no, input_precision=PRECISION)
            else:  # the rest, from the summary itself
                kv_pe = _tile(kv, lanes, BLOCK_J)
                kv_po = _tile(kv + 2 * size, lanes, BLOCK_J)
                kv_ne = _tile(kv + 4 * size, lanes, BLOCK_J)
                kv_no = _tile(kv + 6 * size, lanes, BLOCK_J)
                u = _dot4(r_pe, r_po, r_ne, r_no, kv_pe, kv_po, kv_ne, kv_no, PRECISION)
                gz = (-tl.sum(g * u, axis=1) * rz * rz)[:, None]
                gm_pe += tl.sum(gz * f_pe, axis=0)
                gm_po += tl.sum(gz * f_po, axis=0)
                gm_ne += tl.sum(gz * f_ne, axis=0)
                gm_no += tl.sum(gz * f_no, axis=0)
                # gradient of the rotated map, rotated back (transposed rotation), plus the normaliser's
                gr_pe = tl.dot(gu, tl.trans(kv_pe), input_precision=PRECISION)
                gr_po = tl.dot(gu, tl.trans(kv_po), input_precision=PRECISION)
                gr_ne = tl.dot(gu, tl.trans(kv_ne), input_precision=PRECISION)
                gr_no = tl.dot(gu, tl.trans(kv_no), input_precision=PRECISION)
                # through exp(a t) - 1: d/da = (f + 1) t, d/dt = (f + 1) a
                ga_pe = (gr_pe * cos_p + gr_po * sin_p + gz * m_pe) * (f_pe + 1.0)
                ga_po = (gr_po * cos_p - gr_pe * sin_p + gz * m_po) * (f_po + 1.0)
                ga_ne = (gr_ne * cos_n + gr_no * sin_n + gz * m_ne) * (f_ne + 1.0)
                ga_no = (gr_no * cos_n - gr_ne * sin_n + gz * m_no) * (f_no + 1.0)
                gt_pe += tl.sum(ga_pe * a_pe, axis=0)
                gt_po += tl.sum(ga_po * a_po, axis=0)
                gt_ne += tl.sum(ga_ne * a_ne, axis=0)
                gt_no += tl.sum(ga_no * a_no, axis=0)
                # a = [relu(sign q) || relu(-sign q)]; zero gradient at q = 0 as autograd's relu
                gq_e = sign * (tl.where(q_e > 0, ga_pe * t_pe, 0.0) - tl.where(q_e < 0, ga_ne * t_ne, 0.0))
                gq_o = sign * (tl.where(q_o > 0, ga_po * t_po, 0.0) - tl.where(q_o < 0, ga_no * t_no, 0.0))
                # gq: (2 flows, B*h, N, d) float32, summed over the flows outside
                ptr = gq_ptr + (flow * tl.num_programs(1) + bh).to(tl.int64) * N * 2 * J + rows[:, None] * 2 * J \
                    + 2 * lanes[None, :]
                tl.store(ptr, gq_e, mask=mask)
                tl.store(ptr + 1, gq_o, mask=mask)
        # this chunk's record (_bwd_record): its parts of the gradients of rope(k')^T v / N (PART 0) and of
        # mean(k') (PART 1; the rows of both flows)
        record = parts_ptr + (bh * chunks + chunk) * (8 * size + 8 * BLOCK_J)
        if PART == 0:
            _store_tiles(record, flow, gkv_pe, gkv_po, gkv_ne, gkv_no, inv_n, lanes, BLOCK_J)
        else:
            _store_rows(record + 8 * size + flow * 4 * BLOCK_J, gm_pe, gm_po, gm_ne, gm_no, inv_n, lanes < BLOCK_J,
                        lanes, BLOCK_J)
            # the raw logits' gradients (through the sigmoid), in their channel order s * d + 2 i + p:
            # (2 flows, B*h, chunks, 2d), summed over the batch and the chunks outside
            _, _, _, _, dt_pe, dt_po, dt_ne, dt_no = _temperatures(s1_ptr, s2_ptr, flow, head, s1h, s1c, s2h, s2c,
                                                                   lanes, lane_mask, 2 * J)
            out = gs_ptr + ((flow * tl.num_programs(1) + bh) * chunks + chunk) * 4 * J + 2 * lanes
            tl.store(out, gt_pe * dt_pe, mask=lane_mask)
            tl.store(out + 1, gt_po * dt_po, mask=lane_mask)
            tl.store(out + 2 * J, gt_ne * dt_ne, mask=lane_mask)
            tl.store(out + 2 * J + 1, gt_no * dt_no, mask=lane_mask)

    @tunable(_TUNED, _TUNED_KEY + ['HALF'], _fitting)
    @triton.jit
    def _pacs_bwd_keys_kernel(k_ptr, v_ptr, sin_ptr, cos_ptr, sums_ptr, part_ptr, gk_ptr, gv_ptr,
                              H, N, J,
                              skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgn, sgd, s_tn, s_tc,
                              HALF: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr,
                              PRECISION: tl.constexpr):
        bh, b, head, lanes, lane_mask = _head(H, J, 0, BLOCK_J)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows < N)[:, None] & lane_mask[None, :]
        # gk's part: contiguous (B, h, N, d); gk and gv (one layout) through their strides
        out = bh.to(tl.int64) * N * 2 * J + rows[:, None] * 2 * J
        grads = b.to(tl.int64) * sgb + head * sgh + rows[:, None].to(tl.int64) * sgn
        k_e, k_o, f_pe, f_po, f_ne, f_no = _keys(k_ptr + b * skb + head * skh, rows, lanes, mask, skn, skd)
        v = tl.load(v_ptr + b * svb + head * svh + rows[:, None].to(tl.int64) * svn + (HALF * J + lanes[None, :]) * svd,
                    mask=mask, other=0.0).to(tl.float32)
        sin_p, cos_p, sin_n, cos_n = _tables(sin_ptr, cos_ptr, rows, lanes, mask, s_tn, s_tc, J)
        r_pe, r_po, r_ne, r_no = _rotate(f_pe, f_po, f_ne, f_no, sin_p, cos_p, sin_n, cos_n)
        size = BLOCK_J * BLOCK_J
        gkv = sums_ptr + bh * (8 * size + 8 * BLOCK_J)  # the chunks' records summed (_bwd_record)
        # this value half's tiles: group g's at (2 g + HALF) tiles
        gkv_pe = _tile(gkv + HALF * size, lanes, BLOCK_J)
        gkv_po = _tile(gkv + (2 + HALF) * size, lanes, BLOCK_J)
        gkv_ne = _tile(gkv + (4 + HALF) * size, lanes, BLOCK_J)
        gkv_no = _tile(gkv + (6 + HALF) * size, lanes, BLOCK_J)
        gv = _dot4(r_pe, r_po, r_ne, r_no, gkv_pe, gkv_po, gkv_ne, gkv_no, PRECISION)
        gr_pe = tl.dot(v, tl.trans(gkv_pe), input_precision=PRECISION)
        gr_po = tl.dot(v, tl.trans(gkv_po), input_precision=PRECISION)
        gr_ne = tl.dot(v, tl.trans(gkv_ne), input_precision=PRECISION)
        gr_no = tl.dot(v, tl.trans(gkv_no), input_precision=PRECISION)
        ga_pe = gr_pe * cos_p + gr_po * sin_p
        ga_po = gr_po * cos_p - gr_pe * sin_p
        ga_ne = gr_ne * cos_n + gr_no * sin_n
        ga_no = gr_no * cos_n - gr_ne * sin_n
        if HALF == 0:  # the gradient of mean(k'), both flows' parts, in the first half's pass
            gm_pe, gm_po, gm_ne, gm_no = _means(gkv + 8 * size, lanes, BLOCK_J)
            gm1_pe, gm1_po, gm1_ne, gm1_no = _means(gkv + 8 * size + 4 * BLOCK_J, lanes, BLOCK_J)
            ga_pe += gm_pe + gm1_pe
            ga_po += gm_po + gm1_po
            ga_ne += gm_ne + gm1_ne
            ga_no += gm_no + gm1_no
        ga_pe = ga_pe * (f_pe + 1.0)
        ga_po = ga_po * (f_po + 1.0)
        ga_ne = ga_ne * (f_ne + 1.0)
        ga_no = ga_no * (f_no + 1.0)
        gk_e = tl.where(k_e > 0, ga_pe, 0.0) - tl.where(k_e < 0, ga_ne, 0.0)
        gk_o = tl.where(k_o > 0, ga_po, 0.0) - tl.where(k_o < 0, ga_no, 0.0)
        part = part_ptr + out + 2 * lanes[None, :]
        if HALF == 0:  # k's gradient through the first value half, in float32
            tl.store(part, gk_e, mask=mask)
            tl.store(part + 1, gk_o, mask=mask)
        else:  # plus the second half's: k's gradient, in k's dtype
            gk_e += tl.load(part, mask=mask, other=0.0)
            gk_o += tl.load(part + 1, mask=mask, other=0.0)
            ptr = gk_ptr + grads + 2 * lanes[None, :] * sgd
            tl.store(ptr, gk_e.to(gk_ptr.dtype.element_ty), mask=mask)
            tl.store(ptr + sgd, gk_o.to(gk_ptr.dtype.element_ty), mask=mask)
        tl.store(gv_ptr + grads + (HALF * J + lanes[None, :]) * sgd, gv.to(gv_ptr.dtype.element_ty), mask=mask)


def _config(d, device):
    """(BLOCK_J, dot precision, the forward's and the backward's default configs, the token granule of the
    chunks) for head dim d.

    The default configs (BLOCK_N, num_warps) run where no timing chooses (the interpreter, deterministic
    mode; triton_support.launch); on a GPU the kernels are tuned over ``_TUNED``. The chunks of the token
    reductions are multiples of the granule: on a GPU the largest block that can run (in the interpreter a
    smaller one: a block stops at its chunk's end)."""
    block_j = max(16, next_power_of_2(d // 2))
    if not kernel_target(device).gpu:
        # the interpreter: chunks of a small granule (several at the tests' sizes) and 64-token blocks, which
        # stop at a chunk's end (masked tails); its time goes per program and per operation, and the op's tests
        # run every tuned config, the 16-token blocks among them
        default = dict(BLOCK_N=64, num_warps=4)
        return block_j, 'ieee', default, default, 16
    # fp32 products in full precision (the test's 1e-5). The forward keeps its tiles in registers with 32
    # tokens a block; the backward kernels hold more tiles and spill with 32 from head dim 32 on, 16 tokens
    # and 8 warps do not (``tools/check_triton_kernels.py --untuned``); at head dim 128, 16 tokens in one
    # stage (shared memory)
    if block_j <= 32:
        forward, backward = dict(BLOCK_N=32, num_warps=4), dict(BLOCK_N=16, num_warps=8)
    else:
        forward = backward = dict(BLOCK_N=16, num_warps=8, num_stages=1)
    granule = max(config.kwargs['BLOCK_N'] for config in _fitting(_TUNED, None, BLOCK_J=block_j))
    return block_j, 'ieee', forward, backward, granule


def _chunks(heads, tokens, granule, device):
    """(number of chunks, tokens per chunk, a multiple of ``granule``) of a token reduction: enough
    programs to fill the GPU."""
    target = kernel_target(device)
    target = 2 * target.sm_count if target.gpu else 2
    units = cdiv(tokens, granule)
    chunks = max(1, min(units, cdiv(target, heads)))
    per_chunk = cdiv(units, chunks)
    return cdiv(units, per_chunk), per_chunk * granule


def _logits(s_same, s_opp, heads, d):
    """Both spikiness logits as (1, h, 1, 2d) views, no copy (the kernels read them through their head and
    channel strides and apply the sigmoid themselves), or a clear error for a shape the kernels cannot take."""
    try:
        return [torch.broadcast_to(s, (1, heads, 1, 2 * d)) for s in (s_same, s_opp)]
    except RuntimeError:
        raise ValueError(f'pacs_attention (triton) takes spikiness logits broadcastable to (1, h, 1, 2d) = '
                         f'(1, {heads}, 1, {2 * d}) (one per head and channel); got s_same {tuple(s_same.shape)}, '
                         f"s_opp {tuple(s_opp.shape)}; use impl='fast' for per-sample logits") from None


def _logit_strides(s1, s2):
    """The head and channel strides of both (1, h, 1, 2d) logit views (0 along a broadcast axis)."""
    return s1.stride(1), s1.stride(3), s2.stride(1), s2.stride(3)


def _fwd_record(block_j):
    """Floats of a forward chunk record: rope(k')^T v / N as (4 groups, 2 flows) tiles, then mean(k') as 4 rows."""
    return 8 * block_j * block_j + 4 * block_j


def _bwd_record(block_j):
    """Floats of a backward chunk record: the gradients of the forward record's tiles, then of mean(k') per
    flow (2 x 4 rows)."""
    return 8 * block_j * block_j + 8 * block_j


def _tokens_layout(shape, device, dtype):
    """An empty (B, h, N, d) tensor of ``shape`` in the tokens' layout, the (B, h, N, d) view of (B, N, h, d) (as
    Pola's kernels write their output), in one operator."""
    B, H, N, d = shape
    return torch.empty_strided((B, H, N, d), (N * H * d, d, H * d, 1), device=device, dtype=dtype)


def _pacs_forward(q, k, v, s_same, s_opp, sin, cos, eps):
    """The forward kernels on q, k, v (B, h, N, d) of any strides: (the output (B, h, N, d), a view of the tokens'
    layout (B, N, h, d), in q's dtype; what :func:`_pacs_backward` takes)."""
    batch, heads, n, d = q.shape
    j = d // 2
    bh = batch * heads
    dev = q.device
    block_j, precision, default, _, granule = _config(d, dev)
    meta = dict(BLOCK_J=block_j, PRECISION=precision, default=default)
    s1, s2 = _logits(s_same, s_opp, heads, d)
    if sin.stride() != cos.stride():
        sin, cos = sin.contiguous(), cos.contiguous()
    chunks, per_chunk = _chunks(bh, n, granule, dev)
    parts = torch.empty(bh, chunks, _fwd_record(block_j), device=dev, dtype=torch.float32)
    launch(
        _pacs_fwd_keys_kernel, (2, bh, chunks), k, v, sin, cos, parts, heads, n, j, per_chunk, 1.0 / n,
        *k.stride(), *v.stride(), *sin.stride(), **meta)
    sums = parts.sum(1)
    # in the tokens' layout (B, N, h, d), seen as (B, h, N, d): the model merges the heads with a view
    out = _tokens_layout(q.shape, dev, q.dtype)
    launch(
        _pacs_fwd_queries_kernel, lambda meta: (2, bh, cdiv(n, meta['BLOCK_N'])), q, s1, s2, sin, cos,
        sums, out, eps, heads, n, j, *q.stride(), *out.stride(), *_logit_strides(s1, s2), *sin.stride(), **meta)
    return out, ((q, k, v, s1, s2, sin, cos, sums), (eps, (s_same.shape, s_opp.shape)))


def _pacs_backward(saved, state, grad_out, grads=None):
    """(dL/dq, dL/dk, dL/dv, dL/ds_same, dL/ds_opp) from the output's gradient (any strides) and what
    :func:`_pacs_forward` returned beside the output; q's, k's and v's in the tokens' layout (``grads``: tensors of
    their shapes, any strides, to write them into instead), the logits' in their shapes and dtypes."""
    q, k, v, s1, s2, sin, cos, sums = saved
    eps, logit_shapes = state
    batch, heads, n, d = q.shape
    j = d // 2
    bh = batch * heads
    dev = q.device
    block_j, precision, _, default, granule = _config(d, dev)
    meta = dict(BLOCK_J=block_j, PRECISION=precision, default=default)
    chunks, per_chunk = _chunks(bh, n, granule, dev)
    f32 = dict(device=dev, dtype=torch.float32)
    grad_q_parts = torch.empty(2, batch, heads, n, d, **f32)
    parts = torch.empty(bh, chunks, _bwd_record(block_j), **f32)
    grad_s = torch.empty(2, batch, heads, chunks, 2 * d, **f32)
    # two passes over the queries, each with four (BLOCK_J, BLOCK_J) tiles: the gradient of the summary
    # (PART 0), then q's and the logits' gradients and that of mean(k') from the summary (PART 1)
    for part in (0, 1):
        launch(
            _pacs_bwd_queries_kernel, (2, bh, chunks), q, grad_out, s1, s2, sin, cos, sums, eps, 1.0 / n,
            grad_q_parts, parts, grad_s, heads, n, j, per_chunk, *q.stride(), *grad_out.stride(),
            *_logit_strides(s1, s2), *sin.stride(), PART=part, **meta)
    grad_sums = parts.sum(1)
    # the gradients in the tokens' layout (B, N, h, d), seen as (B, h, N, d), as the output: the gradients of the
    # models' head views of their tokens (B, N, C), which autograd takes to the tokens without a copy
    if grads is None:
        grads = (_tokens_layout(q.shape, dev, q.dtype), _tokens_layout(k.shape, dev, k.dtype),
                 _tokens_layout(v.shape, dev, v.dtype))
    # one kernel, in float32, written in q's dtype (the keys' backward could add them too, but at head dims
    # above 64 its registers spill far more then)
    grad_q, grad_k, grad_v = grads
    torch.add(*grad_q_parts, out=grad_q)
    # one pass per value half (each holds that half's four summary-gradient tiles), the first writing its
    # part of k's gradient in float32 for the second to add: a buffer of its own, so that every launch can
    # run again (the tuning times it several times)
    grad_k_part = torch.empty(k.shape, **f32)
    for half in (0, 1):
        launch(
            _pacs_bwd_keys_kernel, lambda meta: (bh, cdiv(n, meta['BLOCK_N'])), k, v, sin, cos,
            grad_sums, grad_k_part, grad_k, grad_v, heads, n, j, *k.stride(), *v.stride(), *grad_k.stride(),
            *sin.stride(),
            HALF=half, **meta)
    grad_s = grad_s.sum((1, 3))  # (2, h, 2d), contiguous
    grads_s = [_sum_to_shape(g.view(1, heads, 1, 2 * d), shape).to(s.dtype)
               for g, shape, s in zip(grad_s, logit_shapes, (s1, s2))]
    return grad_q, grad_k, grad_v, grads_s[0], grads_s[1]


class _PaCSTriton(torch.autograd.Function):
    """The kernels' autograd (:func:`_pacs_forward`, :func:`_pacs_backward`). The logits reach the kernels as they
    are (the sigmoid and its derivative are computed there) and the rotary tables too (read at the even channels);
    each pass's per-chunk partial sums, already divided by N, are summed by one ``.sum`` over the chunks. So the
    only torch kernels around the six launches are one in the forward (that sum) and three in the backward (that
    sum, the sum of the logits' gradients over the batch and the chunks, and that of the two flows' parts of q's
    gradient)."""

    @staticmethod
    def forward(ctx, q, k, v, s_same, s_opp, sin, cos, eps):
        out, (saved, ctx.state) = _pacs_forward(q, k, v, s_same, s_opp, sin, cos, eps)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        return (*_pacs_backward(ctx.saved_tensors, ctx.state, grad_out), None, None, None)


def pacs_attention_triton(q, k, v, s_same, s_opp, sin, cos, eps=1e-6):
    """Same function as :func:`mmpola.ops.pacs.pacs_attention_reference`, computed by Triton kernels
    (forward and backward; the plan is in this module's docstring).

    Shapes as in :mod:`mmpola.ops.pacs`; the tables must pair channels (2i, 2i+1) on one angle, as
    :func:`mmpola.ops.pacs.rope_tables` makes them. q, k, v: CUDA tensors of float32, float16 or
    bfloat16 (any strides), computed in float32 and returned in q's dtype.
    """
    _check_shapes(q, k, v, sin, cos)
    reason = _unsupported(q.device, q.dtype, head_dim=q.shape[-1])
    if reason is not None:
        raise AttnImplUnavailable(f"attn_impl='triton' (pacs_attention) cannot run here: {reason}")
    empty = empty_attention('pacs_attention', (q, k, v, s_same, s_opp))
    if empty is not None:
        return empty
    return apply_function(_PaCSTriton, q, k, v, s_same, s_opp, sin, cos, eps)


attention_op('pacs').register('triton', pacs_attention_triton, supports=_unsupported, preferred_on=('cuda',),
                              fp32_inside=True)
