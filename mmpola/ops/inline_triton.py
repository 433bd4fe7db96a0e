"""Injective linear attention core (InLine) in Triton: implementation ``'triton'``, forward and backward.

Same function and signature as :func:`mmpola.ops.inline.inline_attention_reference`: q (B, N, C),
k, v (B, n, C), h heads of d = C / h channels, c = d ** -0.5, per head::

    out = mean(v) + q M,    M = c A / n - c mean(k)^T mean(v),    A = k^T v

Heads are column slices of the (B, N, C) tensors: the kernels take the tensors' strides (views such
as column slices of a fused qkv projection are read in place, never copied) and write the outputs
(B, N, C) contiguous. Every load is cast to float32 in the kernel and every product accumulates in
float32 (``tl.dot``); outputs and gradients are stored in their tensor's dtype. A head is padded to
``BD = max(16, next_power_of_2(d))`` channels with masked loads (zeros), which leave the products
unchanged.

Forward, two passes:

1. key pass, grid (B h, key chunks): each program sums over one chunk of keys the partial ``k^T v``
   (BD, BD) and ``sum k``, ``sum v`` (BD) into float32 buffers; one torch ``.sum`` over the chunks
   (deterministic, no atomics) gives ``A`` and the sums per head;
2. query pass, grid (B h, query chunks): each program builds ``M`` and ``mean(v)`` from ``A`` and
   the sums in registers, then writes ``out = mean(v) + q M`` for its chunk of queries.

Saved for the backward: q, k, v (the inputs, no copies) and ``A`` and the sums (per head, tiny);
``M`` is rebuilt in registers, nothing of size (N, d) is stored. With g = dL/dout, the backward of
:class:`mmpola.ops.inline._InLineCore`:

3. query pass, grid (B h, query chunks): ``dq = g M^T`` for its queries, and the partial ``dM = q^T g``
   and ``sum g`` of its chunk (one read of q and g); one torch ``.sum`` over the chunks;
4. key pass, grid (B h, key chunks): from ``dM`` and the sums, in registers, ``dA = dM c / n``,
   ``d mean(v) = sum g - c mean(k) dM`` and ``d mean(k) = -c mean(v) dM^T``; then
   ``dk = v dA^T + d mean(k) / n`` and ``dv = k dA + d mean(v) / n`` for its keys.

The chunks split the token reductions so that the grid fills the GPU when B h is small (PVT stage 1
at detection resolution has B h = 2 and tens of thousands of tokens). On a GPU the products' input
precision is :func:`~mmpola.ops.triton_support.dot_precision`'s, as in the Pola kernels: float32 inputs
of heads up to 64 channels use ``tf32x3`` (three TF32 tensor-core products, float32 accuracy), wider
ones ``ieee`` (``tf32x3`` needs more shared memory than the GPU has in the key backward); float16 /
bfloat16 inputs use one TF32 product (their values are exact in TF32: only M and dA, made in the
kernels, are rounded to TF32). float64 inputs (CPU interpreter only, for tests) are computed in float32
like the others.
"""
import functools
import math

import torch

from .dispatch import AttnImplUnavailable, apply_function, attention_op, empty_attention
from .inline import _check_shapes
from .triton_support import (
    cdiv,
    dot_precision,
    kernel_target,
    launch,
    next_power_of_2,
    triton_available,
    triton_unsupported,
    tunable,
)

if triton_available() is None:
    from .triton_support import batch_and_head

__all__ = ['inline_attention_triton']

if triton_available() is None:
    import triton
    import triton.language as tl

    # what the kernels are tuned over on a GPU (triton_support.tunable): rows a block and warps, the
    # blocks of at most 64 x 64 elements of a head (wider heads: shorter blocks, for shared memory);
    # the token chunks are multiples of the largest block, whatever the config
    _TUNED = [triton.Config({'BLOCK': block}, num_warps=warps) for block in (32, 64, 128) for warps in (4, 8)]
    _TUNED_KEY = ['BD', 'PRECISION']

    def _fitting(configs, named_args, **kwargs):
        return [config for config in configs if config.kwargs['BLOCK'] * kwargs['BD'] <= 64 * 64]

    @triton.jit
    def _inline_head(H, D, rows, CHUNK, BD: tl.constexpr):
        """The program's head (grid axis 0: batch * head), its chunk (grid axis 1), its batch, the head's
        columns and their mask, and the chunk's rows [lo, hi) of ``rows``."""
        bh = tl.program_id(0)
        chunk = tl.program_id(1)
        b, head = batch_and_head(bh, H)
        lo = chunk * CHUNK
        return bh, chunk, b, head * D + tl.arange(0, BD), tl.arange(0, BD) < D, lo, tl.minimum(lo + CHUNK, rows)

    @triton.jit
    def _load_tile(ptr, b, r, col, mask, sb, sn, sc):
        """Rows ``r`` and columns ``col`` of batch ``b`` of a (B, N, C) tensor of any strides, in float32."""
        return tl.load(ptr + b * sb + r[:, None] * sn + col[None, :] * sc, mask=mask, other=0.).to(tl.float32)

    @triton.jit
    def _store_tile(ptr, value, b, r, col, mask, sb, sn, sc):
        """Store rows ``r`` and columns ``col`` of batch ``b`` of a (B, N, C) tensor of strides (sb, sn, sc)."""
        tl.store(ptr + b * sb + r[:, None] * sn + col[None, :] * sc, value.to(ptr.dtype.element_ty), mask=mask)

    @tunable(_TUNED, _TUNED_KEY, _fitting)
    @triton.jit
    def _inline_kv_kernel(k_ptr, v_ptr, kv_ptr, sums_ptr, n, H, D, CHUNK,
                          skb, skn, skc, svb, svn, svc,
                          BLOCK: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr):
        """Partial k^T v (BD, BD) and sum k, sum v (2, BD) of one chunk of keys of one head."""
        bh, chunk, b, col, cmask, lo, hi = _inline_head(H, D, n, CHUNK, BD)
        rows = tl.arange(0, BLOCK)
        acc = tl.zeros((BD, BD), dtype=tl.float32)
        k_sum = tl.zeros((BD,), dtype=tl.float32)
        v_sum = tl.zeros((BD,), dtype=tl.float32)
        for start in range(lo, hi, BLOCK):
            r = start + rows
            mask = (r < hi)[:, None] & cmask[None, :]
            kt = _load_tile(k_ptr, b, r, col, mask, skb, skn, skc)
            vt = _load_tile(v_ptr, b, r, col, mask, svb, svn, svc)
            acc = tl.dot(tl.trans(kt), vt, acc, input_precision=PRECISION)
            k_sum += tl.sum(kt, axis=0)
            v_sum += tl.sum(vt, axis=0)
        part = bh * tl.num_programs(1) + chunk
        i = tl.arange(0, BD)
        tl.store(kv_ptr + part * BD * BD + i[:, None] * BD + i[None, :], acc)
        tl.store(sums_ptr + part * 2 * BD + i, k_sum)
        tl.store(sums_ptr + part * 2 * BD + BD + i, v_sum)

    @triton.jit
    def _inline_matrix(kv_ptr, sums_ptr, bh, inv_n, scale, BD: tl.constexpr):
        """M = c A / n - c mean(k)^T mean(v) (BD, BD) and mean(v) (BD) of head ``bh``."""
        i = tl.arange(0, BD)
        a = tl.load(kv_ptr + bh * BD * BD + i[:, None] * BD + i[None, :])
        k_mean = tl.load(sums_ptr + bh * 2 * BD + i) * inv_n
        v_mean = tl.load(sums_ptr + bh * 2 * BD + BD + i) * inv_n
        m = (a * inv_n - k_mean[:, None] * v_mean[None, :]) * scale
        return m, v_mean

    @tunable(_TUNED, _TUNED_KEY, _fitting)
    @triton.jit
    def _inline_out_kernel(q_ptr, kv_ptr, sums_ptr, out_ptr, N, H, D, CHUNK, inv_n, scale,
                           sqb, sqn, sqc,
                           BLOCK: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr):
        """out = mean(v) + q M for one chunk of queries of one head (out: (B, N, C) contiguous)."""
        bh, chunk, b, col, cmask, lo, hi = _inline_head(H, D, N, CHUNK, BD)
        rows = tl.arange(0, BLOCK)
        m, v_mean = _inline_matrix(kv_ptr, sums_ptr, bh, inv_n, scale, BD)
        for start in range(lo, hi, BLOCK):
            r = start + rows
            mask = (r < hi)[:, None] & cmask[None, :]
            qt = _load_tile(q_ptr, b, r, col, mask, sqb, sqn, sqc)
            out = tl.dot(qt, m, input_precision=PRECISION) + v_mean[None, :]
            _store_tile(out_ptr, out, b, r, col, mask, N * H * D, H * D, 1)

    @tunable(_TUNED, _TUNED_KEY, _fitting)
    @triton.jit
    def _inline_bwd_query_kernel(q_ptr, g_ptr, kv_ptr, sums_ptr, dq_ptr, dm_ptr, gsum_ptr,
                                 N, H, D, CHUNK, inv_n, scale,
                                 sqb, sqn, sqc, sgb, sgn, sgc, sdqb, sdqn, sdqc,
                                 BLOCK: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr):
        """dq = g M^T for one chunk of queries of one head, and the chunk's partial q^T g and sum g."""
        bh, chunk, b, col, cmask, lo, hi = _inline_head(H, D, N, CHUNK, BD)
        rows = tl.arange(0, BLOCK)
        m, _ = _inline_matrix(kv_ptr, sums_ptr, bh, inv_n, scale, BD)
        m_t = tl.trans(m)
        acc = tl.zeros((BD, BD), dtype=tl.float32)
        g_sum = tl.zeros((BD,), dtype=tl.float32)
        for start in range(lo, hi, BLOCK):
            r = start + rows
            mask = (r < hi)[:, None] & cmask[None, :]
            qt = _load_tile(q_ptr, b, r, col, mask, sqb, sqn, sqc)
            gt = _load_tile(g_ptr, b, r, col, mask, sgb, sgn, sgc)
            dq = tl.dot(gt, m_t, input_precision=PRECISION)
            _store_tile(dq_ptr, dq, b, r, col, mask, sdqb, sdqn, sdqc)
            acc = tl.dot(tl.trans(qt), gt, acc, input_precision=PRECISION)
            g_sum += tl.sum(gt, axis=0)
        part = bh * tl.num_programs(1) + chunk
        i = tl.arange(0, BD)
        tl.store(dm_ptr + part * BD * BD + i[:, None] * BD + i[None, :], acc)
        tl.store(gsum_ptr + part * BD + i, g_sum)

    @tunable(_TUNED, _TUNED_KEY, _fitting)
    @triton.jit
    def _inline_bwd_key_kernel(k_ptr, v_ptr, sums_ptr, dm_ptr, gsum_ptr, dk_ptr, dv_ptr,
                               n, H, D, CHUNK, inv_n, scale,
                               skb, skn, skc, svb, svn, svc, sdkb, sdkn, sdkc, sdvb, sdvn, sdvc,
                               BLOCK: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr):
        """dk = v dA^T + d mean(k) / n and dv = k dA + d mean(v) / n for one chunk of keys of one head."""
        bh, chunk, b, col, cmask, lo, hi = _inline_head(H, D, n, CHUNK, BD)
        rows = tl.arange(0, BLOCK)
        i = tl.arange(0, BD)
        dm = tl.load(dm_ptr + bh * BD * BD + i[:, None] * BD + i[None, :])
        g_sum = tl.load(gsum_ptr + bh * BD + i)
        k_mean = tl.load(sums_ptr + bh * 2 * BD + i) * inv_n
        v_mean = tl.load(sums_ptr + bh * 2 * BD + BD + i) * inv_n
        # d mean(v) / n = (sum g - c mean(k) dM) / n,  d mean(k) / n = -c mean(v) dM^T / n
        dv_mean = (g_sum - scale * tl.sum(k_mean[:, None] * dm, axis=0)) * inv_n
        dk_mean = -scale * inv_n * tl.sum(dm * v_mean[None, :], axis=1)
        da = dm * (scale * inv_n)
        da_t = tl.trans(da)
        for start in range(lo, hi, BLOCK):
            r = start + rows
            mask = (r < hi)[:, None] & cmask[None, :]
            kt = _load_tile(k_ptr, b, r, col, mask, skb, skn, skc)
            vt = _load_tile(v_ptr, b, r, col, mask, svb, svn, svc)
            dk = tl.dot(vt, da_t, input_precision=PRECISION) + dk_mean[None, :]
            dv = tl.dot(kt, da, input_precision=PRECISION) + dv_mean[None, :]
            _store_tile(dk_ptr, dk, b, r, col, mask, sdkb, sdkn, sdkc)
            _store_tile(dv_ptr, dv, b, r, col, mask, sdvb, sdvn, sdvc)


# the default config of a head-dim block on a GPU, where it is not the interpreter's
_GPU_DEFAULTS = {32: dict(BLOCK=64, num_warps=8), 64: dict(BLOCK=32, num_warps=8)}


def _default(bd):
    """The default config of head dim block ``bd`` in the interpreter, and on a GPU where _GPU_DEFAULTS has none."""
    return dict(BLOCK=64 if bd <= 64 else 32, num_warps=4 if bd <= 64 else 8)


@functools.lru_cache(maxsize=None)
def _gpu_choices(dtype, bd):
    """(default config, dot precision, token granule) of the kernels on a GPU for inputs of ``dtype`` at head dim
    block ``bd`` (asked once per pair: each call is Python on the host's side of every attention layer)."""
    # in float32 (three TF32 products) the backward kernels spill registers with 4 warps at head dim 32, and
    # with 64 rows at 64 (``tools/check_triton_kernels.py --untuned``); with half inputs these defaults spill
    # nothing either
    default = _GPU_DEFAULTS.get(bd) or _default(bd)
    granule = max(c.kwargs['BLOCK'] for c in _fitting(_TUNED, None, BD=bd))
    return default, dot_precision(dtype, bd), granule


class _Launch:
    """Head block, chunks, dot precision and default config of one call (same for forward and backward).

    The default config (BLOCK rows, num_warps) runs where no timing chooses (the interpreter,
    deterministic mode; triton_support.launch); on a GPU the kernels are tuned over ``_TUNED``. The
    chunks are multiples of the granule, the largest block that can run (a block stops at its chunk's
    end in any case)."""

    def __init__(self, device, dtype, B, N, n, num_heads, head_dim):
        self.bd = max(16, next_power_of_2(head_dim))
        target = kernel_target(device)
        if target.gpu:
            self.default, self.precision, self.granule = _gpu_choices(dtype, self.bd)
            self.programs = 4 * target.sm_count  # enough programs to fill the GPU with a few waves
        else:  # the interpreter: few programs (each costs Python), but several chunks once N is large
            self.default = _default(self.bd)
            self.programs = 4
            self.precision = 'ieee'
            self.granule = self.default['BLOCK']
        self.split(B, N, n, num_heads)

    def split(self, B, N, n, num_heads):
        """The query and key chunks: (rows per chunk, a multiple of the granule; number of chunks)."""
        chunks = max(1, math.ceil(self.programs / (B * num_heads)))
        self.query = self._split(N, chunks)
        self.key = self._split(n, chunks)

    def _split(self, rows, chunks):
        units = cdiv(rows, self.granule)
        per_chunk = cdiv(units, min(chunks, units)) * self.granule
        return per_chunk, cdiv(rows, per_chunk)

    def kwargs(self):
        """The kernels' compile-time arguments and default config (triton_support.launch)."""
        return dict(BD=self.bd, PRECISION=self.precision, default=self.default)


def _reduce(partials):
    """The sum over the chunks (dim 1) of per-chunk partial sums, without a kernel when there is one."""
    return partials[:, 0] if partials.shape[1] == 1 else partials.sum(dim=1)


def _inline_forward(q, k, v, num_heads):
    """The forward kernels on q (B, N, C), k, v (B, n, C) of any strides: (the output (B, N, C) in q's dtype,
    (the tensors :func:`_inline_backward` reads, its state))."""
    B, N, C = q.shape
    n = k.shape[1]
    d = C // num_heads
    dtype = q.dtype if q.dtype == k.dtype == v.dtype else torch.float32  # mixed inputs: the float32 rule
    plan = _Launch(q.device, dtype, B, N, n, num_heads, d)
    bd, bh = plan.bd, B * num_heads
    common = plan.kwargs()
    key_chunk, key_chunks = plan.key
    kv = q.new_empty(bh, key_chunks, bd, bd, dtype=torch.float32)
    sums = q.new_empty(bh, key_chunks, 2, bd, dtype=torch.float32)
    launch(_inline_kv_kernel, (bh, key_chunks), k, v, kv, sums, n, num_heads, d, key_chunk, *k.stride(),
           *v.stride(), **common)
    kv, sums = _reduce(kv), _reduce(sums)
    out = q.new_empty(B, N, C)
    query_chunk, query_chunks = plan.query
    launch(_inline_out_kernel, (bh, query_chunks), q, kv, sums, out, N, num_heads, d, query_chunk, 1.0 / n,
           d ** -0.5, *q.stride(), **common)
    return out, ((q, k, v, kv, sums), (num_heads, plan))


def _inline_backward(saved, state, g, grads=None):
    """(dL/dq, dL/dk, dL/dv) in the inputs' dtypes, contiguous, from the output's gradient g (any strides) and what
    :func:`_inline_forward` returned beside the output; ``grads``: tensors of q's, k's and v's shapes and dtypes, any
    strides, to write them into instead."""
    q, k, v, kv, sums = saved
    num_heads, plan = state
    B, N, C = q.shape
    n = k.shape[1]
    d = C // num_heads
    bd, bh = plan.bd, B * num_heads
    common = plan.kwargs()
    inv_n, scale = 1.0 / n, d ** -0.5
    query_chunk, query_chunks = plan.query
    grad_q = torch.empty(B, N, C, dtype=q.dtype, device=q.device) if grads is None else grads[0]
    dm = q.new_empty(bh, query_chunks, bd, bd, dtype=torch.float32)
    g_sum = q.new_empty(bh, query_chunks, bd, dtype=torch.float32)
    launch(_inline_bwd_query_kernel, (bh, query_chunks), q, g, kv, sums, grad_q, dm, g_sum, N, num_heads, d,
           query_chunk, inv_n, scale, *q.stride(), *g.stride(), *grad_q.stride(), **common)
    dm, g_sum = _reduce(dm), _reduce(g_sum)
    key_chunk, key_chunks = plan.key
    if grads is None:
        grad_k = torch.empty(B, n, C, dtype=k.dtype, device=k.device)
        grad_v = torch.empty(B, n, C, dtype=v.dtype, device=v.device)
    else:
        grad_k, grad_v = grads[1:]
    launch(_inline_bwd_key_kernel, (bh, key_chunks), k, v, sums, dm, g_sum, grad_k, grad_v, n, num_heads, d,
           key_chunk, inv_n, scale, *k.stride(), *v.stride(), *grad_k.stride(), *grad_v.stride(), **common)
    return grad_q, grad_k, grad_v


class _InLineTriton(torch.autograd.Function):
    """Forward and backward of the InLine core in Triton kernels (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, num_heads):
        out, (saved, ctx.state) = _inline_forward(q, k, v, num_heads)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return (*_inline_backward(ctx.saved_tensors, ctx.state, g), None)


def inline_attention_triton(q, k, v, num_heads):
    """Same function as :func:`mmpola.ops.inline.inline_attention_reference` in Triton kernels (forward and
    backward), computed in float32 whatever the inputs' dtype; the output has q's dtype, each gradient its
    input's dtype."""
    _check_shapes(q, k, v, num_heads)
    reason = triton_unsupported(q.device, q.dtype, head_dim=q.shape[-1] // num_heads)
    if reason is not None:
        raise AttnImplUnavailable(f"attn_impl='triton' (inline_attention) cannot run here: {reason}")
    empty = empty_attention('inline_attention', (q, k, v))
    if empty is not None:
        return empty
    if not (q.device == k.device == v.device):
        raise ValueError(f'inline_attention expects q, k and v on one device, got {q.device}, {k.device}, {v.device}')
    return apply_function(_InLineTriton, q, k, v, num_heads)


attention_op('inline').register('triton', inline_attention_triton, supports=triton_unsupported,
                                preferred_on=('cuda',), fp32_inside=True)
