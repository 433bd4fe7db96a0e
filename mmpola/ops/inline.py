"""Injective linear attention core (InLine, NeurIPS 2024).

Plain functions; no module state.

Shapes:
    q: (B, N, C) queries, k: (B, n, C) keys, v: (B, n, C) values (identity kernel: the projections
    are used as they are), split into h heads of d = C / h channels
Returns (B, N, C) (heads merged back, as the official module does before its projection)::

    out = q (k^T v) * c / n + (1 - c * q mean(k)^T) * mean(v)      per head, c = d ** -0.5

(each query's attention weights sum to one by construction, and they stay injective.)

* :func:`inline_attention_reference` follows the official op order.
* :func:`inline_attention_fast` folds everything into one (d, d) matrix per head,
  ``M = c k^T v / n - c mean(k)^T mean(v)``, so the output is ONE fused multiply-add over the
  queries, ``out = mean(v) + q M`` (``baddbmm``). With few heads (<= ``BLOCK_DIAG_MAX_HEADS``) the
  heads' matrices form one block-diagonal (C, C) matrix, so q, k, v and the output stay in the
  (B, N, C) layout (no head split / merge copies).
"""
import torch

from .heads import BLOCK_DIAG_MAX_HEADS, block_diagonal_mask

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


def inline_attention_fast(q, k, v, num_heads):
    """Same function as :func:`inline_attention_reference` in one fused pass over the queries
    (matches it to ~1e-6 in fp32; sums are accumulated in another order)."""
    _check_shapes(q, k, v, num_heads)
    B, N, C = q.shape
    n = k.shape[1]
    d = C // num_heads
    scale = d ** -0.5
    v_mean = v.mean(dim=1, keepdim=True)  # (B, 1, C)
    k_mean = k.mean(dim=1, keepdim=True)
    if num_heads <= BLOCK_DIAG_MAX_HEADS:
        m = k.transpose(1, 2) @ (v * (scale / n)) - (k_mean * scale).transpose(1, 2) @ v_mean  # (B, C, C)
        if num_heads > 1:
            m = m * block_diagonal_mask(C, num_heads, q)
        return torch.baddbmm(v_mean, q, m)
    qh, kh, vh = (t.reshape(B, -1, num_heads, d).transpose(1, 2).reshape(B * num_heads, -1, d) for t in (q, k, v))
    vm, km = v_mean.reshape(B * num_heads, 1, d), k_mean.reshape(B * num_heads, 1, d)
    m = kh.transpose(1, 2) @ (vh * (scale / n)) - (km * scale).transpose(1, 2) @ vm  # (B * h, d, d)
    out = torch.baddbmm(vm, qh, m)
    return out.view(B, num_heads, N, d).transpose(1, 2).reshape(B, N, C)


_IMPLS = {'reference': inline_attention_reference, 'fast': inline_attention_fast, 'auto': inline_attention_fast}


def inline_attention(q, k, v, num_heads, fp32=True, impl='auto'):
    """Injective linear attention with an fp32 island under autocast.

    Args:
        q: (B, N, C); k, v: (B, n, C); num_heads: h.
        fp32: compute in float32 with autocast disabled (default), then cast back to q's dtype.
        impl: 'reference' (official op order), 'fast' or 'auto' (currently 'fast').
    Returns:
        (B, N, C).
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be 'auto', 'fast' or 'reference', got {impl!r}")
    fn = _IMPLS[impl]
    if fp32:
        out_dtype = q.dtype
        with torch.autocast(device_type=q.device.type, enabled=False):
            out = fn(q.float(), k.float(), v.float(), num_heads)
        return out.to(out_dtype)
    return fn(q, k, v, num_heads)
