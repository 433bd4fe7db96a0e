"""An attention core and its depthwise value term in one autograd Function, in Triton kernels.

Pola and FLatten attention add to their core's output a depthwise convolution of the values' maps, one map per head,
convolved by kernels the heads share (the attention modules' ``dwc``); InLine attention adds its local residual, a
depthwise convolution of the values' map (all channels, one map per image) by kernels predicted for each image;
PolaFormer++'s PaCS attention adds its LePE, a convolution of the values' map by kernels the images share.
Where the core and the convolution both run in their Triton kernels, the modules call them through one autograd
Function: :func:`pola_value_term_triton`, :func:`flatten_value_term_triton`, :func:`inline_value_term_triton` and
:func:`pacs_value_term_triton`. They take the operands in the tokens' layout (B, N, C) and make the head views, the
parameters' casts, the maps and the merge of the heads inside, without autograd; the convolution's kernel adds its
output to the core's where it writes it (:func:`mmpola.ops.depthwise_triton.depthwise_conv2d_triton`'s
``residual``), and the backward runs the convolution's weight-gradient kernel, the core's kernels and the
convolution's input-gradient kernel on the same gradient. The kernels, their arguments and so the
results are those of the two ops called apart, bit for bit; autograd records one node where it recorded two
Functions and the views, transposes, broadcasts and casts around them, each an operator and a node that the host
runs while a GPU waits for it. :func:`value_term_joins` says where the joined Function computes what the ops called
apart compute.

Where the operands are views that fill one projection (a linear layer's output taken apart, as the modules take it),
the Function takes the projection itself and writes the gradients of all its operands into one tensor of its shape:
autograd would give each view a gradient of its own, add v's two and copy them into one (a stack of the whole
projection's gradient in every attention of a step). There the core's backward writes v's gradient into the
projection's and the convolution's input-gradient kernel adds its own to it where it writes (rounded first, as
autograd adds two gradients). Pola's gate can come in too (``gate``), multiplied as the library multiplies it, so
that its gradient is written there as well: the convolution's kernel writes the gated output beside the output
before the gate, and in the backward the weight-gradient kernel, which reads the output's gradient once per pixel,
writes the gate's gradient into its slot and the gradient before the gate (library multiplications where the
convolution's weights take no gradient).
"""
from typing import Callable, NamedTuple

import torch
from torch.autograd.function import BackwardCFunction

from .depthwise import auto_impl
from .depthwise_triton import _convolve, _weight_grads
from .dispatch import AttnImplUnavailable, apply_function, attention_op, autocast_dtype, autocast_off
from .flatten_triton import _flatten_backward, _flatten_forward
from .inline_triton import _inline_backward, _inline_forward
from .pacs_triton import _pacs_backward, _pacs_forward
from .pacs_triton import _unsupported as _pacs_unsupported
from .pola_triton import _per_head, _pola_backward, _pola_forward
from .triton_support import triton_unsupported

__all__ = ['heads_view', 'tokens_view', 'value_term_joins', 'pola_value_term_triton', 'flatten_value_term_triton',
           'inline_value_term_triton', 'pacs_value_term_triton']


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
    """Whether the joined Function of attention op ``op`` (``'pola'``, ``'flatten'``, ``'inline'`` or ``'pacs'``)
    computes what the two ops called apart compute for these operands (tokens (B, N, C) of h = ``heads`` heads;
    ``conv_weight``: the convolution's shared weight, or InLine's kernels per image): the op with ``impl=attn_impl,
    fp32=fp32`` and the depthwise convolution by ``conv_impl`` (``'auto'``, ``'torch'`` or ``'triton'``) both resolve
    to their
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
    return _CORES[op].unsupported(device, q.dtype, head_dim=q.shape[-1] // heads) is None


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


def _pola_core_backward(saved, state, grad, needs, grads=None):
    """(dq, dk, dv, dbias, (dscale, dpower)) in the tokens' layout from the output's gradient (B, N, C), the
    parameters' in their dtypes where ``needs`` says so; ``grads``: tokens (B, N, C) of any strides to write dq,
    dk and dv into."""
    config, scale_dtype, power_dtype, heads = state
    if grads is not None:
        grads = (heads_view(grads[0], heads), heads_view(grads[1], heads), heads_view(grads[2], heads))
    dq, dk, dv, ds, dp, dbias = _pola_backward(saved, config, heads_view(grad, heads), grads)
    return (tokens_view(dq), tokens_view(dk), tokens_view(dv), None if dbias is None else tokens_view(dbias),
            (tokens_view(ds).to(scale_dtype) if needs[0] else None, dp.to(power_dtype) if needs[1] else None))


def _flatten_core(q, k, v, bias, params, heads, options):
    """FLatten's forward kernels on the tokens: (the output's tokens (B, N, C), the tensors its backward keeps, and
    its state: the kernels' and the scale's shape and dtype)."""
    scale, = params
    raw = scale.float().reshape(-1).contiguous()  # the kernels apply softplus
    out, (saved, config) = _flatten_forward(q, k, v, raw, bias, heads, *options)
    return out, saved, (config, scale.shape, scale.dtype)


def _flatten_core_backward(saved, state, grad, needs, grads=None):
    """(dq, dk, dv, dbias, (dscale, )) in the tokens' layout from the output's gradient (B, N, C), the scale's in
    its shape and dtype where ``needs`` says so; ``grads``: tokens (B, N, C) of any strides to write dq, dk and dv
    into."""
    config, shape, dtype = state
    dq, dk, dv, ds, dbias = _flatten_backward(saved, config, grad, grads)
    return dq, dk, dv, dbias, (ds.reshape(shape).to(dtype) if needs[0] else None, )


def _inline_core(q, k, v, bias, params, heads, options):
    """InLine's forward kernels on the tokens: (the output's tokens (B, N, C), the tensors its backward keeps, and
    its state)."""
    out, (saved, state) = _inline_forward(q, k, v, heads)
    return out, saved, state


def _inline_core_backward(saved, state, grad, needs, grads=None):
    """(dq, dk, dv, None, ()) in the tokens' layout from the output's gradient (B, N, C): InLine has neither a key
    bias nor parameters; ``grads``: tokens (B, N, C) of any strides to write dq, dk and dv into."""
    return (*_inline_backward(saved, state, grad, grads), None, ())


def _pacs_core(q, k, v, bias, params, heads, options):
    """PaCS's forward kernels on the tokens' head views: (the output's tokens (B, N, C), the tensors its backward
    keeps, and its state). ``params``: the raw logits s_same and s_opp and the rotary tables sin and cos (no
    gradient)."""
    out, (saved, state) = _pacs_forward(heads_view(q, heads), heads_view(k, heads), heads_view(v, heads), *params,
                                        *options)
    return tokens_view(out), saved, state


def _pacs_core_backward(saved, state, grad, needs, grads=None):
    """(dq, dk, dv, None, (ds_same, ds_opp, None, None)) in the tokens' layout from the output's gradient (B, N, C);
    ``grads``: tokens (B, N, C) of any strides to write dq, dk and dv into."""
    heads = saved[0].shape[1]
    if grads is not None:
        grads = (heads_view(grads[0], heads), heads_view(grads[1], heads), heads_view(grads[2], heads))
    dq, dk, dv, ds1, ds2 = _pacs_backward(saved, state, heads_view(grad, heads), grads)
    return (tokens_view(dq), tokens_view(dk), tokens_view(dv), None,
            (ds1 if needs[0] else None, ds2 if needs[1] else None, None, None))


class _Core(NamedTuple):
    """An attention op's core in the joined Function."""
    forward: Callable  # gives the output as tokens (B, N, C) or heads (B, h, N, d), the saved tensors and the state
    backward: Callable  # takes the output's gradient as tokens; with ``grads`` writes dq, dk, dv into the tokens given
    one_map: bool  # the convolution takes one map of all channels per image (else one map per head, shared kernels)
    per_sample: bool  # each image has kernels of its own
    unsupported: Callable  # the check registered with the op's kernels: (device, dtype, head_dim=) -> None | why not


_CORES = {'pola': _Core(_pola_core, _pola_core_backward, False, False, triton_unsupported),
          'flatten': _Core(_flatten_core, _flatten_core_backward, False, False, triton_unsupported),
          'inline': _Core(_inline_core, _inline_core_backward, True, True, triton_unsupported),
          'pacs': _Core(_pacs_core, _pacs_core_backward, True, False, _pacs_unsupported)}


def _one_projection(q, k, v, v_term, gate):
    """``(projection, ((B, N, P, C), (q's, k's, v's, v_term's, gate's slot)))`` where q, k, v, v_term and the gate
    (or None) are views of C channels each of one contiguous projection of B x N rows of P * C channels (whose view
    (B, N, P * C) a linear layer returns), as the attention modules take them apart (``unflatten(-1, (P,
    C)).unbind(-2)``), that fill its P slots, v_term being v's slot again. Else None.

    Then the joined Function takes the projection itself and writes the gradients of its slots into one tensor of
    its shape, where autograd would give each view's gradient a tensor of its own, add v's two and stack them.
    Where autograd records the call, only for views whose gradients autograd takes to the projection (views that
    another autograd Function returns, of its input or of a tensor of its own, take theirs elsewhere)."""
    projection = q._base
    if projection is None or not projection.is_contiguous():
        return None
    B, N, C = q.shape
    rows = B * N
    width = projection.numel() // rows if rows else 0
    if not width or width * rows != projection.numel() or width % C:
        return None
    strides, origin, recorded = (N * width, width, 1), projection.storage_offset(), torch.is_grad_enabled()
    slots = []
    for t in (q, k, v, v_term, gate):  # a loop, not a generator: this runs in every attention of every step
        if t is None:
            slots.append(None)
            continue
        offset = t.storage_offset() - origin
        if t._base is not projection or t.stride() != strides or offset % C or not 0 <= offset < width:
            return None
        if recorded and (t.requires_grad != projection.requires_grad or isinstance(t.grad_fn, BackwardCFunction)):
            return None
        slots.append(offset // C)
    # q, k, v (and the gate) in distinct slots, all of them
    filled = {slots[0], slots[1], slots[2], slots[4]} - {None}
    if slots[3] != slots[2] or not len(filled) == width // C == 3 + (gate is not None):
        return None
    return projection, ((B, N, width // C, C), tuple(slots))


class _ValueTermTriton(torch.autograd.Function):
    """The joined Function's autograd: ``op``'s core (:data:`_CORES`) on the head views of q, k, v and the key
    bias (tokens (B, N, C)) with its raw parameters ``params``, and the depthwise convolution of v_term's maps
    (those of its heads, or with kernels per image the image's one map) added to its output where the
    convolution's kernel writes it, times ``gate`` where there is one; the gradients come back in the inputs'
    shapes and dtypes.

    ``projected``: None, or ``(layout, (q, k, v, v_term, gate))`` where those are views that fill one projection
    (:func:`_one_projection`), given as ``q`` instead (k, v, v_term and gate None): its gradient comes back as one
    tensor of its shape. The views come in a tuple, which autograd does not look into, so that it records the
    projection as the input."""

    @staticmethod
    def forward(ctx, op, heads, hw, options, projected, weight, conv_bias, q, k, v, v_term, gate, bias, *params):
        core = _CORES[op]
        per_sample = core.per_sample
        if projected is not None:
            ctx.projection = (q.shape, q.dtype, q.device)
            q, k, v, v_term, gate = projected[1]
        groups = 1 if core.one_map else heads  # the maps per image
        out, saved, state = core.forward(q, k, v, bias, params, heads, options)
        maps = _maps(v_term, hw, groups)
        # the convolution's parameters as they are: the kernels read them in float32 (no copy rounded to the
        # values' dtype, as the library convolution's autocast would make) and give their gradients in their dtype
        residual = _maps(out, hw, groups if out.dim() == 3 else None)
        if gate is None:
            result = _convolve(maps, weight, conv_bias, False, per_sample, residual=residual)
            ctx.save_for_backward(*saved, maps, weight)
        else:  # the gate's product as the library multiplies it (``total * gate``), written by the same kernel
            gate = _maps(gate, hw, groups)
            total, result = _convolve(maps, weight, conv_bias, False, per_sample, residual=residual, gate=gate)
            ctx.save_for_backward(*saved, maps, weight, total, gate)  # the maps of both
        ctx.op, ctx.state, ctx.layout, ctx.has_bias = op, state, (groups, hw), conv_bias is not None
        ctx.slots, ctx.gated = None if projected is None else projected[0], gate is not None
        return _maps_as_tokens(result)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        groups, hw = ctx.layout
        saved = ctx.saved_tensors
        needs, slots = ctx.needs_input_grad, ctx.slots
        core = _CORES[ctx.op]
        per_sample = core.per_sample
        if slots is None:
            return _backward_apart(ctx, grad, saved, needs)
        # the slots' gradients written into one tensor of the projection's shape
        shape, dtype, device = ctx.projection
        projection_grad = torch.empty(shape, dtype=dtype, device=device)
        (B, N, P, C), order = slots
        by_slot = projection_grad.view(B, N, P, C).unbind(2)
        targets = (by_slot[order[0]], by_slot[order[1]], by_slot[order[2]])
        grad_weight = grad_conv_bias = None
        if ctx.gated:
            *saved, total, gate = saved
        *saved, maps, conv_weight = saved
        weight_grads = needs[5] or (ctx.has_bias and needs[6])
        grad_maps = _maps(grad, hw, groups)
        if ctx.gated and weight_grads:
            # the weight-gradient kernel, which reads each pixel's gradient once, writes the gate's gradient into
            # its slot and the gradient before the gate in total's layout (both as the library's multiplication
            # gives them)
            before_gate = torch.empty_strided(total.shape, total.stride(), dtype=total.dtype, device=total.device)
            grad_weight, grad_conv_bias = _weight_grads(
                maps, conv_weight, grad_maps, ctx.has_bias, per_sample, needs[5:7],
                (gate, total, _maps(by_slot[order[4]], hw, groups), before_gate))
            grad_maps, grad = before_gate, _maps_as_tokens(before_gate)
        else:
            if ctx.gated:  # as the library's multiplication total * gate gives them
                torch.mul(grad_maps, total, out=_maps(by_slot[order[4]], hw, groups))
                grad_maps = grad_maps * gate
                grad = _maps_as_tokens(grad_maps)
            if weight_grads:
                grad_weight, grad_conv_bias = _weight_grads(maps, conv_weight, grad_maps, ctx.has_bias, per_sample,
                                                            needs[5:7])
        _, _, _, dbias, dparams = core.backward(saved, ctx.state, grad, needs[13:], targets)
        # v's two uses: the convolution's input gradient added to the core's where its kernel writes it, rounded
        # first (as autograd adds them)
        _convolve(grad_maps, conv_weight, None, True, per_sample, into=_maps(targets[2], hw, groups))
        return (None, None, None, None, None, grad_weight, grad_conv_bias, projection_grad, None, None, None, None,
                dbias, *dparams)


def _backward_apart(ctx, grad, saved, needs):
    """:class:`_ValueTermTriton`'s backward where q, k, v, v_term and the gate came as tensors of their own: the
    gradient of each."""
    groups, hw = ctx.layout
    grad_maps, grad_gate = _maps(grad, hw, groups), None
    if ctx.gated:  # as the library's multiplication total * gate gives them (of their maps: in tokens' layout)
        *saved, total, gate = saved
        grad_gate = _maps_as_tokens(grad_maps * total)
        grad_maps = grad_maps * gate
        grad = _maps_as_tokens(grad_maps)
    *saved, maps, conv_weight = saved
    core = _CORES[ctx.op]
    per_sample = core.per_sample
    grad_v_term = grad_weight = grad_conv_bias = None
    if needs[10]:
        grad_v_term = _maps_as_tokens(_convolve(grad_maps, conv_weight, None, True, per_sample, like=maps))
    if needs[5] or (ctx.has_bias and needs[6]):
        grad_weight, grad_conv_bias = _weight_grads(maps, conv_weight, grad_maps, ctx.has_bias, per_sample,
                                                    needs[5:7])
    dq, dk, dv, dbias, dparams = core.backward(saved, ctx.state, grad, needs[13:])
    return (None, None, None, None, None, grad_weight, grad_conv_bias, dq, dk, dv, grad_v_term, grad_gate, dbias,
            *dparams)


def _joined(function, op, q, k, v, v_term, params, heads, dwc_weight, dwc_bias, hw, options, key_bias, gate=None):
    """Check the operands of a joined Function (``function``: its name) and apply it."""
    B, N, C = q.shape
    if not (k.shape == v.shape == v_term.shape == q.shape and C % heads == 0 and hw[0] * hw[1] == N):
        raise ValueError(f'{function} takes q, k, v and v_term (B, H*W, C) of one shape on the grid {tuple(hw)}, C '
                         f'a multiple of the heads {heads}; got q {tuple(q.shape)}, k {tuple(k.shape)}, v '
                         f'{tuple(v.shape)}, v_term {tuple(v_term.shape)}')
    if len({q.dtype, k.dtype, v.dtype, v_term.dtype}) > 1:
        raise TypeError(f'{function} takes q, k, v and v_term of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}, '
                        f'{v_term.dtype}')
    if gate is not None and (gate.shape != q.shape or gate.dtype != q.dtype):
        raise ValueError(f"{function} takes a gate of q's shape {tuple(q.shape)} and dtype {q.dtype}; got "
                         f'{tuple(gate.shape)} {gate.dtype}')
    if key_bias is not None and (tuple(key_bias.shape) != (1, N, C) or key_bias.dtype != k.dtype):
        raise ValueError(f"{function} takes key_bias (1, {N}, {C}) in the keys' dtype {k.dtype}; got "
                         f'{tuple(key_bias.shape)} {key_bias.dtype}')
    reason = _CORES[op].unsupported(q.device, q.dtype, head_dim=C // heads)
    if reason is not None:
        raise AttnImplUnavailable(f'{function} cannot run here: {reason}')
    joined = _one_projection(q, k, v, v_term, gate)
    with autocast_off(q.device.type):  # as the core's dispatch runs it (mmpola.ops.dispatch)
        if joined is None:
            return apply_function(_ValueTermTriton, op, heads, tuple(hw), options, None, dwc_weight, dwc_bias, q, k, v,
                                  v_term, gate, key_bias, *params)
        projection, layout = joined
        return apply_function(_ValueTermTriton, op, heads, tuple(hw), options, (layout, (q, k, v, v_term, gate)),
                              dwc_weight, dwc_bias, projection, None, None, None, None, key_bias, *params)


def pola_value_term_triton(q, k, v, v_term, power, scale, dwc_weight, dwc_bias, hw, alpha=4.0, eps=1e-6,
                           key_bias=None, gate=None):
    """Pola attention and its depthwise value term on the operands in the tokens' layout, in one autograd
    Function: what Pola attention computes on a grid whose keys are its tokens, without prefix tokens.

    q, k, v, v_term: (B, N, C) tokens of H x W = ``hw`` (any strides, e.g. views of a projection; v_term: the
    values for the term, v itself or a second view of it); power: the raw exponent logit (1, h, 1, d), which
    gives the heads h; scale: the raw temperature logit (1, 1, C); key_bias: None or the keys' encoding
    (1, N, C) in k's dtype; dwc_weight (d, 1, k, k) and dwc_bias (d, ) or None: the depthwise convolution
    shared by the heads, read as they are (in float32 by the kernels). Returns (B, N, C) in q's dtype: per head,
    :func:`~mmpola.ops.pola_triton.pola_attention_triton` of q, k + key_bias, v plus the convolution of
    v_term's map, with the heads merged; q, k, v and v_term in one dtype (the kernels compute in float32).
    The results of the two ops called apart, bit for bit (module docstring). ``gate``: None, or tokens (B, N, C) in
    q's dtype that the sum is multiplied by, as the library multiplies them (Pola's gate before its output
    projection). Where the operands (and the gate) are views that fill one projection, the projection gets its
    gradient as one tensor (:func:`_one_projection`)."""
    heads = power.shape[1]
    C = q.shape[-1]
    if tuple(scale.shape) != (1, 1, C) or tuple(power.shape) != (1, heads, 1, C // heads):
        raise ValueError(f'pola_value_term_triton takes scale (1, 1, {C}) and power (1, h, 1, {C} / h); got '
                         f'{tuple(scale.shape)} and {tuple(power.shape)}')
    return _joined('pola_value_term_triton', 'pola', q, k, v, v_term, (scale, power), heads, dwc_weight, dwc_bias,
                   hw, (float(alpha), float(eps)), key_bias, gate)


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
    of the two ops called apart, bit for bit (module docstring). Where the operands are views that fill one
    projection, the projection gets its gradient as one tensor (:func:`_one_projection`)."""
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


def pacs_value_term_triton(q, k, v, v_term, s_same, s_opp, sin, cos, num_heads, lepe_weight, lepe_bias, hw, eps=1e-6,
                           gate=None):
    """PaCS attention (PolaFormer++) and its LePE, the depthwise convolution of the values' map, on the operands in
    the tokens' layout, in one autograd Function: what PaCS attention computes before its output projection.

    q, k, v, v_term: (B, N, C) tokens of H x W = ``hw`` (any strides; v_term: the values for the LePE, v itself or
    a second view of it); s_same, s_opp: the raw spikiness logits (1, h, 1, 2d); sin, cos: the rotary tables (N, 2d)
    (:func:`mmpola.ops.pacs.rope_tables`); num_heads: h; lepe_weight (C, 1, k, k) and lepe_bias (C, ) or None: the
    convolution of the map of all C channels, read as they are (in float32 by the kernels). Returns (B, N, C) in q's
    dtype: :func:`~mmpola.ops.pacs_triton.pacs_attention_triton` of the heads of q, k, v with the heads merged, plus
    the convolution of v_term's map; q, k, v and v_term in one dtype (the kernels compute in float32). ``gate``:
    None, or tokens (B, N, C) in q's dtype that the sum is multiplied by, as the library multiplies them. The results
    of the ops called apart, bit for bit (module docstring); where the operands (and the gate) are views that fill
    one projection, the projection gets its gradient as one tensor (:func:`_one_projection`)."""
    C = q.shape[-1]
    d = C // num_heads if C % num_heads == 0 else 0
    for name, logit in (('s_same', s_same), ('s_opp', s_opp)):
        if tuple(logit.shape) != (1, num_heads, 1, 2 * d):
            raise ValueError(f'pacs_value_term_triton takes {name} (1, {num_heads}, 1, 2 * {C} / {num_heads}); got '
                             f'{tuple(logit.shape)}')
    N = hw[0] * hw[1]
    if tuple(sin.shape) != (N, 2 * d) or sin.shape != cos.shape:
        raise ValueError(f'pacs_value_term_triton takes rotary tables sin and cos ({N}, {2 * d}) of the grid '
                         f'{tuple(hw)}; got {tuple(sin.shape)} and {tuple(cos.shape)}')
    return _joined('pacs_value_term_triton', 'pacs', q, k, v, v_term, (s_same, s_opp, sin, cos), num_heads,
                   lepe_weight, lepe_bias, hw, (float(eps), ), None, gate)
