"""Linear layers whose input the backward recomputes instead of keeping it: ``F.linear(F.gelu(h), W, b)``, the
second half of the transformer MLPs (:func:`gelu_linear`), ``F.linear(s * g, W, b)``, Pola attention's
gated output projection (:func:`gated_linear`), and ``F.linear(F.layer_norm(x), W, b)``, a pre-norm block's
LayerNorm and the linear layer after it (:func:`layer_norm_linear`).

Autograd keeps a linear layer's input for its weight gradient, and the element-wise op that made it keeps
its own inputs for its gradient: two tensors where one would do. Here the forward is the library's (the
element-wise op, then ``F.linear``) but keeps the element-wise op's inputs only; the backward recomputes
the layer's input in the Triton kernel that computes the element-wise op's gradient
(mmpola/ops/recompute_triton.py). That kernel reads what autograd's backward of the op reads and writes
one more tensor: the MLP's backward launches as many kernels as autograd's, the gate's one fewer (one
kernel for both gradients of the product, where autograd runs two), and neither keeps the layer's input.

The LayerNorm's output is recomputed from its input, which autograd keeps for the LayerNorm's own backward:
one Triton kernel normalises the rows in the forward, in the linear layer's dtype (where under autocast the
library writes float32 rows and casts them: two kernels), and in the backward the same kernel writes them
again with the gradient of x and each program's partial sums of the norm's parameter gradients, in place of
the LayerNorm's backward (and, under autocast, of the cast of the rows' gradient); one sum of the partial
sums follows. It keeps x only. :func:`add_layer_norm_linear` also takes the residual connection before the
LayerNorm (``s = x + branch``, with a factor per sample): the kernel writes the sum with the rows, and in the
backward adds the sum's gradient from the layers after it and writes the branch's, where the library runs the
addition, the multiplication by the factors and, in the backward, their gradients as kernels of their own.
Both may give the linear layer's output as the operands it holds (``chunk``, the attention's q, k, v and gate),
one of them twice (``repeat``: the values, which the depthwise term uses too): in the backward one kernel writes
the output's gradient from theirs, the repeated one's two added, with the bias's partial sums, where the
library's autograd adds, stacks and sums them in three. :func:`add_residual_and_cast` writes a residual connection
(a stage's last) with its copy in the dtype the next layer reads, where the library multiplies, adds and casts.
:func:`layer_norm_add` normalises a patch embedding's output where the convolution wrote it and adds a positional
encoding, where the library (under autocast) casts, copies, normalises and adds.

The implementations (``impl`` of the functions here):

* ``'torch'``: the library's layers; autograd keeps both tensors.
* ``'triton'``: the recomputing backward, on CUDA (and under ``TRITON_INTERPRET=1`` on the CPU, for tests): less
  activation memory, for a run that needs it.
* ``'auto'``: ``'torch'`` on every device. Each fused layer is a custom autograd Function with its launch code
  and a Python backward in place of two or three library operators: it saves device memory and a few kernels
  but costs the host more Python calls and Triton launches, and the training steps of mmpola's detection
  backbones on a GPU are set by their host (docs/benchmarks.md, "The host's time of a step").

The models (:func:`mmpola.models.layers.gelu_fc2`, :func:`mmpola.models.layers.gated_proj`,
:func:`mmpola.models.layers.norm_linear`, ``PatchEmbed.embed_and_add``, :func:`mmpola.models.layers.add_and_cast`)
ask :func:`recompute_layers_impl` for theirs. It follows the choice that the environment variable
``MMPOLA_RECOMPUTE`` names (``'auto'`` when unset), or, for a backbone built with a ``recompute`` argument, that
one (:func:`recompute_scope`): a config can choose per model (and per stage), where the variable chooses for
every model of a run. A choice is one of the implementations, for every layer here, or ``'elementwise'``: the
kernels for the two layers whose input is an element-wise op's output (:func:`gelu_linear`, :func:`gated_linear`:
an MLP's hidden activation, the largest tensor a block keeps, and the gate's product) and the library's for the
LayerNorms (:func:`layer_norm_linear` and the other LayerNorm and residual kernels). The GELU's kernel replaces one
library kernel each way, so it keeps most of the memory saved for less than half of the host's work
(docs/benchmarks.md, "What a training step keeps"). A gate that the attention's own kernels can multiply (Pola's
and PolaFormer++'s, where their core runs in Triton) stays there with ``'elementwise'``
(:func:`mmpola.models.layers.gated_proj_recomputes`): there the product costs no kernel, where gated_linear's
kernels would cost a product each way and a copy of the projection's gradients, for one tensor of the
attention's output size less to keep.
"""
import contextlib
import math

import torch
import torch.nn.functional as F

from .dispatch import autocast_dtype, autocast_off, implementation_from_env, promoted_dtype
from .recompute_triton import (
    NORM_MAX_CHANNELS,
    OPERANDS_MAX,
    add_layer_norm_rows,
    gate_and_gate_backward,
    gelu_rows,
    layer_norm_rows,
    norm_add_rows,
    operand_grads,
    residual_cast,
    residual_cast_backward,
)
from .triton_support import require_triton

__all__ = ['RECOMPUTE_CHOICES', 'RECOMPUTE_IMPLS', 'add_layer_norm_linear', 'add_residual_and_cast',
           'check_recompute_impl', 'current_recompute_scope', 'gated_linear', 'gelu_linear', 'layer_norm_add',
           'layer_norm_linear', 'recompute_impl', 'recompute_impl_from_env', 'recompute_layers_impl',
           'recompute_scope', 'resolve_recompute_impl']

RECOMPUTE_IMPLS = ('auto', 'torch', 'triton')
# what MMPOLA_RECOMPUTE and a backbone's recompute argument take: an implementation for every layer, or the kernels
# for the layers after an element-wise op only (recompute_layers_impl)
RECOMPUTE_CHOICES = (*RECOMPUTE_IMPLS, 'elementwise')
AUTO = 'torch'  # what 'auto' resolves to, on every device (the module doc says why)
ENV = 'MMPOLA_RECOMPUTE'
WHAT = 'the linear layers that recompute their input'  # in the variable's error message


_SCOPES = []  # the implementations of the recompute_scope()s entered, innermost last


def recompute_impl():
    """The implementation asked for: inside :func:`recompute_scope` its implementation (a backbone's ``recompute``
    argument), else the one that ``MMPOLA_RECOMPUTE`` names (``'auto'`` when unset); an unknown name is one clear
    error."""
    if _SCOPES:
        return _SCOPES[-1]
    # (the variable read here rather than through recompute_impl_from_env: this runs at every fused layer's call)
    return implementation_from_env(ENV, RECOMPUTE_CHOICES, WHAT)


def recompute_impl_from_env():
    """The implementation that ``MMPOLA_RECOMPUTE`` names (``'auto'`` when unset); an unknown name is one clear
    error."""
    return implementation_from_env(ENV, RECOMPUTE_CHOICES, WHAT)


def check_recompute_impl(impl, error=ValueError):
    """``impl`` if it is None or one of :data:`RECOMPUTE_CHOICES`, else ``error`` naming them."""
    if impl is not None and impl not in RECOMPUTE_CHOICES:
        raise error(f'recompute must be one of {", ".join(map(repr, RECOMPUTE_CHOICES))} or None (MMPOLA_RECOMPUTE '
                    f'decides), got {impl!r}')
    return impl


def recompute_scope(impl):
    """A context in which :func:`recompute_impl` gives ``impl`` whatever ``MMPOLA_RECOMPUTE`` says (``impl`` None:
    no change, ``contextlib.nullcontext``, which compilers and tracers take as it is): a backbone's ``recompute``
    argument around its blocks, in their forward and in the forward that gradient checkpointing runs again in the
    backward."""
    return contextlib.nullcontext() if impl is None else _scope(check_recompute_impl(impl))


@contextlib.contextmanager
def _scope(impl):
    _SCOPES.append(impl)
    try:
        yield
    finally:
        _SCOPES.pop()


def _switch():
    """What turns the kernels off where they cannot run (:func:`~mmpola.ops.triton_support.require_triton`'s
    message): inside a backbone's scope its ``recompute`` argument, which wins over the variable, else the
    variable."""
    if _SCOPES:
        return "the backbone's recompute='torch', model.backbone.recompute in a config"
    return f'{ENV}=torch'


def current_recompute_scope():
    """The implementation of the innermost :func:`recompute_scope` entered, or None."""
    return _SCOPES[-1] if _SCOPES else None


def resolve_recompute_impl(impl, x):
    """``'torch'`` or ``'triton'``: ``impl``, with ``'auto'`` resolved for tensor ``x``: ``'torch'`` (the module
    doc says why)."""
    if impl not in RECOMPUTE_IMPLS:
        raise ValueError(f'impl must be one of {", ".join(RECOMPUTE_IMPLS)}, got {impl!r}')
    return AUTO if impl == 'auto' else impl


def recompute_layers_impl(elementwise):
    """``'torch'`` or ``'triton'``: the implementation that the choice in force (:func:`recompute_impl`) gives the
    layers after an element-wise op (``elementwise`` True: :func:`gelu_linear`, :func:`gated_linear`) or the
    LayerNorm's layers (False: :func:`layer_norm_linear`, :func:`add_layer_norm_linear`,
    :func:`add_residual_and_cast`, :func:`layer_norm_add`)."""
    choice = recompute_impl()
    if choice == 'elementwise':
        return 'triton' if elementwise else 'torch'
    return AUTO if choice == 'auto' else choice


def _rows(t):
    """The rows (M, C) of t (..., C): a view where t's strides allow, with unit column stride."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _gelu_backward(h, input_bias, grad_out, dtype, needs_input_grad, needs_bias_grad):
    """(the GELU's output in ``dtype``, h's gradient or None, the input bias's gradient or None)."""
    rows = _rows(h).contiguous()
    out, grad_h, grad_bias = gelu_rows(rows, input_bias, dtype, grad_out)
    return out, grad_h.view(h.shape) if needs_input_grad else None, grad_bias if needs_bias_grad else None


def _gate_backward(s, g, grad_out, dtype, needs_s_grad, needs_g_grad):
    """(s * g in ``dtype``, s's gradient or None, g's gradient or None)."""
    out, grad_s, grad_g = gate_and_gate_backward(_rows(s), _rows(g), grad_out, dtype)
    return out, grad_s.view(s.shape) if needs_s_grad else None, grad_g.view(g.shape) if needs_g_grad else None


class _RecomputedLinear(torch.autograd.Function):
    """``F.linear(op(*inputs), weight, bias)`` keeping ``inputs`` and the weight; the operands in one dtype
    (the weight's: op's result is cast to it, as autocast casts a linear layer's input). ``op``: ``'gelu'``
    (inputs h, or h and the bias added to h before the GELU) or ``'gate'`` (inputs s and g)."""

    @staticmethod
    def forward(ctx, op, weight, bias, *inputs):
        ctx.save_for_backward(weight, *inputs)
        ctx.op, ctx.has_bias = op, bias is not None
        if op == 'gate':
            x = inputs[0] * inputs[1]
        elif len(inputs) == 1:
            x = F.gelu(inputs[0])
        else:  # the GELU of h and its bias: the kernel the backward recomputes it with
            x = gelu_rows(_rows(inputs[0]).contiguous(), inputs[1], weight.dtype)[0]
        out = F.linear(x.to(weight.dtype), weight, bias)
        if out.dim() == inputs[0].dim():  # x had the input's shape: so has the output (no view to record)
            return out
        return out.view(*inputs[0].shape[:-1], weight.shape[0])  # the GELU kernel's rows

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        weight, *inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad = grad.reshape(-1, grad.shape[-1])
        grad_x = grad.mm(weight) if any(needs[3:]) else None  # the gradient of the linear layer's input
        if ctx.op == 'gelu':
            input_bias = inputs[1] if len(inputs) > 1 else None
            needs_bias = input_bias is not None and needs[4]
            x, *grads = _gelu_backward(inputs[0], input_bias, grad_x, weight.dtype, needs[3], needs_bias)
            grads = grads[:len(inputs)]
        elif grad_x is None:
            x, grads = (inputs[0] * inputs[1]).to(weight.dtype), [None, None]
        else:
            x, *grads = _gate_backward(*inputs, grad_x, weight.dtype, needs[3], needs[4])
        grad_weight = grad.t().mm(x.reshape(-1, x.shape[-1])) if needs[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and needs[2] else None
        return None, grad_weight, grad_bias, *grads


def _linear_operands(inputs, weight, bias, impl, what):
    """The linear layer's weight and bias in the dtype it computes in (under autocast: the autocast dtype, as
    ``F.linear`` casts them) where ``impl`` resolves to the recomputing path for the inputs, else None."""
    x = inputs[0]
    if resolve_recompute_impl(impl, x) == 'torch' or x.numel() == 0:
        return None
    require_triton(x, f'the Triton backward of {what}', _switch)
    dtype = autocast_dtype(x.device.type)
    if dtype is not None:  # as F.linear casts them
        return weight.to(dtype), None if bias is None else bias.to(dtype)
    x_dtype = x.dtype if len(inputs) == 1 or inputs[1].dtype == x.dtype else torch.result_type(*inputs)
    if weight.dtype != x_dtype or (bias is not None and bias.dtype != x_dtype):
        dtypes = {x_dtype, weight.dtype, *(() if bias is None else (bias.dtype, ))}
        raise TypeError(f'{what} expects its operands in one dtype (or autocast), got '
                        f'{", ".join(sorted(str(d).replace("torch.", "") for d in dtypes))}')
    return weight, bias


def _operands(out, chunk, repeat, fresh=False):
    """``out`` (..., P * chunk) taken apart: its P operands of ``chunk`` channels (views), then those of ``repeat``
    (indices) once more (``fresh``: as views of their own, for an autograd Function's outputs); ``out`` itself
    for ``chunk`` None."""
    if chunk is None:
        return out
    operands = out.unflatten(-1, (-1, chunk)).unbind(-2)
    return *operands, *(operands[i].view_as(operands[i]) if fresh else operands[i] for i in repeat)


def _output_grad(grads, repeat, width, bias_dtype):
    """(the gradient (M, width) of a linear layer's output, the bias's or None) from ``grads``: the output's, or
    those of its operands and of the repeated one (:func:`_operands`); ``bias_dtype``: None where the bias takes
    no gradient."""
    if len(grads) == 1:
        grad = grads[0].reshape(-1, width)
        return grad, grad.sum(0) if bias_dtype else None
    count = len(grads) - len(repeat)
    if count <= OPERANDS_MAX:  # the operands' gradients, the repeated one's two added, and the bias's: one pass
        extra = (_rows(grads[count]), repeat[0]) if repeat else (None, None)
        return operand_grads([_rows(g) for g in grads[:count]], *extra, bias_dtype=bias_dtype)
    grad = torch.stack([g + grads[count] if repeat and i == repeat[0] else g for i, g in enumerate(grads[:count])],
                       -2).reshape(-1, width)
    return grad, grad.sum(0) if bias_dtype else None


class _NormLinear(torch.autograd.Function):
    """``F.linear(F.layer_norm(x, (C, ), norm_weight, norm_bias, eps), weight, bias)`` keeping x, the norm's
    parameters and the weight; the normalised rows in the weight's dtype. ``chunk`` not None: the output's
    operands (:func:`_operands`), whose gradients meet in one kernel (:func:`operand_grads`)."""

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, eps, weight, bias, chunk=None, repeat=()):
        rows = _rows(x).contiguous()
        y = layer_norm_rows(rows, norm_weight, norm_bias, eps, weight.dtype)[0]
        ctx.save_for_backward(rows, norm_weight, norm_bias, weight)
        ctx.eps, ctx.shape, ctx.has_bias, ctx.repeat = eps, x.shape, bias is not None, repeat
        return _operands(F.linear(y, weight, bias).view(*x.shape[:-1], weight.shape[0]), chunk, repeat, fresh=True)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        rows, norm_weight, norm_bias, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad, grad_bias = _output_grad(grads, ctx.repeat, weight.shape[0],
                                       weight.dtype if ctx.has_bias and needs[5] else None)
        grad_y = grad.mm(weight) if any(needs[:3]) else None  # the gradient of the normalised rows
        y, grad_x, grad_norm_weight, grad_norm_bias = layer_norm_rows(rows, norm_weight, norm_bias, ctx.eps,
                                                                     weight.dtype, grad_y)
        grad_weight = grad.t().mm(y) if needs[4] else None
        return (grad_x.view(ctx.shape) if needs[0] else None, grad_norm_weight if needs[1] else None,
                grad_norm_bias if needs[2] else None, None, grad_weight, grad_bias, None, None)


class _AddNormLinear(torch.autograd.Function):
    """``(s, F.linear(F.layer_norm(s, (C, ), norm_weight, norm_bias, eps), weight, bias))`` for the sum
    ``s = x + branch`` (``x + branch * scale``, a factor per sample of x's first dim; branch None: s is x) keeping
    s, the norm's parameters, the weight and the scale; the normalised rows in the weight's dtype. ``chunk`` not
    None: s and the output's operands (:func:`_operands`)."""

    @staticmethod
    def forward(ctx, x, branch, scale, norm_weight, norm_bias, eps, weight, bias, chunk=None, repeat=()):
        tokens = math.prod(x.shape[1:-1])  # rows per sample, from the shape (x[0] would dispatch an operator)
        if branch is None:  # x goes on as it is: its gradient from the layers after joins the LayerNorm's
            s = _rows(x).contiguous()
            y = layer_norm_rows(s, norm_weight, norm_bias, eps, weight.dtype)[0]
        else:
            s, y = add_layer_norm_rows(_rows(x).contiguous(), _rows(branch).contiguous(), scale, tokens, norm_weight,
                                       norm_bias, eps, weight.dtype)
        ctx.save_for_backward(s, norm_weight, norm_bias, weight, scale)
        ctx.set_materialize_grads(False)
        ctx.eps, ctx.shape, ctx.tokens, ctx.has_bias, ctx.repeat = eps, x.shape, tokens, bias is not None, repeat
        ctx.dtypes = x.dtype, None if branch is None else branch.dtype
        out = _operands(F.linear(y, weight, bias).view(*x.shape[:-1], weight.shape[0]), chunk, repeat, fresh=True)
        s = x if branch is None else s.view(x.shape)
        return (s, out) if chunk is None else (s, *out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_sum, *grads):
        s, norm_weight, norm_bias, weight, scale = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grads = [s.new_zeros(*ctx.shape[:-1], weight.shape[0] // (len(grads) - len(ctx.repeat)), dtype=weight.dtype)
                 if g is None else g for g in grads]
        grad, grad_bias = _output_grad(grads, ctx.repeat, weight.shape[0],
                                       weight.dtype if ctx.has_bias and needs[7] else None)
        grad_y = grad.mm(weight)  # the gradient of the normalised rows
        grad_sum = None if grad_sum is None else _rows(grad_sum).contiguous()
        y, grad_s, grad_norm_weight, grad_norm_bias, *grad_branch = layer_norm_rows(
            s, norm_weight, norm_bias, ctx.eps, weight.dtype, grad_y, residual=(grad_sum, ctx.dtypes[1], scale,
                                                                                ctx.tokens))
        grad_branch = grad_branch[0] if grad_branch else None
        grad_weight = grad.t().mm(y) if needs[6] else None
        return (grad_s.view(ctx.shape).to(ctx.dtypes[0]) if needs[0] else None,
                grad_branch.view(ctx.shape) if needs[1] else None, None,
                grad_norm_weight if needs[3] else None, grad_norm_bias if needs[4] else None, None, grad_weight,
                grad_bias, None, None)


def _recomputed_linear(op, inputs, weight, bias, impl, what, extra=()):
    """The op's path where ``impl`` resolves to the recomputing one for ``inputs`` (``extra``: inputs of op
    whose dtype the linear layer does not take, the GELU's input bias), else None."""
    operands = _linear_operands(inputs, weight, bias, impl, what)
    if operands is None:
        return None
    with autocast_off(inputs[0].device.type):
        return _RecomputedLinear.apply(op, *operands, *inputs, *extra)


def gelu_linear(h, weight, bias=None, impl='auto', input_bias=None):
    """``F.linear(F.gelu(h), weight, bias)``: h (..., hidden), weight (out, hidden), bias (out, ) or None. With
    ``'triton'`` the backward keeps h only and recomputes the GELU's output (module docstring). Under autocast
    the linear layer runs in the autocast dtype, as ``F.linear`` does, and the GELU in h's dtype.

    ``input_bias`` (hidden, ): ``F.gelu(h + input_bias)``, the bias of the linear layer that made h taken out
    of it (an MLP's fc1, run without its bias). With ``'triton'`` the GELU's kernel adds it, in float32, in the
    forward and in the backward, where it also sums the bias's gradient (in the bias's dtype) over the rows it
    writes h's gradient for, in place of the sum of that gradient that the linear layer's backward runs; the
    GELU's output is rounded once, to the linear layer's dtype. The library's path runs the addition (in the
    promoted dtype of h and the bias)."""
    if input_bias is not None and tuple(input_bias.shape) != (h.shape[-1], ):
        raise ValueError(f'gelu_linear expects an input bias of shape {(h.shape[-1], )} for h of {h.shape[-1]} '
                         f'channels, got {tuple(input_bias.shape)}')
    extra = () if input_bias is None else (input_bias, )
    out = _recomputed_linear('gelu', (h, ), weight, bias, impl, 'gelu_linear', extra)
    if out is None:
        return F.linear(F.gelu(h if input_bias is None else h + input_bias), weight, bias)
    return out


def gated_linear(s, g, weight, bias=None, impl='auto'):
    """``F.linear(s * g, weight, bias)``: s and g (..., C) of one shape (any strides), weight (out, C), bias
    (out, ) or None. With ``'triton'`` the backward keeps s and g only and recomputes the product, and one
    kernel gives both their gradients (module docstring). Under autocast the linear layer runs in the autocast
    dtype, the product in s's and g's."""
    if s.shape != g.shape:
        raise ValueError(f'gated_linear expects s and g of one shape, got {tuple(s.shape)} and {tuple(g.shape)}')
    out = _recomputed_linear('gate', (s, g), weight, bias, impl, 'gated_linear')
    return F.linear(s * g, weight, bias) if out is None else out


def layer_norm_linear(x, norm_weight, norm_bias, eps, weight, bias=None, impl='auto', chunk=None, repeat=()):
    """``F.linear(F.layer_norm(x, (C, ), norm_weight, norm_bias, eps), weight, bias)``: x (..., C), the norm's
    weight and bias (C, ), weight (out, C), bias (out, ) or None. With ``'triton'`` the backward keeps x only
    and recomputes the normalised rows (module docstring); ``'auto'`` runs the library's layers for rows of
    more than ``NORM_MAX_CHANNELS`` channels. Under autocast the linear layer runs in the autocast dtype, as
    ``F.linear`` does; the rows are normalised in float32 and rounded once to that dtype (as the library's
    float32 LayerNorm and the cast before its linear layer).

    ``chunk`` (a divisor of out): returns the operands that the output holds, ``chunk`` channels each, one after
    another (views, as ``out.unflatten(-1, (-1, chunk)).unbind(-2)``), followed by those of ``repeat`` (at most
    one index) once more: an operand used twice, whose two gradients the backward adds where the library's
    autograd adds them with a kernel of its own. With ``'triton'`` one kernel writes the output's gradient from
    the operands' (up to four) and the bias's partial sums, where the library stacks them and reads the stack
    again for the bias's gradient."""
    C = x.shape[-1]
    impl, repeat = _check_norm_linear(x, norm_weight, norm_bias, weight, impl, chunk, repeat, 'layer_norm_linear')
    operands = _linear_operands((x, ), weight, bias, impl, 'layer_norm_linear')
    if operands is None:
        return _operands(F.linear(F.layer_norm(x, (C, ), norm_weight, norm_bias, eps), weight, bias), chunk, repeat)
    with autocast_off(x.device.type):
        return _NormLinear.apply(x, norm_weight, norm_bias, eps, *operands, chunk, repeat)


def _check_norm_linear(x, norm_weight, norm_bias, weight, impl, chunk, repeat, what):
    """(``impl``, ``repeat`` as a tuple) after the checks of ``what``'s operands: the norm's parameters and the
    weight for x, ``chunk`` and ``repeat`` for the weight; ``'auto'`` becomes ``'torch'`` for rows wider than
    the LayerNorm kernel's."""
    C = x.shape[-1]
    if norm_weight.shape != (C, ) or norm_bias.shape != (C, ) or weight.shape[-1] != C:
        raise ValueError(f'{what} expects a norm weight and bias of ({C}, ) and a weight (out, {C}) for x of {C} '
                         f'channels, got {tuple(norm_weight.shape)}, {tuple(norm_bias.shape)} and '
                         f'{tuple(weight.shape)}')
    repeat = tuple(repeat)
    if chunk is None and repeat:
        raise ValueError(f'{what} repeats operands of a chunk size only')
    if chunk is not None and (chunk <= 0 or weight.shape[0] % chunk):
        raise ValueError(f'{what} takes operands of a chunk size that divides the {weight.shape[0]} outputs, got '
                         f'{chunk}')
    if len(repeat) > 1 or any(not 0 <= i < weight.shape[0] // chunk for i in repeat):
        raise ValueError(f'{what} repeats at most one of its {weight.shape[0] // chunk} operands, got {repeat}')
    return ('torch' if impl == 'auto' and C > NORM_MAX_CHANNELS else impl), repeat


def _check_branch(x, branch, scale, what):
    """The checks of a residual connection's branch (None: none) and its factors per sample for x."""
    if branch is not None and branch.shape != x.shape:
        raise ValueError(f'{what} expects a branch of the shape of x {tuple(x.shape)}, got {tuple(branch.shape)}')
    if scale is not None and tuple(scale.shape) != (x.shape[0], ):
        raise ValueError(f'{what} expects a scale of shape ({x.shape[0]}, ) (one factor per sample), '
                         f'got {tuple(scale.shape)}')


def _scaled(branch, scale):
    """``branch`` times its factor per sample (``scale`` (B, ) or None), as the library's path multiplies it."""
    return branch if scale is None else branch * scale.view(-1, *(1, ) * (branch.dim() - 1))


def add_layer_norm_linear(x, branch, norm_weight, norm_bias, eps, weight, bias=None, impl='auto', scale=None,
                          chunk=None, repeat=()):
    """``(s, F.linear(F.layer_norm(s, (C, ), norm_weight, norm_bias, eps), weight, bias))`` for the sum
    ``s = x + branch``: a residual connection and the pre-norm of the layer after it (a block's residual stream x
    and its attention's output). x and branch (B, ..., C) of one shape; ``scale`` (B, ) or None: a factor per
    sample of the branch, ``x + branch * scale`` (stochastic depth's). The sum has the dtype torch's addition
    gives (float32 for a float32 residual stream and a branch of the autocast dtype), the branch's product is
    rounded to the branch's dtype, as in torch.

    With ``'triton'`` one kernel writes the sum and the normalised rows, and in the backward, which keeps the
    sum only (as :func:`layer_norm_linear` keeps x), one kernel adds the gradient of the sum from the layers after
    it to the LayerNorm's, writes it (the residual stream's gradient) and the branch's (rounded to its dtype,
    times its factor): where the library runs the addition, the multiplication and the LayerNorm as kernels of
    their own, and in the backward the sum of the two gradients, a cast and a multiplication. Otherwise as
    :func:`layer_norm_linear` (``'auto'`` runs the library's layers for rows of more than ``NORM_MAX_CHANNELS``
    channels), also for ``chunk`` and ``repeat``: then returns s and the output's operands.

    ``branch`` None: no addition, s is x (the residual stream going on past the LayerNorm), returned so that the
    gradient it gets from the layers after it reaches the backward, whose kernel adds it to the LayerNorm's
    where the library's autograd adds the two with a kernel of its own."""
    C = x.shape[-1]
    _check_branch(x, branch, scale, 'add_layer_norm_linear')
    impl, repeat = _check_norm_linear(x, norm_weight, norm_bias, weight, impl, chunk, repeat,
                                      'add_layer_norm_linear')
    operands = _linear_operands((x, ), weight, bias, impl, 'add_layer_norm_linear')
    if operands is None:
        s = x if branch is None else x + _scaled(branch, scale)
        out = _operands(F.linear(F.layer_norm(s, (C, ), norm_weight, norm_bias, eps), weight, bias), chunk, repeat)
        return (s, out) if chunk is None else (s, *out)
    with autocast_off(x.device.type):
        return _AddNormLinear.apply(x, branch, scale, norm_weight, norm_bias, eps, *operands, chunk, repeat)


class _ResidualCast(torch.autograd.Function):
    """``(s, s.to(dtype))`` for ``s = x + branch`` (``x + branch * scale``, a factor per sample of x's first dim),
    keeping the scale only; x (B, N, C), s in its map's layout with ``as_map``."""

    @staticmethod
    def forward(ctx, x, branch, scale, dtype, as_map):
        s, copy = residual_cast(x.contiguous(), branch.contiguous(), scale, dtype, as_map)
        ctx.save_for_backward(scale)
        ctx.set_materialize_grads(False)
        ctx.dtypes = x.dtype, branch.dtype
        return s, copy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_sum, grad_copy):
        scale, = ctx.saved_tensors
        grad_x, grad_branch = residual_cast_backward(grad_sum, grad_copy, scale, *ctx.dtypes,
                                                     ctx.needs_input_grad[0])
        return grad_x, grad_branch if ctx.needs_input_grad[1] else None, None, None, None


def add_residual_and_cast(x, branch, dtype, scale=None, impl='auto', as_map=False):
    """``(s, s.to(dtype))`` for the residual connection ``s = x + branch``: the last of a stage's blocks, whose sum
    the next stage's first layer reads in another dtype (under autocast, the patch embedding's convolution of a
    float32 residual stream). x and branch (B, ..., C) of one shape; ``scale`` (B, ) or None: a factor per sample
    of the branch, ``x + branch * scale`` (stochastic depth's). The sum has the dtype torch's addition gives, the
    branch's product is rounded to the branch's dtype, as in torch.

    With ``'triton'`` one kernel writes the sum and its copy, where the library runs the multiplication, the
    addition and the cast as kernels of their own, and in the backward, which keeps the scale only, one kernel
    adds the gradients of the sum and of the copy and writes the sum's (x's) and the branch's (rounded to its
    dtype, times its factor): where the library casts the copy's gradient, adds the two, and casts and multiplies
    the branch's. ``'auto'`` as :func:`layer_norm_linear`.

    ``as_map`` (x and branch (B, H*W, C) tokens): with ``'triton'`` the kernel writes the sum in the layout of its
    (B, C, H, W) map, and s is that map's (B, H*W, C) view (channels-strided): where the sum becomes that map
    (``tokens.reshape(B, H, W, C).permute(0, 3, 1, 2)`` is then contiguous, no copy), whose gradient the backward
    reads in place; the library's path gives contiguous tokens either way."""
    _check_branch(x, branch, scale, 'add_residual_and_cast')
    if as_map and x.dim() != 3:
        raise ValueError(f'add_residual_and_cast writes the sum as a map for tokens (B, N, C), got {tuple(x.shape)}')
    if resolve_recompute_impl(impl, x) == 'torch' or x.numel() == 0:
        s = x + _scaled(branch, scale)
        return s, s.to(dtype)
    require_triton(x, 'the Triton kernels of add_residual_and_cast', _switch)
    with autocast_off(x.device.type):
        s, copy = _ResidualCast.apply(x.reshape(x.shape[0], -1, x.shape[-1]), branch.reshape(
            x.shape[0], -1, x.shape[-1]), scale, dtype, as_map)
    return s.view(x.shape), copy.view(x.shape)


class _NormAdd(torch.autograd.Function):
    """``F.layer_norm(x, (C, ), weight, bias, eps) + addend`` for tokens x (B, N, C) in their layout, keeping x and
    the norm's parameters; the output contiguous in ``dtype``."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, addend, dtype):
        y = norm_add_rows(x, weight, bias, eps, addend.reshape(x.shape[1:]).contiguous(), dtype)[0]
        ctx.save_for_backward(x, weight, bias)
        ctx.eps, ctx.addend_shape, ctx.addend_dtype = eps, addend.shape, addend.dtype
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad = grad.contiguous()
        grad_x = grad_weight = grad_bias = None
        if any(needs[:3]):
            _, grad_x, grad_weight, grad_bias = norm_add_rows(x, weight, bias, ctx.eps, None, None, grad)
        grad_addend = grad.sum(0).to(ctx.addend_dtype).view(ctx.addend_shape) if needs[4] else None
        return (grad_x if needs[0] else None, grad_weight if needs[1] else None, grad_bias if needs[2] else None,
                None, grad_addend, None)


def _token_layout(x):
    """x (B, N, C) as it is where its tokens or channels are contiguous (tokens, or a (B, C, H, W) map's view),
    else a contiguous copy."""
    return x if x.is_contiguous() or x.transpose(1, 2).is_contiguous() else x.contiguous()


def layer_norm_add(x, weight, bias, eps, addend, impl='auto'):
    """``F.layer_norm(x, (C, ), weight, bias, eps) + addend``: tokens x (B, N, C) of any strides (the output map
    of a patch embedding's convolution seen as tokens), the norm's weight and bias (C, ), and an ``addend`` of N * C
    elements ((N, C) or (1, N, C)) shared by the samples: a positional encoding.

    With ``'triton'`` one kernel reads x where the convolution wrote it (a (B, C, H, W) map's channels-strided
    view, or channels-last tokens), normalises it in float32 (as autocast runs a LayerNorm on CUDA) and writes the
    sum, contiguous, in the dtype of a float32 norm's output plus the addend (of x's plus the addend's without
    autocast); the library under autocast casts x to float32, copies strided tokens, normalises and adds, as kernels
    of their own. The backward keeps x and the norm's parameters: one kernel writes x's gradient in x's dtype and
    layout (where the library writes it in float32, casts it and the convolution copies it to its layout) with
    partial sums of the parameters' gradients; the addend's is the sum of the output's over the samples, as the
    library's. ``'auto'`` as :func:`layer_norm_linear`."""
    if x.dim() != 3:
        raise ValueError(f'layer_norm_add takes tokens (B, N, C), got {tuple(x.shape)}')
    B, N, C = x.shape
    if tuple(weight.shape) != (C, ) or tuple(bias.shape) != (C, ):
        raise ValueError(f'layer_norm_add: the norm\'s weight and bias must be ({C}, ) for {C} channels, got '
                         f'{tuple(weight.shape)} and {tuple(bias.shape)}')
    if addend.numel() != N * C or addend.shape[-1] != C:
        raise ValueError(f'layer_norm_add: the addend must hold one row of {C} channels per token ({N}, {C}), got '
                         f'{tuple(addend.shape)}')
    if resolve_recompute_impl(impl, x) == 'torch' or x.numel() == 0:
        return F.layer_norm(x, (C, ), weight, bias, eps) + addend
    require_triton(x, 'the Triton kernel of layer_norm_add', _switch)
    if C > NORM_MAX_CHANNELS:
        raise ValueError(f'layer_norm_add\'s kernel takes rows of up to {NORM_MAX_CHANNELS} channels, got {C}')
    norm_dtype = torch.float32 if autocast_dtype(x.device.type) is not None else x.dtype
    with autocast_off(x.device.type):
        return _NormAdd.apply(_token_layout(x), weight, bias, eps, addend, promoted_dtype(norm_dtype, addend.dtype))
