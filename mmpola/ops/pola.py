"""Polarity-aware linear attention core (PolaFormer, ICLR 2025).

Plain functions on per-head tensors; no module state. The math and the op order: docs/design.md.

Shapes:
    q: (B, h, N, d) queries (after the projection, before the temperature division)
    k: (B, h, n, d) keys (positional encoding already added)
    v: (B, h, n, d) values
    power: (1, h, 1, d) raw exponent logit; p = 1 + alpha * sigmoid(power)
    scale: (1, h, 1, d) raw temperature logit; s = softplus(scale)
    (power and scale may be any shape that broadcasts against (B, h, N, d).)
Returns (B, h, N, d): per head, the first d/2 channels are the same-sign branch (values v[..., :d/2]),
the last d/2 the opposite-sign branch (values v[..., d/2:]).

Implementations (``impl=``; mmpola.ops.dispatch, each takes ``(q, k, v, power, scale, alpha, eps)``):

* ``'reference'``, :func:`pola_attention_reference`, follows the official op order exactly (bit-exact in
  fp32); it is the ground truth for tests and golden files.
* ``'fast'`` (the default), :func:`pola_attention_fast`, computes the same function with fewer passes and
  less memory:

  - each feature map ``[relu(x)^p || relu(-x)^p]`` (x = q/s or k/s) comes from ONE power of ``|x|`` in a
    custom autograd Function whose backward is written by hand (``d/dx = p*y/x``, ``d/dp = y*log|x|``),
    saving only the input and the feature map;
  - the opposite-sign query map ``[q- || q+]`` is never materialised: swapping the halves of q_sim is the
    same as swapping the row halves of the matrix it multiplies;
  - ONE key-value product ``k'^T @ (v/n)`` yields both branches' value summaries (columns v1 | v2), and
    ONE query product ``q_sim @ W`` (W: (2d, d+2), built from it and the key mean) yields both
    numerators and both normalisers;
  - the element-wise feature work is fused with ``torch.compile`` on the CPU when it is available and
    pays off (large tensors), with an eager fallback (see :func:`compile_status`). On CUDA the fast path
    stays eager: ``'auto'`` runs the Triton implementation there, and a compiled fast path is recompiled
    for every new shape and dtype a detector brings (:data:`COMPILE_DEVICES`).
"""
import contextlib
import logging
import os

import torch
import torch.nn.functional as F

from .dispatch import attention_op, recording, run_attention_op

__all__ = [
    'pola_attention', 'pola_attention_reference', 'pola_attention_fast', 'polarity_feature_map',
    'polarity_feature_map_and_mean', 'compile_status'
]

# torch.compile is used only for feature-map inputs (q or k) of at least this many elements: below
# it the fused kernel saves at most a few ms per call, while the first compile in a process costs
# 15-40 s on CPU (C++ build; cached on disk afterwards), which would dominate unit tests and small
# inputs. 2**20 ~ five 56x56 maps of 64 channels: a 224 training batch or any detection input compiles,
# a 224 test image does not.
COMPILE_MIN_NUMEL = 2**20

# Device types on which the fast path compiles by default. Only the CPU: there the fused C++ kernel
# pays for large inputs (docs/benchmarks.md), while on CUDA 'auto' picks the Triton kernels and the
# compiled fast path made a detector's training iteration slower than the eager one (it is compiled
# again for the new shapes and dtypes a detector brings). force_compile() compiles on every device
# (the benchmarks' 'fast+compile' rows).
COMPILE_DEVICES = ('cpu',)

_NO_COMPILE_ENV = 'MMPOLA_NO_COMPILE'


def pola_attention_reference(q, k, v, power, scale, alpha=4.0, eps=1e-6):
    """The official op order (bit-exact to the official modules in fp32)."""
    # the official per-head layout: strided views would change the products' summation order
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    n = k.shape[-2]
    scale = F.softplus(scale)
    power = 1 + alpha * torch.sigmoid(power)
    q = q / scale
    k = k / scale
    q_pos = F.relu(q) ** power
    q_neg = F.relu(-q) ** power
    k_pos = F.relu(k) ** power
    k_neg = F.relu(-k) ** power
    q_sim = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    k = torch.cat([k_pos, k_neg], dim=-1)
    v1, v2 = torch.chunk(v, 2, dim=-1)

    k_mean_t = k.mean(dim=-2, keepdim=True).transpose(-2, -1)
    z = 1 / (q_sim @ k_mean_t + eps)
    kv = (k.transpose(-2, -1) * (n ** -0.5)) @ (v1 * (n ** -0.5))
    x_sim = q_sim @ kv * z
    z = 1 / (q_opp @ k_mean_t + eps)
    kv = (k.transpose(-2, -1) * (n ** -0.5)) @ (v2 * (n ** -0.5))
    x_opp = q_opp @ kv * z
    return torch.cat([x_sim, x_opp], dim=-1)


# --------------------------------------------------------------------------------------------------
# Polarity feature map  y = [relu(x)^p || relu(-x)^p],  x = t / s
# --------------------------------------------------------------------------------------------------


def _sum_to_shape(t, shape):
    """Sum ``t`` over the dimensions along which a tensor of ``shape`` was broadcast to t's shape."""
    if tuple(t.shape) == tuple(shape):
        return t
    lead = t.dim() - len(shape)
    dims = list(range(lead))
    dims += [lead + i for i, size in enumerate(shape) if size == 1 and t.shape[lead + i] != 1]
    t = t.sum(dims, keepdim=True) if dims else t
    return t.reshape(shape) if lead else t


def _feature_map_forward(t, s, p):
    """Eager kernel body. t: (..., d); s > 0, p > 1 broadcast to t. Returns y: (..., 2d)."""
    d = t.shape[-1]
    # sign(x) * |x|^p: the only transcendental pass (pow), shared by both signs; sign(t/s) = sign(t)
    # as s > 0. Float ops only: bool masks (where / masked_fill) are several times slower on CPU.
    signed = t.abs().div_(s).pow_(p).copysign_(t)
    y = signed.new_empty(*signed.shape[:-1], 2 * d)
    y_pos, y_neg = y[..., :d], y[..., d:]
    torch.clamp(signed, min=0, out=y_pos)  # relu(x)^p
    torch.sub(y_pos, signed, out=y_neg)  # relu(x)^p - sign(x)|x|^p = relu(-x)^p exactly
    return y


def _feature_map_backward(grad_y, t, s, p, y, grad_mean=None, need_grad_p=True):
    """Eager kernel body of the hand-written backward.

    With x = t/s, y+ = relu(x)^p and y- = relu(-x)^p have disjoint supports, so
    gm = g+ * y+ + g- * y- is (grad of the active sign) * |x|^p, and
        dL/dt = p * gm / t          (= p*g*|x|^(p-1)*sign(x) / s; 0 at t = 0 where gm = 0),
        dL/ds = -p * gm / s         (dx/ds = -x/s),
        dL/dp = gm * log|x|         (0 where gm = 0, in particular at x = 0).
    No log or pow over the whole tensor, no NaN at 0. grad_s and grad_p are summed over the
    dimensions along which s and p were broadcast. ``grad_mean`` (..., 1, 2d), the gradient of the
    token mean of y, adds grad_mean / n to every token's g (accumulated in place: no (..., n, 2d)
    broadcast of it is materialised). Returns (grad_t, grad_s, grad_p); grad_p is None unless
    ``need_grad_p`` (its log pass is the most expensive part).
    """
    d = t.shape[-1]
    gm = torch.addcmul(grad_y[..., :d] * y[..., :d], grad_y[..., d:], y[..., d:])
    if grad_mean is not None:
        grad_mean = grad_mean / t.shape[-2]
        gm.addcmul_(y[..., :d], grad_mean[..., :d]).addcmul_(y[..., d:], grad_mean[..., d:])
    grad_p = None
    if need_grad_p:
        # log|x| clamped at the smallest normal: where |x| is below it, gm is exactly 0 (|x|^p underflows)
        log_x = t.abs().div_(s).clamp_min_(torch.finfo(t.dtype).tiny).log_()
        grad_p = _sum_to_shape(log_x.mul_(gm), p.shape)
        del log_x
    gm.mul_(p)
    # s is constant along the summed dims, so dividing after the sum is exact and cheaper
    grad_s = _sum_to_shape(gm, s.shape).div(s).neg_()
    grad_t = gm.div_(t).masked_fill_(t == 0, 0.0)  # 0/0 at t == 0 -> 0 (gm is 0 there)
    return grad_t, grad_s, grad_p


def _feature_map_forward_fusable(t, s, p, with_mean=False):
    """The math of :func:`_feature_map_forward`, out-of-place, for torch.compile (one fused kernel)."""
    mag = (t.abs() / s).pow(p)
    y_pos = torch.where(t > 0, mag, 0.0)
    y = torch.cat([y_pos, mag - y_pos], dim=-1)
    return (y, y.mean(dim=-2, keepdim=True)) if with_mean else y


def _feature_map_backward_fusable(grad_y, t, s, p, y, grad_mean=None):
    """The math of :func:`_feature_map_backward`, out-of-place, for torch.compile."""
    d = t.shape[-1]
    if grad_mean is not None:
        grad_y = grad_y + grad_mean / t.shape[-2]  # fused into the kernel, not materialised
    gm = grad_y[..., :d] * y[..., :d] + grad_y[..., d:] * y[..., d:]
    log_x = (t.abs() / s).clamp_min(torch.finfo(t.dtype).tiny).log()
    grad_p = _sum_to_shape(gm * log_x, p.shape)
    gm = gm * p
    grad_s = -_sum_to_shape(gm, s.shape) / s
    grad_t = torch.where(t == 0, 0.0, gm / t)
    return grad_t, grad_s, grad_p


def _fused_forward(t, s, p):
    return _feature_map_forward_fusable(t, s, p, False)


def _fused_forward_with_mean(t, s, p):
    return _feature_map_forward_fusable(t, s, p, True)


def _fused_backward(grad_y, t, s, p, y):
    return _feature_map_backward_fusable(grad_y, t, s, p, y, None)


def _fused_backward_with_mean(grad_y, t, s, p, y, grad_mean):
    return _feature_map_backward_fusable(grad_y, t, s, p, y, grad_mean)


# One compiled function (own code object, so its own dynamo cache and recompile budget) per variant:
# a model calls the forward with and without the token mean (q and k) and the backward with and
# without its gradient; sharing one code object made a detector (heads of 1 and >1, train and eval,
# batch 1 and 2) reach dynamo's recompile limit.
_FUSED = {'forward': _fused_forward, 'forward_mean': _fused_forward_with_mean,
          'backward': _fused_backward, 'backward_mean': _fused_backward_with_mean}


class _CompileState:
    """Lazily compiled kernels plus the reason they are not used (logged once)."""
    compiled = {}
    disabled_reason = None
    logged = False
    limit_logged = False


def _log_once(msg):
    if _CompileState.logged:
        return
    _CompileState.logged = True
    try:
        from mmengine.logging import print_log
        print_log(msg, logger='current', level=logging.WARNING)
    except Exception:  # mmengine missing or its logger unusable: plain logging still says it
        logging.getLogger(__name__).warning(msg)


def _compile_unavailable_reason():
    if os.environ.get(_NO_COMPILE_ENV, '0') not in ('', '0'):
        return f'{_NO_COMPILE_ENV} is set'
    if _CompileState.disabled_reason is not None:
        return _CompileState.disabled_reason
    if not hasattr(torch, 'compile'):
        return f'torch {torch.__version__} has no torch.compile'
    return None


def compile_status():
    """Return ``(enabled, reason)``: whether the fast path may use torch.compile, and why not."""
    reason = _compile_unavailable_reason()
    where = 'every device' if COMPILE_DEVICES is None else ', '.join(COMPILE_DEVICES)
    return reason is None, reason or f'enabled (on {where}, for tensors of >= COMPILE_MIN_NUMEL elements)'


def _disable_compile(reason):
    _CompileState.disabled_reason = reason
    _log_once(f'mmpola: torch.compile of the Pola feature map is disabled ({reason}); using the '
              f'eager fast path (same results, somewhat slower). Set {_NO_COMPILE_ENV}=1 to silence.')


def _want_compile(t):
    return (t.numel() >= COMPILE_MIN_NUMEL and (COMPILE_DEVICES is None or t.device.type in COMPILE_DEVICES)
            and _compile_unavailable_reason() is None)


def _no_duck_shapes():
    try:
        from torch.fx.experimental import _config as fx_config
        return fx_config.patch(use_duck_shape=False)
    except (ImportError, AttributeError, TypeError):  # a torch without the setting: duck shapes
        return contextlib.nullcontext()


def _run_compiled(name, *args):
    """Call the compiled variant ``name`` of :data:`_FUSED`; returns None when the caller must run
    eager: compiling failed (then it is disabled for the process) or this input is one variant too
    many for dynamo's recompile limit (then only this call runs eager; compiled variants stay)."""
    fn = _CompileState.compiled.get(name)
    # detached: the autograd.Function owns the graph, and requires_grad would be one more guard
    args = [a.detach() if torch.is_tensor(a) else a for a in args]
    try:
        if fn is None:
            fn = torch.compile(_FUSED[name], dynamic=True, fullgraph=True)
            _CompileState.compiled[name] = fn
        # Without duck shaping: by default dynamo gives equal sizes one symbol (batch 2 with 2 heads,
        # 64 tokens of 64 channels) and guards on their equality, so every new batch size, head count
        # or grid compiled the kernels again. With a symbol per size, one graph per variant serves
        # every size (dynamo still specialises sizes of 1: a batch of one image or a single head has
        # its own graph).
        with _no_duck_shapes():
            return fn(*args)
    except Exception as err:  # no C++ compiler, no triton, unsupported platform, ...
        first_line = (str(err).strip().splitlines() or [''])[0][:200]
        if 'RecompileLimit' in type(err).__name__ or 'recompile_limit' in first_line:
            if not _CompileState.limit_logged:
                _CompileState.limit_logged = True
                logging.getLogger(__name__).info(
                    'mmpola: an input variant beyond dynamo\'s recompile limit runs the eager fast path')
            return None
        _disable_compile(f'{type(err).__name__}: {first_line}')
        return None


class _PolarityFeatureMap(torch.autograd.Function):
    """y = [relu(t/s)^p || relu(-t/s)^p] (and optionally its token mean) with a hand-written
    backward that saves t and y only."""

    @staticmethod
    def forward(ctx, t, s, p, with_mean):
        if recording():
            out = _feature_map_forward_fusable(t, s, p, with_mean)
        else:
            out = None
            if _want_compile(t):
                out = _run_compiled('forward_mean' if with_mean else 'forward', t, s, p)
            if out is None:
                y = _feature_map_forward(t, s, p)
                out = (y, y.mean(dim=-2, keepdim=True)) if with_mean else y
        ctx.save_for_backward(t, s, p, out[0] if with_mean else out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y, grad_mean=None):
        t, s, p, y = ctx.saved_tensors
        if recording():
            grads = _feature_map_backward_fusable(grad_y, t, s, p, y, grad_mean)
        else:
            grads = None
            if _want_compile(t):
                grads = _run_compiled('backward', grad_y, t, s, p, y) if grad_mean is None else \
                    _run_compiled('backward_mean', grad_y, t, s, p, y, grad_mean)
            if grads is None:
                grads = _feature_map_backward(grad_y, t, s, p, y, grad_mean,
                                              need_grad_p=ctx.needs_input_grad[2])
        grad_t, grad_s, grad_p = grads
        return (grad_t if ctx.needs_input_grad[0] else None, grad_s if ctx.needs_input_grad[1] else None,
                grad_p if ctx.needs_input_grad[2] else None, None)


def _promote(t, s, p):
    if p.dtype != t.dtype or s.dtype != t.dtype:
        dtype = torch.promote_types(t.dtype, torch.promote_types(s.dtype, p.dtype))
        t, s, p = t.to(dtype), s.to(dtype), p.to(dtype)
    return t, s, p


def polarity_feature_map(t, s, p):
    """Polarity feature map of a query or key tensor.

    Args:
        t: (..., d) queries or keys.
        s: temperature s = softplus(scale) > 0, broadcastable to t (e.g. (1, h, 1, d)).
        p: exponent p = 1 + alpha * sigmoid(power) > 1, broadcastable to t.
    Returns:
        (..., 2d): ``[relu(t/s)^p || relu(-t/s)^p]``, differentiable w.r.t. t, s and p.
    """
    return _PolarityFeatureMap.apply(*_promote(t, s, p), False)


def polarity_feature_map_and_mean(t, s, p):
    """:func:`polarity_feature_map` of t (..., n, d) and its mean over the n tokens (..., 1, 2d).

    The mean's gradient is folded into the feature map's backward, so the (..., n, 2d) broadcast
    of it that autograd's mean backward would allocate is never materialised.
    """
    return _PolarityFeatureMap.apply(*_promote(t, s, p), True)


# --------------------------------------------------------------------------------------------------
# Fast attention core
# --------------------------------------------------------------------------------------------------


def _check_shapes(q, k, v):
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or q.shape[-1] != v.shape[-1]:
        raise ValueError('pola_attention expects q (B, h, N, d), k and v (B, h, n, d) with one head dim d; '
                         f'got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}')
    if v.shape[-1] % 2:
        raise ValueError(f'pola_attention splits each head into two value halves, so the head dim must be '
                         f'even; got d={v.shape[-1]} (choose channels / heads even)')


def pola_attention_fast(q, k, v, power, scale, alpha=4.0, eps=1e-6):
    """Same function as :func:`pola_attention_reference`, fewer passes and less memory.

    Shapes as in the module docstring. Matches the reference to ~1e-6 in fp32 (not bit-exact: sums
    are accumulated in a different order).
    """
    _check_shapes(q, k, v)
    n, d = k.shape[-2], k.shape[-1]
    half = d // 2
    s = F.softplus(scale)
    p = 1 + alpha * torch.sigmoid(power)

    q_sim = polarity_feature_map(q, s, p)  # (B, h, N, 2d) = [q+ || q-]
    k_feat, k_mean = polarity_feature_map_and_mean(k, s, p)  # (B, h, n, 2d), (B, h, 1, 2d)

    # One key-value product for both branches: k'^T @ (v / n), rows [k+ ; k-], columns [v1 | v2].
    # Dividing the (half as wide) value operand first keeps the product a mean, O(1), as in the
    # official code, so it cannot overflow in low precision (fp32=False).
    kv = k_feat.transpose(-2, -1) @ (v * (1.0 / n)).to(k_feat.dtype)  # (B, h, 2d, d)
    kv = torch.cat([kv, k_mean.transpose(-2, -1)], dim=-1)  # (B, h, 2d, d+1), last column the key mean

    # q_opp = [q- || q+] is q_sim with halves swapped, so q_opp @ M == q_sim @ M_rowswapped.
    # W columns: [same-sign values | opposite-sign values | same-sign norm | opposite-sign norm], rows
    # [k+ ; k-]; built from split() pieces (views whose backward is one cat, where slices of a tensor
    # used twice would each scatter their gradient into zeros of the whole).
    top, bottom = kv.split(d, dim=-2)  # k+ rows, k- rows
    top_v1, top_v2, top_mean = top.split([half, d - half, 1], dim=-1)
    bottom_v1, bottom_v2, bottom_mean = bottom.split([half, d - half, 1], dim=-1)
    w = torch.cat([torch.cat([top_v1, bottom_v2, top_mean, bottom_mean], dim=-1),
                   torch.cat([bottom_v1, top_v2, bottom_mean, top_mean], dim=-1)], dim=-2)

    out = q_sim @ w  # (B, h, N, d+2): one pass over the query features for everything
    numerators, normalisers = out.split([d, 2], dim=-1)
    z = 1 / (normalisers + eps)  # (B, h, N, 2) reciprocal normalisers of both branches
    return (numerators.unflatten(-1, (2, half)) * z.unsqueeze(-1)).flatten(-2)


def _example_inputs(batch, heads, hw, head_dim, generator):
    """(q, k, v, power, scale) of an H x W grid (logits near the trained regime: p around 3, s around
    ln 2) and (alpha, eps)."""
    n = hw[0] * hw[1]
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=generator) for _ in range(3))
    power = torch.randn(1, heads, 1, head_dim, generator=generator) * 0.5
    scale = torch.randn(1, heads, 1, head_dim, generator=generator) * 0.3
    return [q, k, v, power, scale], (4.0, 1e-6)


@contextlib.contextmanager
def force_compile():
    """The fast path's torch.compile kernels at every size and on every device (benchmarks and tests
    of the compiled kernels)."""
    global COMPILE_MIN_NUMEL, COMPILE_DEVICES
    previous_env, previous_min, previous_devices = os.environ.pop(_NO_COMPILE_ENV, None), COMPILE_MIN_NUMEL, \
        COMPILE_DEVICES
    COMPILE_MIN_NUMEL, COMPILE_DEVICES = 0, None
    try:
        yield
    finally:
        COMPILE_MIN_NUMEL, COMPILE_DEVICES = previous_min, previous_devices
        if previous_env is not None:
            os.environ[_NO_COMPILE_ENV] = previous_env


attention_op('pola', 'pola_attention', example_inputs=_example_inputs, force_compile=force_compile).register(
    'reference', pola_attention_reference)
attention_op('pola').register('fast', pola_attention_fast, default=True)


def pola_attention(q, k, v, power, scale, alpha=4.0, eps=1e-6, fp32=True, impl='auto', key_bias=None):
    """Pola attention with an fp32 island under autocast.

    Args:
        q: (B, h, N, d); k, v: (B, h, n, d); power, scale: raw logits (1, h, 1, d) or broadcastable.
        key_bias: None, or a tensor broadcastable to k that is added to k first (the models' key
            positional encoding, (1, h, n, d)); the Triton implementation adds it where its kernels read
            the keys, so the sum is never a tensor (mmpola.ops.dispatch).
        fp32: compute the core in float32 with autocast disabled (default), then cast back to
            q's dtype. Low-precision matmuls overflow for |q/s| > ~9 at p ~ 5 (docs/design.md, "Numerical
            stability under mixed precision").
        impl: 'reference' (official op order), 'fast' (fused feature maps, one kv and one query
            product; torch.compile for large inputs when available), 'auto' (the default
            implementation, 'fast') or another registered implementation.
    Returns:
        (B, h, N, d) in q's dtype when fp32=True.
    """
    return run_attention_op('pola', impl, fp32, (q, k, v, power, scale), alpha, eps, key_bias=key_bias)
