"""Focused linear attention core (FLatten Transformer, ICCV 2023).

Plain functions; no module state.

Shapes:
    q: (B, N, C) queries after the projection (all heads, before the head split)
    k: (B, n, C) keys (positional encoding already added)
    v: (B, n, C) values
    scale: (1, 1, C) raw temperature logit; s = softplus(scale)
    num_heads: h (d = C / h)
Returns (B, N, C) (heads merged back, as the official module does before its depthwise-conv term).

The focusing feature map works on all C channels at once (its norms are over C, across heads)::

    a = (relu(x) + 1e-6) / s,   phi(x) = a**f * ||a|| / ||a**f||      (f: focusing factor)
    out = phi(q) (phi(k)^T v / n) / (phi(q) mean(phi(k))^T + 1e-6)    per head

Implementations (``impl=``; mmpola.ops.dispatch, each takes ``(q, k, v, scale, num_heads,
focusing_factor, eps)``):

* ``'reference'``, :func:`flatten_attention_reference`, follows the official op order.
* ``'fast'`` (the default), :func:`flatten_attention_fast`, computes the same function with a fused
  feature map whose backward is written by hand (it saves the input and the feature map only) and ONE
  query product per head for the numerator and the normaliser together, on column slices of the
  (B, N, C) tensors.
* ``'triton'`` (what ``'auto'`` picks on CUDA), :func:`mmpola.ops.flatten_triton.flatten_attention_triton`:
  forward and backward in fused Triton kernels that recompute the feature maps instead of storing them.
"""
import torch
import torch.nn.functional as F

from .dispatch import attention_op, run_attention_op

__all__ = ['flatten_attention', 'flatten_attention_reference', 'flatten_attention_fast', 'focused_feature_map']

_KERNEL_EPS = 1e-6  # relu(x) + 1e-6 in the official kernel function


@torch.compiler.assume_constant_result
def _kernel_eps():
    """``_KERNEL_EPS``, a constant for torch.compile: with ``dynamic=True`` a module's float becomes a symbol, which
    the graph of an autograd Function's forward cannot take from its second call on."""
    return _KERNEL_EPS


def flatten_attention_reference(q, k, v, scale, num_heads, focusing_factor=3, eps=1e-6):
    """The official op order."""
    B, N, C = q.shape
    n = k.shape[1]
    scale = F.softplus(scale)
    q = F.relu(q) + _KERNEL_EPS
    k = F.relu(k) + _KERNEL_EPS
    q = q / scale
    k = k / scale
    q_norm = q.norm(dim=-1, keepdim=True)
    k_norm = k.norm(dim=-1, keepdim=True)
    q = q ** focusing_factor
    k = k ** focusing_factor
    q = (q / q.norm(dim=-1, keepdim=True)) * q_norm
    k = (k / k.norm(dim=-1, keepdim=True)) * k_norm
    q = q.reshape(B, N, num_heads, -1).permute(0, 2, 1, 3)
    k = k.reshape(B, n, num_heads, -1).permute(0, 2, 1, 3)
    v = v.reshape(B, n, num_heads, -1).permute(0, 2, 1, 3)
    z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + eps)
    kv = (k.transpose(-2, -1) * (n ** -0.5)) @ (v * (n ** -0.5))
    x = q @ kv * z
    return x.transpose(1, 2).reshape(B, N, C)


def _focused_forward(x, s, f, keep_a):
    """(a, y) of the feature map; with ``keep_a=False`` a is overwritten by y (no second tensor)."""
    a = F.relu(x).add_(_kernel_eps()).div_(s)
    r = torch.linalg.vector_norm(a, dim=-1, keepdim=True)
    if keep_a:
        # y is saved for the backward, so it is scaled out of place: where an autograd Function's forward scaled
        # it in place, torch 2.11's torch.compile saved the unscaled tensor (wrong gradients)
        y = a.pow(f)
        return a, y * (r / torch.linalg.vector_norm(y, dim=-1, keepdim=True))
    y = a.pow_(f)
    return a, y.mul_(r / torch.linalg.vector_norm(y, dim=-1, keepdim=True))


class _FocusedFeatureMap(torch.autograd.Function):
    """y = a**f * ||a|| / ||a**f||, a = (relu(x) + 1e-6) / s, norms over the last dim.

    Backward (g = dL/dy, r = ||a|| = ||y||, G = sum(g * y) per token):
        dL/da = f * (y / a) * (g - G * y / r**2) + G * a / r**2
        dL/dx = dL/da / s  where x > 0 (relu), else 0
        dL/ds = -sum(dL/da * a) / s   (over the dims s is broadcast along)
    a > 0 everywhere (>= 1e-6 / s), so y / a is finite. Saves x (for the relu mask), a and y.
    """

    @staticmethod
    def forward(ctx, x, s, f):
        a, y = _focused_forward(x, s, f, keep_a=True)
        ctx.f = f
        ctx.save_for_backward(x, s, a, y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, s, a, y = ctx.saved_tensors
        f = ctx.f
        big_g = (g.unsqueeze(-2) @ y.unsqueeze(-1)).squeeze(-1)  # (..., 1) = sum(g * y)
        coef = big_g / (y.unsqueeze(-2) @ y.unsqueeze(-1)).squeeze(-1)  # G / r**2 (||y|| = ||a|| = r)
        grad_a = torch.addcmul(g, y, coef, value=-1.0)  # g - G y / r**2
        grad_a.mul_(y).div_(a).mul_(f).addcmul_(a, coef)
        grad_s = None
        if ctx.needs_input_grad[1]:
            lead = grad_a.dim() - s.dim()
            dims = list(range(lead)) + [lead + i for i, size in enumerate(s.shape) if size == 1]
            grad_s = (grad_a * a).sum(dims, keepdim=True).reshape(s.shape).div(s).neg_()
        grad_x = grad_a.div_(s).masked_fill_(x <= 0, 0.0) if ctx.needs_input_grad[0] else None
        return grad_x, grad_s, None


def focused_feature_map(x, s, focusing_factor=3):
    """The FLatten feature map of (..., C) queries or keys; s = softplus(scale) > 0 broadcastable."""
    if s.dtype != x.dtype:
        dtype = torch.promote_types(x.dtype, s.dtype)
        x, s = x.to(dtype), s.to(dtype)
    if not (torch.is_grad_enabled() and (x.requires_grad or s.requires_grad)):
        return _focused_forward(x, s, focusing_factor, keep_a=False)[1]  # inference: nothing saved
    return _FocusedFeatureMap.apply(x, s, focusing_factor)


def _check_shapes(q, k, v, scale, num_heads):
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]:
        raise ValueError('flatten_attention expects q (B, N, C), k and v (B, n, C); got '
                         f'q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}')
    if q.shape[-1] % num_heads:
        raise ValueError(f'channels {q.shape[-1]} are not divisible by num_heads {num_heads}')
    if scale.numel() != q.shape[-1]:
        raise ValueError(f'scale must hold one value per channel ({q.shape[-1]}), got shape {tuple(scale.shape)}')


def flatten_attention_fast(q, k, v, scale, num_heads, focusing_factor=3, eps=1e-6):
    """Same function as :func:`flatten_attention_reference`, fewer passes and less memory
    (matches it to ~1e-6 in fp32; sums are accumulated in another order)."""
    _check_shapes(q, k, v, scale, num_heads)
    B, N, C = q.shape
    n = k.shape[1]
    d = C // num_heads
    s = F.softplus(scale)
    q = focused_feature_map(q, s, focusing_factor)
    k = focused_feature_map(k, s, focusing_factor)
    # the key-value product is a mean over n tokens: divide the small (d, d) result in fp32 / fp64, the
    # (half as wide as q) value operand first in low precision, where the sum could overflow
    wide = v.dtype in (torch.float32, torch.float64)
    if not wide:
        v = v * (1.0 / n)
    k_mean = k.mean(dim=1, keepdim=True)  # (B, 1, C)
    outs = []
    # heads are column slices of the (B, N, C) tensors (strided matmuls; the backward of split is
    # one concatenation), so no large tensor is split into a (B, h, N, d) copy
    for q_h, k_h, v_h, m_h in zip(q.split(d, -1), k.split(d, -1), v.split(d, -1), k_mean.split(d, -1)):
        # W columns: [phi(k)^T v / n | mean(phi(k))^T] -> numerator | normaliser in one product
        kv = k_h.transpose(1, 2) @ v_h
        kv = kv / n if wide else kv
        out = q_h @ torch.cat([kv, m_h.transpose(1, 2)], dim=-1)  # (B, N, d + 1)
        outs.append(out[..., :d] / (out[..., d:] + eps))
    return outs[0] if num_heads == 1 else torch.cat(outs, dim=-1)


def _example_inputs(batch, heads, hw, head_dim, generator):
    """(q, k, v, scale) of an H x W grid and (num_heads, focusing_factor, eps)."""
    shape = (batch, hw[0] * hw[1], heads * head_dim)
    q, k, v = (torch.randn(shape, generator=generator) for _ in range(3))
    return [q, k, v, torch.randn(1, 1, heads * head_dim, generator=generator) * 0.3], (heads, 3, 1e-6)


attention_op('flatten', 'flatten_attention', example_inputs=_example_inputs).register(
    'reference', flatten_attention_reference)
attention_op('flatten').register('fast', flatten_attention_fast, default=True)


def flatten_attention(q, k, v, scale, num_heads, focusing_factor=3, eps=1e-6, fp32=True, impl='auto',
                      key_bias=None):
    """Focused linear attention with an fp32 island under autocast.

    Args:
        q: (B, N, C); k, v: (B, n, C); scale: (1, 1, C) raw logit; num_heads: h.
        focusing_factor: the power f of the feature map (3 in every released model).
        key_bias: None, or a tensor broadcastable to k that is added to k first (the models' key
            positional encoding, (1, n, C)); the Triton implementation adds it where its kernels read the
            keys, so the sum is never a tensor (mmpola.ops.dispatch).
        fp32: compute in float32 with autocast disabled (default), then cast back to q's dtype.
        impl: 'reference' (official op order), 'fast', 'auto' (the default implementation, 'fast') or
            another registered implementation.
    Returns:
        (B, N, C).
    """
    return run_attention_op('flatten', impl, fp32, (q, k, v, scale), num_heads, focusing_factor, eps,
                            key_bias=key_bias)
