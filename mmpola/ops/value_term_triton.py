"""An attention core and its depthwise value term in one autograd Function, in Triton kernels.

Pola and FLatten attention add to their core's output a depthwise convolution of the values' maps, one map per head,
convolved by kernels the heads share (the attention modules' ``dwc``); InLine attention adds its local residual, a
depthwise convolution of the values' map (all channels, one map per image) by kernels predicted for each image.
Where the core and the convolution both run in their Triton kernels, the modules call them through one autograd
Function: :func:`pola_value_term_triton`, :func:`flatten_value_term_triton` and :func:`inline_value_term_triton`.
They take the operands in the tokens' layout (B, N, C) and make the head views, the parameters' casts, the maps and
the merge of the heads inside, without autograd; the convolution's kernel adds its output to the core's where it
writes it (:func:`mmpola.ops.depthwise_triton.depthwise_conv2d_triton`'s ``residual``), and the backward runs the
convolution's backward kernels and then the core's on the same gradient. The kernels, their arguments and so the
results are those of the two ops called apart, bit for bit; autograd records one node where it recorded two
Functions and the views, transposes, broadcasts and casts around them, each an operator and a node that the host
runs while a GPU waits for it. :func:`value_term_joins` says where the joined Function computes what the ops called
apart compute.
"""
import torch

from .depthwise import auto_impl
from .depthwise_triton import _convolve, _depthwise_backward
from .dispatch import AttnImplUnavailable, apply_function, attention_op, autocast_dtype, autocast_off
from .flatten_triton import _flatten_backward, _flatten_forward
from .inline_triton import _inline_backward, _inline_forward
from .pola_triton import _per_head, _pola_backward, _pola_forward
from .triton_support import triton_unsupported

__all__ = ['heads_view', 'tokens_view', 'value_term_joins', 'pola_value_term_triton', 'flatten_value_term_triton',
           'inline_value_term_triton']


def heads_view(t, heads):
    """(B, N, C) tokens -> the (B, h, N, d) view of their heads (one view operator: inside the Function, where
    autograd does not record it)."""
    (B, N, C), (sb, sn, sc) = t.shape, t.stride()
    d = C // heads
    return t.as_strided((B, heads, N, d), (sb, d * sc, sn, sc))


def tokens_view(t):
    """(B, h, N, d) heads -> (B, N, h * d) tokens: ``t.transpose(1, 2).flatten(2)``, the same sizes and strides
    (those the library's view gives a dim of one element included), in one view operator where the heads are a
    view of tokens (each head's channels after the previous head's) of more than one channel."""
    (B, h, N, d), (sb, sh, sn, sd) = t.shape, t.stride()
    if h * d > 1 and (h == 1 or d == 1 or sh == d * sd):
        channel = sd if d > 1 else sh
        token = sn if N > 1 else h * d * channel
        return t.as_strided((B, N, h * d), (sb if B > 1 else N * token, token, channel))
    return t.transpose(1, 2).flatten(2)


def _maps(t, hw, groups=None):
    """The (B, G, d, H, W) maps of (B, G, H*W, d) heads, or with ``groups`` = G of the G channel groups of
    (B, H*W, G*d) tokens, any strides: :func:`~mmpola.ops.depthwise.heads_as_maps` in one view operator."""
    if groups is not None:
        (B, _, C), (sb, sn, sc) = t.shape, t.stride()
        d = C // groups
        return t.as_strided((B, groups, d, *hw), (sb, d * sc, sc, hw[1] * sn, sn))
    (B, G, _, d), (sb, sg, sn, sd) = t.shape, t.stride()
    return t.as_strided((B, G, d, *hw), (sb, sg, sd, hw[1] * sn, sn))


def _maps_as_tokens(maps):
    """(B, G, d, H, W) maps -> (B, H*W, G*d) tokens: ``tokens_view(maps.permute(0, 1, 3, 4, 2).flatten(2, 3))``, the
    same sizes and strides, in one view operator where the maps are a view of tokens (each group's channels after
    the previous group's, each row's tokens after the previous row's) of more than one token and channel."""
    (B, G, d, H, W), (sb, sg, sd, sh, sw) = maps.shape, maps.stride()
    if H * W > 1 and G * d > 1 and (G == 1 or d == 1 or sg == d * sd) and (H == 1 or W == 1 or sh == W * sw):
        token = sw if W > 1 else sh
        return maps.as_strided((B, H * W, G * d), (sb if B > 1 else H * W * token, token, sd if d > 1 else sg))
    return tokens_view(maps.permute(0, 1, 3, 4, 2).flatten(2, 3))


def value_term_joins(op, attn_impl, fp32, conv_impl, q, k, v, v_term, conv_weight, heads):
    """Whether the joined Function of attention op ``op`` (``'pola'``, ``'flatten'`` or ``'inline'``) computes what
    the two ops called apart compute for these operands (tokens (B, N, C) of h = ``heads`` heads; ``conv_weight``:
    the convolution's shared weight, or InLine's kernels per image): the op with ``impl=attn_impl, fp32=fp32`` and
    the depthwise convolution by ``conv_impl`` (``'auto'``, ``'torch'`` or ``'triton'``) both resolve to their
    Triton kernels, which take the operands as they are (one dtype, with elements: the autocast dtype under
    autocast, where the convolution reads a float32 weight as it is; else the weight's), and the core's kernels do
    not turn the head dim down."""
    if q.numel() == 0 or k.numel() == 0 or len({q.dtype, k.dtype, v.dtype, v_term.dtype}) > 1:
        return False
    device = q.device
    if attention_op(op).choose(attn_impl, device, torch.float32 if fp32 else q.dtype) != 'triton':
        return False
    if conv_impl == 'torch' or conv_impl == 'auto' and auto_impl(v_term) != 'triton':
        return False
    dtype = autocast_dtype(device.type)
    if dtype is None:  # the weight in the values' dtype
        if conv_weight.dtype != v_term.dtype:
            return False
    elif v_term.dtype != dtype or conv_weight.dtype not in (dtype, torch.float32):  # a float32 weight read as it is
        return False
    return triton_unsupported(device, q.dtype, head_dim=q.shape[-1] // heads) is None


def _pola_core(q, k, v, bias, params, heads, options):
    """Pola's forward kernels on the tokens' head views: (the output's heads (B, h, N, d), the tensors its
    backward keeps, and its state: the kernels', the parameters' dtypes and the heads)."""
    scale, power = params
    B, _, C = q.shape
    d = C // heads
    wide = torch.float64 in (q.dtype, k.dtype, v.dtype, None if bias is None else bias.dtype)
    compute = torch.float64 if wide else torch.float32
    s = _per_head(heads_view(scale.to(compute), heads), (B, heads), d, 'scale')
    p = _per_head(power.to(compute), (B, heads), d, 'power')
    out, (saved, config) = _pola_forward(heads_view(q, heads), heads_view(k, heads), heads_view(v, heads), s, p,
                                         None if bias is None else heads_view(bias, heads), *options)
    return out, saved, (config, scale.dtype, power.dtype, heads)


def _pola_core_backward(saved, state, grad, needs):
    """(dq, dk, dv, dbias, (dscale, dpower)) in the tokens' layout from the output's gradient (B, N, C), the
    parameters' in their dtypes where ``needs`` says so."""
    config, scale_dtype, power_dtype, heads = state
    dq, dk, dv, ds, dp, dbias = _pola_backward(saved, config, heads_view(grad, heads))
    return (tokens_view(dq), tokens_view(dk), tokens_view(dv), None if dbias is None else tokens_view(dbias),
            (tokens_view(ds).to(scale_dtype) if needs[0] else None, dp.to(power_dtype) if needs[1] else None))


def _flatten_core(q, k, v, bias, params, heads, options):
    """FLatten's forward kernels on the tokens: (the output's tokens (B, N, C), the tensors its backward keeps, and
    its state: the kernels' and the scale's shape and dtype)."""
    scale, = params
    raw = scale.float().reshape(-1).contiguous()  # the kernels apply softplus
    out, (saved, config) = _flatten_forward(q, k, v, raw, bias, heads, *options)
    return out, saved, (config, scale.shape, scale.dtype)


def _flatten_core_backward(saved, state, grad, needs):
    """(dq, dk, dv, dbias, (dscale, )) in the tokens' layout from the output's gradient (B, N, C), the scale's in
    its shape and dtype where ``needs`` says so."""
    config, shape, dtype = state
    dq, dk, dv, ds, dbias = _flatten_backward(saved, config, grad)
    return dq, dk, dv, dbias, (ds.reshape(shape).to(dtype) if needs[0] else None, )


def _inline_core(q, k, v, bias, params, heads, options):
    """InLine's forward kernels on the tokens: (the output's tokens (B, N, C), the tensors its backward keeps, and
    its state)."""
    out, (saved, state) = _inline_forward(q, k, v, heads)
    return out, saved, state


def _inline_core_backward(saved, state, grad, needs):
    """(dq, dk, dv, None, ()) in the tokens' layout from the output's gradient (B, N, C): InLine has neither a key
    bias nor parameters."""
    return (*_inline_backward(saved, state, grad), None, ())


# op: (its core's forward, which gives the output as tokens (B, N, C) or heads (B, h, N, d); the core's backward, which
# takes the output's gradient as tokens; whether each image has kernels of its own: then the convolution
# takes one map of all its channels per image, else one map per head, the heads sharing the kernels)
_CORES = {'pola': (_pola_core, _pola_core_backward, False), 'flatten': (_flatten_core, _flatten_core_backward, False),
          'inline': (_inline_core, _inline_core_backward, True)}


class _ValueTermTriton(torch.autograd.Function):
    """The joined Function's autograd: ``op``'s core (:data:`_CORES`) on the head views of q, k, v and the key
    bias (tokens (B, N, C)) with its raw parameters ``params``, and the depthwise convolution of v_term's maps
    (those of its heads, or with kernels per image the image's one map) added to its output where the
    convolution's kernel writes it; the gradients come back in the inputs' shapes and dtypes."""

    @staticmethod
    def forward(ctx, op, heads, hw, options, weight, conv_bias, q, k, v, v_term, bias, *params):
        core, _, per_sample = _CORES[op]
        groups = 1 if per_sample else heads  # the maps per image
        out, saved, state = core(q, k, v, bias, params, heads, options)
        maps = _maps(v_term, hw, groups)
        # the convolution's parameters as they are: the kernels read them in float32 (no copy rounded to the
        # values' dtype, as the library convolution's autocast would make) and give their gradients in their dtype
        residual = _maps(out, hw, groups if out.dim() == 3 else None)
        total = _convolve(maps, weight, conv_bias, False, per_sample, residual=residual)  # in out's layout
        ctx.save_for_backward(*saved, maps, weight)
        ctx.op, ctx.state, ctx.layout, ctx.has_bias = op, state, (groups, hw), conv_bias is not None
        return _maps_as_tokens(total)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        groups, hw = ctx.layout
        *saved, maps, conv_weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_maps, grad_weight, grad_conv_bias = _depthwise_backward(
            maps, conv_weight, _maps(grad, hw, groups), ctx.has_bias, _CORES[ctx.op][2], (needs[9], needs[4], needs[5]))
        dq, dk, dv, dbias, dparams = _CORES[ctx.op][1](saved, ctx.state, grad, needs[11:])
        grad_v_term = None if grad_maps is None else _maps_as_tokens(grad_maps)
        return (None, None, None, None, grad_weight, grad_conv_bias, dq, dk, dv, grad_v_term, dbias, *dparams)


def _joined(function, op, q, k, v, v_term, params, heads, dwc_weight, dwc_bias, hw, options, key_bias):
    """Check the operands of a joined Function (``function``: its name) and apply it."""
    B, N, C = q.shape
    if not (k.shape == v.shape == v_term.shape == q.shape and C % heads == 0 and hw[0] * hw[1] == N):
        raise ValueError(f'{function} takes q, k, v and v_term (B, H*W, C) of one shape on the grid {tuple(hw)}, C '
                         f'a multiple of the heads {heads}; got q {tuple(q.shape)}, k {tuple(k.shape)}, v '
                         f'{tuple(v.shape)}, v_term {tuple(v_term.shape)}')
    if len({q.dtype, k.dtype, v.dtype, v_term.dtype}) > 1:
        raise TypeError(f'{function} takes q, k, v and v_term of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}, '
                        f'{v_term.dtype}')
    if key_bias is not None and (tuple(key_bias.shape) != (1, N, C) or key_bias.dtype != k.dtype):
        raise ValueError(f"{function} takes key_bias (1, {N}, {C}) in the keys' dtype {k.dtype}; got "
                         f'{tuple(key_bias.shape)} {key_bias.dtype}')
    reason = triton_unsupported(q.device, q.dtype, head_dim=C // heads)
    if reason is not None:
        raise AttnImplUnavailable(f'{function} cannot run here: {reason}')
    with autocast_off(q.device.type):  # as the core's dispatch runs it (mmpola.ops.dispatch)
        return apply_function(_ValueTermTriton, op, heads, tuple(hw), options, dwc_weight, dwc_bias, q, k, v, v_term,
                              key_bias, *params)


def pola_value_term_triton(q, k, v, v_term, power, scale, dwc_weight, dwc_bias, hw, alpha=4.0, eps=1e-6,
                           key_bias=None):
    """Pola attention and its depthwise value term on the operands in the tokens' layout, in one autograd
    Function: what Pola attention computes on a grid whose keys are its tokens, without prefix tokens.

    q, k, v, v_term: (B, N, C) tokens of H x W = ``hw`` (any strides, e.g. views of a projection; v_term: the
    values for the term, v itself or a second view of it); power: the raw exponent logit (1, h, 1, d), which
    gives the heads h; scale: the raw temperature logit (1, 1, C); key_bias: None or the keys' encoding
    (1, N, C) in k's dtype; dwc_weight (d, 1, k, k) and dwc_bias (d, ) or None: the depthwise convolution
    shared by the heads, read as they are (in float32 by the kernels). Returns (B, N, C) in q's dtype: per head,
    :func:`~mmpola.ops.pola_triton.pola_attention_triton` of q, k + key_bias, v plus the convolution of
    v_term's map, with the heads merged; q, k, v and v_term in one dtype (the kernels compute in float32).
    The results of the two ops called apart, bit for bit (module docstring)."""
    heads = power.shape[1]
    C = q.shape[-1]
    if tuple(scale.shape) != (1, 1, C) or tuple(power.shape) != (1, heads, 1, C // heads):
        raise ValueError(f'pola_value_term_triton takes scale (1, 1, {C}) and power (1, h, 1, {C} / h); got '
                         f'{tuple(scale.shape)} and {tuple(power.shape)}')
    return _joined('pola_value_term_triton', 'pola', q, k, v, v_term, (scale, power), heads, dwc_weight, dwc_bias,
                   hw, (float(alpha), float(eps)), key_bias)


def flatten_value_term_triton(q, k, v, v_term, scale, num_heads, dwc_weight, dwc_bias, hw, focusing_factor=3,
                              eps=1e-6, key_bias=None):
    """FLatten's focused linear attention and its depthwise value term on the operands in the tokens' layout, in
    one autograd Function: what FLatten attention computes on a grid whose keys are its tokens, without prefix
    tokens.

    q, k, v, v_term: (B, N, C) tokens of H x W = ``hw`` (any strides; v_term: the values for the term, v itself
    or a second view of it); scale: the raw temperature logit (1, 1, C); num_heads: h; key_bias: None or the
    keys' encoding (1, N, C) in k's dtype; dwc_weight (d, 1, k, k) and dwc_bias (d, ) or None: the depthwise
    convolution shared by the heads, read as they are (in float32 by the kernels). Returns (B, N, C) in q's dtype:
    :func:`~mmpola.ops.flatten_triton.flatten_attention_triton` of q, k + key_bias, v plus, per head, the
    convolution of v_term's map; q, k, v and v_term in one dtype (the kernels compute in float32). The results
    of the two ops called apart, bit for bit (module docstring)."""
    C = q.shape[-1]
    if tuple(scale.shape) != (1, 1, C):
        raise ValueError(f'flatten_value_term_triton takes scale (1, 1, {C}); got {tuple(scale.shape)}')
    return _joined('flatten_value_term_triton', 'flatten', q, k, v, v_term, (scale, ), num_heads, dwc_weight,
                   dwc_bias, hw, (focusing_factor, float(eps)), key_bias)


def inline_value_term_triton(q, k, v, v_term, num_heads, kernels, hw):
    """InLine attention's core and its local residual on the operands in the tokens' layout, in one autograd
    Function: what InLine attention computes on a grid without prefix tokens.

    q, k, v, v_term: (B, N, C) tokens of H x W = ``hw`` (any strides; v_term: the values for the residual, v itself
    or a second view of it); num_heads: h; kernels: (B, C, k, k), k odd, the residual's depthwise kernels of each
    image and channel, read as they are (in float32 by the kernels). Returns (B, N, C) in q's dtype:
    :func:`~mmpola.ops.inline_triton.inline_attention_triton` of q, k, v plus the convolution of v_term's map by
    each image's kernels (:func:`~mmpola.ops.depthwise.depthwise_conv2d` with ``per_sample=True``); q, k, v and
    v_term in one dtype (the kernels compute in float32). The results of the two ops called apart, bit for bit
    (module docstring)."""
    B, N, C = q.shape
    if (kernels.dim() != 4 or tuple(kernels.shape[:2]) != (B, C) or kernels.shape[2] != kernels.shape[3]
            or kernels.shape[3] % 2 == 0):
        raise ValueError(f'inline_value_term_triton takes kernels ({B}, {C}, k, k), k odd, one per image and channel; '
                         f'got {tuple(kernels.shape)}')
    return _joined('inline_value_term_triton', 'inline', q, k, v, v_term, (), num_heads, kernels, None, hw, (), None)
