"""Polarity-aware attention with channel-wise spikiness (PaCS; PolaFormer++).

Plain functions on per-head tensors; no module state. Same calling convention as
:mod:`mmpola.ops.pola`, plus the rotary position tables.

Shapes:
    q, k, v: (B, h, N, d) queries, keys, values of an H x W grid (N = H * W), after the projection
    s_same, s_opp: (1, h, 1, 2d) raw per-channel spikiness logits of the same-sign and the
        opposite-sign flow (the official ``s1`` / ``s2``); the temperature is ``sigmoid(s)``
    sin, cos: (N, 2d) rotary tables of the 2d-wide feature maps (:func:`rope_tables`; channels
        ``2i`` and ``2i + 1`` share one angle, the first d channels rotate with the row, the last d
        with the column)
Returns (B, h, N, d): per head, the first d/2 channels are the same-sign flow (values
v[..., :d/2]), the last d/2 the opposite-sign flow (values v[..., d/2:]).

With a = [relu(x) || relu(-x)] (and a' = [relu(-x) || relu(x)]), the feature maps are

    q_sim = exp(a(q) * sigmoid(s_same)) - 1,   q_opp = exp(a'(q) * sigmoid(s_opp)) - 1,
    k' = exp(a(k)) - 1,

and each flow is ``rope(q_f) @ (rope(k')^T v_f / N) / (q_f . mean(k') + eps)``: the rotation acts on
the numerator only; the normaliser uses the unrotated maps, as the official code.

Implementations (``impl=``; mmpola.ops.dispatch, each takes ``(q, k, v, s_same, s_opp, sin, cos, eps)``):

* ``'reference'``, :func:`pacs_attention_reference`, follows the official op order exactly (bit-exact in
  fp32).
* ``'fast'`` (the default), :func:`pacs_attention_fast`, is one autograd Function with a hand-written
  backward: the feature maps are written into preallocated halves (no concatenation), the rotation is one complex
  multiplication (channel pairs share an angle), every flow's numerator and normaliser reuse one
  rotated key-value summary, and only the three feature maps, the output and d x 2d summaries are
  saved for backward (the rotated maps are recomputed there).
"""
import torch

from .dispatch import attention_op, run_attention_op
from .pola import _sum_to_shape

__all__ = ['pacs_attention', 'pacs_attention_reference', 'pacs_attention_fast', 'rope_angles', 'rope_tables',
           'rope_rotate', 'rope_rotate_fast']


# --------------------------------------------------------------------------------------------------
# Rotary position tables (two axes: first half of the channels rotates with the row, second with the
# column)
# --------------------------------------------------------------------------------------------------


def rope_angles(dim, num_heads, base=10000.0):
    """Angles of the official 2-D RoPE for per-head features of width ``dim // num_heads // 2``
    per axis: (dim // num_heads // 2,), each angle repeated for a pair of channels."""
    angle = 1.0 / (base ** torch.linspace(0, 1, dim // num_heads // 4))
    return angle.unsqueeze(-1).repeat(1, 2).flatten()


def rope_tables(angle, hw):
    """(sin, cos), each (H * W, 2 * len(angle)), of an H x W grid in row-major token order.

    The first ``len(angle)`` channels rotate with the row index, the rest with the column index.
    """
    height, width = hw
    # made on the angles' device: a CPU arange copied to a GPU would wait for the GPU at every call
    rows = torch.arange(height, device=angle.device, dtype=angle.dtype)[:, None] * angle[None, :]  # (H, a)
    cols = torch.arange(width, device=angle.device, dtype=angle.dtype)[:, None] * angle[None, :]  # (W, a)
    a = angle.shape[0]

    def table(fn):
        by_row = fn(rows).unsqueeze(1).expand(height, width, a)
        by_col = fn(cols).unsqueeze(0).expand(height, width, a)
        return torch.cat([by_row, by_col], dim=-1).flatten(0, 1)

    return table(torch.sin), table(torch.cos)


def _rotate_every_two(x):
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)


def rope_rotate(x, sin, cos):
    """Rotary position encoding of x (..., N, c) with tables (N, c), in the official op order."""
    return (x * cos) + (_rotate_every_two(x) * sin)


class _RoPERotation(torch.autograd.Function):
    """:func:`rope_rotate` in the forward; the backward by hand: the rotation's transpose on the gradient,
    ``g cos - rotate_every_two(g sin)`` (one stack), where autograd's backward of the official ops fills a
    zero tensor of x's size for each strided slice and sums them."""

    @staticmethod
    def forward(ctx, x, sin, cos):
        ctx.save_for_backward(sin, cos)
        return rope_rotate(x, sin, cos)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        sin, cos = ctx.saved_tensors
        return torch.addcmul(_rotate_every_two(grad * sin).neg_(), grad, cos), None, None


def rope_rotate_fast(x, sin, cos):
    """:func:`rope_rotate` (the same forward) with a hand-written backward for x: fewer, smaller kernels.
    Tables that need a gradient go through :func:`rope_rotate` (autograd)."""
    if sin.requires_grad or cos.requires_grad:
        return rope_rotate(x, sin, cos)
    return _RoPERotation.apply(x, sin, cos)


# --------------------------------------------------------------------------------------------------
# Reference (official op order)
# --------------------------------------------------------------------------------------------------


def pacs_attention_reference(q, k, v, s_same, s_opp, sin, cos, eps=1e-6):
    """The official op order (bit-exact to the official module in fp32)."""
    n = k.shape[-2]
    s1 = torch.sigmoid(s_same)
    s2 = torch.sigmoid(s_opp)
    q_pos = torch.relu(q)
    q_neg = torch.relu(-q)
    k_pos = torch.relu(k)
    k_neg = torch.relu(-k)
    q_sim = torch.exp(torch.cat([q_pos, q_neg], dim=-1) * s1) - 1
    q_opp = torch.exp(torch.cat([q_neg, q_pos], dim=-1) * s2) - 1
    k = torch.cat([k_pos, k_neg], dim=-1)
    v1, v2 = torch.chunk(v, 2, dim=-1)

    k0 = torch.exp(k) - 1
    k = rope_rotate(k0, sin, cos)

    z = q_sim @ k0.mean(dim=-2, keepdim=True).transpose(-2, -1)
    q = rope_rotate(q_sim, sin, cos)
    kv = (k.transpose(-2, -1) * (1 / n) ** 0.5) @ (v1 * (1 / n) ** 0.5)
    x_sim = q @ kv * (1 / (z + eps))

    z = q_opp @ k0.mean(dim=-2, keepdim=True).transpose(-2, -1)
    q = rope_rotate(q_opp, sin, cos)
    kv = (k.transpose(-2, -1) * (1 / n) ** 0.5) @ (v2 * (1 / n) ** 0.5)
    x_opp = q @ kv * (1 / (z + eps))
    return torch.cat([x_sim, x_opp], dim=-1)


# --------------------------------------------------------------------------------------------------
# Fast path
# --------------------------------------------------------------------------------------------------


def _rotation(sin, cos, dtype):
    """(N, c) tables -> (N, c/2) complex e^{i theta}, one entry per channel pair."""
    return torch.complex(cos[..., ::2].to(dtype), sin[..., ::2].to(dtype))


def _rotate(x, rotation, inplace=False):
    """RoPE as a complex product: channel pairs (2i, 2i+1) are the complex numbers x_2i + i x_2i+1.
    x: contiguous (..., N, c) real; rotation (N, c/2) complex. ``rotation.conj()`` undoes it."""
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
    if inplace:
        pairs.mul_(rotation)
        return x
    return torch.view_as_real(pairs * rotation).flatten(-2)


def _spiky_map(x, t_first, t_second, out):
    """out = [exp(relu(x) * t_first) - 1 || exp(relu(-x) * t_second) - 1]; x (..., d), out (..., 2d)."""
    d = x.shape[-1]
    if torch.compiler.is_compiling():  # torch.compile takes no out= of a strided half: the halves joined
        first, second = x.clamp(min=0), x.clamp(max=0).neg_()
        if t_first is not None:
            first, second = first * t_first, second * t_second
        return torch.cat((first, second), -1).expm1_()
    first, second = out[..., :d], out[..., d:]
    torch.clamp(x, min=0, out=first)
    torch.clamp(x, max=0, out=second).neg_()
    if t_first is not None:
        first.mul_(t_first)
        second.mul_(t_second)
    return out.expm1_()


def _relu_grad(x, grad_pos, grad_neg):
    """Gradient w.r.t. x of relu(x) (gradient grad_pos) and relu(-x) (gradient grad_neg); 0 at x = 0
    as autograd's relu."""
    return torch.where(x > 0, grad_pos, grad_neg).mul_(torch.sign(x))


class _PaCSAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, s_same, s_opp, rotation, eps):
        d = q.shape[-1]
        half = d // 2
        n = k.shape[-2]
        t_same, t_opp = torch.sigmoid(s_same), torch.sigmoid(s_opp)
        feature_shape = (*q.shape[:-1], 2 * d)
        q_sim = _spiky_map(q, t_same[..., :d], t_same[..., d:], q.new_empty(feature_shape))
        # the opposite-sign map in the same-sign channel order: [exp(relu(q) s_opp,2) - 1 || ...];
        # the official q_opp is it with halves swapped, so it multiplies row-swapped summaries
        q_opp = _spiky_map(q, t_opp[..., d:], t_opp[..., :d], q.new_empty(feature_shape))
        k_feat = _spiky_map(k, None, None, k.new_empty(*k.shape[:-1], 2 * d))
        k_mean = k_feat.mean(dim=-2, keepdim=True)  # (B, h, 1, 2d)

        kv = _rotate(k_feat, rotation).transpose(-2, -1) @ v  # (B, h, 2d, d)
        kv.div_(n)
        kv_same = kv[..., :half]
        # q_opp in the same-sign order pairs with the rotated keys' rows in swapped order, whose
        # rotation is the swapped table: the same-sign-ordered map is rotated with the swapped rotation
        kv_opp = torch.cat([kv[..., d:, half:], kv[..., :d, half:]], dim=-2)
        mean_swapped = torch.cat([k_mean[..., d:], k_mean[..., :d]], dim=-1)
        rotation_swapped = torch.cat([rotation[:, half:], rotation[:, :half]], dim=-1)

        r_same = (q_sim @ k_mean.transpose(-2, -1)).add_(eps).reciprocal_()  # (B, h, N, 1)
        r_opp = (q_opp @ mean_swapped.transpose(-2, -1)).add_(eps).reciprocal_()
        if torch.compiler.is_compiling():  # as in _spiky_map
            out = torch.cat(((_rotate(q_sim, rotation) @ kv_same) * r_same,
                             (_rotate(q_opp, rotation_swapped) @ kv_opp) * r_opp), -1)
        else:
            out = q.new_empty(q.shape)
            torch.mul(_rotate(q_sim, rotation) @ kv_same, r_same, out=out[..., :half])
            torch.mul(_rotate(q_opp, rotation_swapped) @ kv_opp, r_opp, out=out[..., half:])
        ctx.save_for_backward(q, k, v, t_same, t_opp, rotation, q_sim, q_opp, k_feat, k_mean, kv, r_same,
                              r_opp, out)
        ctx.shapes = (s_same.shape, s_opp.shape)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        (q, k, v, t_same, t_opp, rotation, q_sim, q_opp, k_feat, k_mean, kv, r_same, r_opp,
         out) = ctx.saved_tensors
        d = q.shape[-1]
        half = d // 2
        n = k.shape[-2]
        grad_out = grad_out.contiguous()
        rotation_swapped = torch.cat([rotation[:, half:], rotation[:, :half]], dim=-1)
        kv_opp = torch.cat([kv[..., d:, half:], kv[..., :d, half:]], dim=-2)
        mean_swapped = torch.cat([k_mean[..., d:], k_mean[..., :d]], dim=-1)

        grad_kv = torch.empty_like(kv)
        grad_mean = torch.zeros_like(k_mean)
        grads_t = []
        for idx, (feat, rot, kv_f, mean_f, r, t) in enumerate((
                (q_sim, rotation, kv[..., :half], k_mean, r_same, t_same),
                (q_opp, rotation_swapped, kv_opp, mean_swapped, r_opp, t_opp))):
            sl = slice(0, half) if idx == 0 else slice(half, d)
            g, o = grad_out[..., sl], out[..., sl]
            # out = u * r, r = 1 / (z + eps): dz = -(g . out) * r, du = g * r
            grad_z = (g * o).sum(-1, keepdim=True).mul_(r).neg_()  # (B, h, N, 1)
            grad_u = g * r
            grad_kv_f = _rotate(feat, rot).transpose(-2, -1) @ grad_u  # (B, h, 2d, half)
            if idx == 0:
                grad_kv[..., :half] = grad_kv_f
                grad_mean += feat.transpose(-2, -1).matmul(grad_z).transpose(-2, -1)
            else:
                grad_kv[..., d:, half:] = grad_kv_f[..., :d, :]
                grad_kv[..., :d, half:] = grad_kv_f[..., d:, :]
                grad_m = feat.transpose(-2, -1).matmul(grad_z).transpose(-2, -1)
                grad_mean[..., :d] += grad_m[..., d:]
                grad_mean[..., d:] += grad_m[..., :d]
            grad_feat = _rotate(grad_u @ kv_f.transpose(-2, -1), rot.conj(), inplace=True)
            grad_feat.addcmul_(grad_z, mean_f)
            # through exp(a t) - 1: d/da = (feat + 1) t, d/dt = (feat + 1) a
            grad_feat.addcmul_(grad_feat, feat)
            grads_t.append(grad_feat)
        # grads_t[0]: same-sign map [relu(q) t_same,1 | relu(-q) t_same,2];
        # grads_t[1]: opposite-sign map in same-sign order [relu(q) t_opp,2 | relu(-q) t_opp,1]
        g_same, g_opp = grads_t
        q_pos, q_neg = q.clamp(min=0), q.clamp(max=0).neg_()
        grad_t_same = torch.cat([_sum_to_shape(g_same[..., :d] * q_pos, t_same[..., :d].shape),
                                 _sum_to_shape(g_same[..., d:] * q_neg, t_same[..., d:].shape)], dim=-1)
        grad_t_opp = torch.cat([_sum_to_shape(g_opp[..., d:] * q_neg, t_opp[..., :d].shape),
                                _sum_to_shape(g_opp[..., :d] * q_pos, t_opp[..., d:].shape)], dim=-1)
        del q_pos, q_neg
        g_same.mul_(t_same)
        g_opp[..., :d].mul_(t_opp[..., d:])
        g_opp[..., d:].mul_(t_opp[..., :d])
        grad_pos = g_same[..., :d].add_(g_opp[..., :d])
        grad_neg = g_same[..., d:].add_(g_opp[..., d:])
        grad_q = _relu_grad(q, grad_pos, grad_neg)
        del g_same, g_opp, grads_t, grad_pos, grad_neg

        grad_kv.div_(n)
        grad_v = _rotate(k_feat, rotation) @ grad_kv  # (B, h, N, d)
        grad_k_feat = _rotate(v @ grad_kv.transpose(-2, -1), rotation.conj(), inplace=True)
        grad_k_feat.add_(grad_mean, alpha=1.0 / n)
        grad_k_feat.addcmul_(grad_k_feat, k_feat)
        grad_k = _relu_grad(k, grad_k_feat[..., :d], grad_k_feat[..., d:])

        shape_same, shape_opp = ctx.shapes
        grad_s_same = grad_t_same.mul_(t_same * (1 - t_same))
        grad_s_opp = grad_t_opp.mul_(t_opp * (1 - t_opp))
        return (grad_q, grad_k, grad_v, _sum_to_shape(grad_s_same, shape_same),
                _sum_to_shape(grad_s_opp, shape_opp), None, None)


def _check_shapes(q, k, v, sin, cos):
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or q.shape[-1] != v.shape[-1] or k.shape[-2] != v.shape[-2] \
            or q.shape[-2] != k.shape[-2]:
        raise ValueError('pacs_attention expects q, k, v (B, h, N, d) with one token count N and head dim d; '
                         f'got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}')
    if q.shape[-1] % 2:
        raise ValueError(f'pacs_attention splits each head into two value halves, so the head dim must be '
                         f'even; got d={q.shape[-1]} (choose channels / heads even)')
    expected = (q.shape[-2], 2 * q.shape[-1])
    if tuple(sin.shape) != expected or tuple(cos.shape) != expected:
        raise ValueError(f'pacs_attention expects rotary tables of shape (N, 2d) = {expected} (rope_tables of '
                         f'the real grid); got sin {tuple(sin.shape)}, cos {tuple(cos.shape)}')


def pacs_attention_fast(q, k, v, s_same, s_opp, sin, cos, eps=1e-6):
    """Same function as :func:`pacs_attention_reference` with fewer passes and far less memory.

    Shapes as in the module docstring; the tables must pair channels (2i, 2i+1) on one angle, as
    :func:`rope_tables` makes them. Matches the reference to ~1e-6 in fp32 (sums accumulate in
    another order and ``expm1`` replaces ``exp - 1``).
    """
    _check_shapes(q, k, v, sin, cos)
    dtype = torch.promote_types(q.dtype, torch.promote_types(s_same.dtype, s_opp.dtype))
    q, k, v, s_same, s_opp = (t.to(dtype) for t in (q, k, v, s_same, s_opp))
    return _PaCSAttention.apply(q, k, v, s_same, s_opp, _rotation(sin, cos, dtype), eps)


def _example_inputs(batch, heads, hw, head_dim, generator):
    """(q, k, v, s_same, s_opp) of an H x W grid and (sin, cos, eps) of its RoPE tables."""
    n = hw[0] * hw[1]
    tensors = [torch.randn(batch, heads, n, head_dim, generator=generator) for _ in range(3)]
    tensors += [torch.randn(1, heads, 1, 2 * head_dim, generator=generator) for _ in range(2)]
    sin, cos = rope_tables(rope_angles(2 * heads * head_dim, heads), hw)
    return tensors, (sin, cos, 1e-6)


attention_op('pacs', 'pacs_attention', example_inputs=_example_inputs).register(
    'reference', pacs_attention_reference)
attention_op('pacs').register('fast', pacs_attention_fast, default=True)


def pacs_attention(q, k, v, s_same, s_opp, sin, cos, eps=1e-6, fp32=True, impl='auto'):
    """PaCS attention with an fp32 island under autocast.

    Args:
        q, k, v: (B, h, N, d); s_same, s_opp: raw logits (1, h, 1, 2d) or broadcastable; sin, cos:
            (N, 2d) tables of the real grid (:func:`rope_tables`).
        fp32: compute the core in float32 with autocast disabled (default), then cast back to q's
            dtype: the spiky maps are exponentials, whose sums overflow fp16 and lose bf16 precision.
        impl: 'reference' (official op order), 'fast' (one autograd Function, hand-written backward),
            'auto' (the default implementation, 'fast') or another registered implementation.
    Returns:
        (B, h, N, d), in q's dtype when fp32=True.
    """
    return run_attention_op('pacs', impl, fp32, (q, k, v, s_same, s_opp, sin, cos), eps)
