"""Injective linear attention core (InLine, NeurIPS 2024).

Plain functions; no module state.

Shapes:
    q: (B, N, C) queries, k: (B, n, C) keys, v: (B, n, C) values (identity kernel: the projections
    are used as they are), split into h heads of d = C / h channels
Returns (B, N, C) (heads merged back, as the official module does before its projection)::

    out = q (k^T v) * c / n + (1 - c * q mean(k)^T) * mean(v)      per head, c = d ** -0.5

(each query's attention weights sum to one by construction, and they stay injective.)

Implementations (``impl=``; mmpola.ops.dispatch, each takes ``(q, k, v, num_heads)``):

* ``'reference'``, :func:`inline_attention_reference`, follows the official op order.
* ``'fast'`` (the default), :func:`inline_attention_fast`, folds everything into one (d, d) matrix per head,
  ``M = c k^T v / n - c mean(k)^T mean(v)``, so the output is ONE fused multiply-add over the
  queries, ``out = mean(v) + q M`` (``baddbmm``), with a hand-written backward of three more
  products; heads stay column slices of the (B, N, C) tensors (no head split / merge copies).
"""
import torch

from .dispatch import attention_op, run_attention_op

__all__ = ['inline_attention', 'inline_attention_reference', 'inline_attention_fast']


def inline_attention_reference(q, k, v, num_heads):
    """The official op order."""
    b, N, c = q.shape
    n = k.shape[1]
    head_dim = c // num_heads
    q = q.reshape(b, N, num_heads, head_dim).permute(0, 2, 1, 3)
    k = k.reshape(b, n, num_heads, head_dim).permute(0, 2, 1, 3)
    v = v.reshape(b, n, num_heads, head_dim).permute(0, 2, 1, 3)
    scale = head_dim ** -0.5
    kv = (k.transpose(-2, -1) * (scale / n) ** 0.5) @ (v * (scale / n) ** 0.5)
    x = q @ kv + (1 - q @ k.mean(dim=2, keepdim=True).transpose(-2, -1) * scale) * v.mean(dim=2, keepdim=True)
    return x.transpose(1, 2).reshape(b, N, c)


def _check_shapes(q, k, v, num_heads):
    if q.dim() != 3 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError('inline_attention expects q (B, N, C), k and v (B, n, C); got '
                         f'q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}')
    if q.shape[-1] % num_heads:
        raise ValueError(f'channels {q.shape[-1]} are not divisible by num_heads {num_heads}')


class _InLineCore(torch.autograd.Function):
    """out = mean(v) + q M per head, M = c k^T v / n - c mean(k)^T mean(v), with a hand-written
    backward (g = dL/dout, per head):

        dq = g M^T,   dM = q^T g,   dA = dM * c / n   (A = k^T v)
        d mean(v) = sum_N g - c mean(k) dM,   d mean(k) = -c mean(v) dM^T
        dk = v dA^T + d mean(k) / n,   dv = k dA + d mean(v) / n     (one baddbmm each)

    Heads are column slices of the (B, N, C) tensors, multiplied in place by strided batched
    matmuls: no head split or merge copies. Saves the inputs and the small (d, d) matrices only.
    """

    @staticmethod
    def forward(ctx, q, k, v, num_heads):
        B, N, C = q.shape
        n = k.shape[1]
        d = C // num_heads
        c = d ** -0.5
        v_mean = v.mean(dim=1, keepdim=True)  # (B, 1, C)
        k_mean = k.mean(dim=1, keepdim=True)
        out = q.new_empty(B, N, C) if num_heads > 1 else None
        mats = []
        for sl in _head_slices(num_heads, d):
            m = (k[..., sl].transpose(1, 2) @ v[..., sl]).mul_(c / n)
            m.baddbmm_(k_mean[..., sl].transpose(1, 2), v_mean[..., sl], alpha=-c)
            mats.append(m)
            head_out = torch.baddbmm(v_mean[..., sl], q[..., sl], m)
            if out is None:
                out = head_out
            else:
                out[..., sl] = head_out
        ctx.num_heads = num_heads
        ctx.save_for_backward(q, k, v, k_mean, v_mean, *mats)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        q, k, v, k_mean, v_mean, *mats = ctx.saved_tensors
        num_heads = ctx.num_heads
        B, N, C = q.shape
        n = k.shape[1]
        d = C // num_heads
        c = d ** -0.5
        g_sum = g.sum(dim=1, keepdim=True)  # (B, 1, C)
        single = num_heads == 1
        grad_q = None if single else torch.empty_like(q)
        grad_k = None if single else torch.empty_like(k)
        grad_v = None if single else torch.empty_like(v)
        for sl, m in zip(_head_slices(num_heads, d), mats):
            g_h = g[..., sl]
            grad_m = q[..., sl].transpose(1, 2) @ g_h  # (B, d, d)
            d_vmean = torch.baddbmm(g_sum[..., sl], k_mean[..., sl], grad_m, alpha=-c).div_(n)
            d_kmean = (v_mean[..., sl] @ grad_m.transpose(1, 2)).mul_(-c / n)
            grad_a = grad_m.mul_(c / n)
            heads = (g_h @ m.transpose(1, 2),
                     torch.baddbmm(d_kmean, v[..., sl], grad_a.transpose(1, 2)),
                     torch.baddbmm(d_vmean, k[..., sl], grad_a))
            if single:
                grad_q, grad_k, grad_v = heads
            else:
                grad_q[..., sl], grad_k[..., sl], grad_v[..., sl] = heads
        return grad_q, grad_k, grad_v, None


def _head_slices(num_heads, head_dim):
    return [slice(i * head_dim, (i + 1) * head_dim) for i in range(num_heads)]


def inline_attention_fast(q, k, v, num_heads):
    """Same function as :func:`inline_attention_reference` in one fused pass over the queries
    (matches it to ~1e-6 in fp32; sums are accumulated in another order)."""
    _check_shapes(q, k, v, num_heads)
    return _InLineCore.apply(q, k, v, num_heads)


def _example_inputs(batch, heads, hw, head_dim, generator):
    """(q, k, v) of an H x W grid and (num_heads,)."""
    shape = (batch, hw[0] * hw[1], heads * head_dim)
    return [torch.randn(shape, generator=generator) for _ in range(3)], (heads,)


attention_op('inline', 'inline_attention', example_inputs=_example_inputs).register(
    'reference', inline_attention_reference)
attention_op('inline').register('fast', inline_attention_fast, default=True)


def inline_attention(q, k, v, num_heads, fp32=True, impl='auto'):
    """Injective linear attention with an fp32 island under autocast.

    Args:
        q: (B, N, C); k, v: (B, n, C); num_heads: h.
        fp32: compute in float32 with autocast disabled (default), then cast back to q's dtype.
        impl: 'reference' (official op order), 'fast', 'auto' (the default implementation, 'fast') or
            another registered implementation.
    Returns:
        (B, N, C).
    """
    return run_attention_op('inline', impl, fp32, (q, k, v), num_heads)
