"""Building blocks the architectures share: the MLP, patch embedding and merging, grid embeddings
resized to the real token grid, and the official weight init.

Token layout: ``x`` is (B, N, C), the row-major flatten of an H x W grid, and the grid size
travels beside it as ``hw = (H, W)``.
"""
import weakref
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, register_notrace_module, trunc_normal_
from torch.nn.modules import module as torch_module
from torch.optim.optimizer import register_optimizer_step_post_hook

from mmpola.ops import (
    add_layer_norm_linear,
    add_residual_and_cast,
    depthwise_conv2d,
    depthwise_conv_impl,
    gated_linear,
    gelu_linear,
    layer_norm_add,
    layer_norm_linear,
)
from mmpola.ops.dispatch import autocast_dtype, padding_needed, promoted_dtype, recording, unviewed_when_compiling
from mmpola.ops.recompute import recompute_layers_impl
from mmpola.ops.recompute_triton import NORM_MAX_CHANNELS

__all__ = ['DepthwiseConv2d', 'DropPath', 'Mlp', 'ParameterCache', 'PatchEmbed', 'PatchMerging', 'PreNormBlock',
           'ResizedEmbeddingCache', 'SizeCache', 'add_and_cast', 'add_branch', 'crop_map', 'drop_path_scale', 'hooked',
           'gated_proj', 'gelu_fc2', 'map_as_tokens', 'norm_linear', 'pad_image', 'padded_side',
           'resize_grid_embedding', 'residual_mlp', 'to_2tuple_int', 'tokens_as_map', 'trunc_normal_init']


def to_2tuple_int(value, name):
    """``224`` or ``(224, 224)`` -> ``(224, 224)``; anything else is a clear error."""
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise TypeError(f'{name} must be an int or a pair of ints, got {value!r}')


def trunc_normal_init(module, layers=(nn.Linear,), std=.02):
    """The official ``_init_weights`` of every released model, applied with ``model.apply``.

    ``layers`` (Linear for PVT / Swin and their lineage, Conv2d for PolaFormer++) get
    trunc_normal(``std``) weights and zero biases; LayerNorms get (1, 0). Every other layer keeps
    PyTorch's default init, and learned zeros (``power``, ``scale``, ``positional_encoding``) stay
    zero, exactly as in the official code.
    """
    if isinstance(module, layers):
        trunc_normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.constant_(module.bias, 0)
    elif isinstance(module, nn.LayerNorm):
        nn.init.constant_(module.bias, 0)
        nn.init.constant_(module.weight, 1.0)


def tokens_as_map(tokens, hw):
    """(B, H*W, C) row-major tokens (or (B, H*W, h, d): their heads) -> their (B, C, H, W) map as a channels-last
    view: no copy for contiguous tokens, and a convolution of it returns a channels-last map (:func:`map_as_tokens`).
    Its image stride is H*W*C even for one image, so the library's convolutions see channels-last strides there
    too. While torch.compile records, a copy (:func:`mmpola.ops.dispatch.unviewed_when_compiling`: a convolution
    keeps its input map for the backward)."""
    # hw indexed: torch.fx traces it
    return unviewed_when_compiling(tokens.reshape(tokens.shape[0], hw[0], hw[1], -1).permute(0, 3, 1, 2))


def map_as_tokens(x):
    """(B, C, H, W) map -> (B, H*W, C) row-major tokens: a view, contiguous for a channels-last map."""
    return x.flatten(2).transpose(1, 2)


class _Crop(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, top, left, height, width):
        ctx.shape, ctx.box = x.shape, (top, left, height, width)
        return x[:, top:top + height, left:left + width].contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        top, left, height, width = ctx.box
        padded = grad.new_zeros(ctx.shape)
        padded[:, top:top + height, left:left + width] = grad
        return padded, None, None, None, None


def padded_side(side, multiple):
    """``side`` rounded up to a multiple of ``multiple`` (a map padded to whole windows, stripes or patches).

    Written as a product of the count, so that torch.compile's symbolic sizes (a detector's changing image
    sizes) divide by ``multiple`` exactly and hold no remainder, which it could neither compare without a guard
    nor carry into every later expression of the sizes."""
    return (side + multiple - 1) // multiple * multiple


def pad_image(x, multiple):
    """A (B, C, H, W) image zero-padded right and bottom to sides that are multiples of ``multiple`` (the patch
    embeddings' ``'corner'`` padding); as it is where they are."""
    H, W = x.shape[-2:]
    pad_h, pad_w = padded_side(H, multiple) - H, padded_side(W, multiple) - W
    if padding_needed(pad_h, pad_w):
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def crop_map(x, top, left, height, width):
    """``x[:, top:top + height, left:left + width].contiguous()`` of a (B, H, W, C) map (a padded map cropped
    back). Its backward pads the gradient with one zero fill and one copy, where the two slices' backward
    fills a zero tensor each and copies into both. While torch.compile records, the rows and columns are picked
    by index: a crop by slices would have it ask, forward or backward, whether the slices cut anything, a guard on
    the sizes with dynamic shapes (a detector's changing image sizes), and every map's answer a graph of its own."""
    if recording():
        rows = torch.arange(top, top + height, device=x.device)
        cols = torch.arange(left, left + width, device=x.device)
        return x.index_select(1, rows).index_select(2, cols)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x[:, top:top + height, left:left + width].contiguous()
    return _Crop.apply(x, top, left, height, width)


@register_notrace_module  # torch.fx leaf, as nn.Conv2d
class DepthwiseConv2d(nn.Conv2d):
    """``nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)`` for an odd
    ``kernel_size`` (same parameters and checkpoint keys) whose forward runs
    :func:`mmpola.ops.depthwise_conv2d` with the implementation that ``MMPOLA_DEPTHWISE_CONV`` names:
    ``'auto'`` (unset: the Triton kernels on a GPU, the library convolution elsewhere), ``'torch'`` (the
    library convolution) or ``'triton'``. Besides (B, C, H, W) maps it takes (B, G, C, H, W): G maps per
    image, convolved by the same kernels (see there).

    Its weight's gradient has the weight's own strides (contiguous) whatever the input's layout. The
    (C, 1, k, k) weight's gradient comes channels-last from a channels-last input, ``(k*k, 1, k, 1)``: the
    same memory as the contiguous ``(k*k, k*k, k, 1)``, only the stride of the size-1 dim differs, but DDP's
    gradient buckets take the parameter's strides, warn "Grad strides do not match bucket view strides" and
    copy the gradient on every backward. The models' maps are channels-last views of their tokens,
    contiguous maps, or strided views of a projection (CSWin's LePE), and the layout can differ between the
    calls of one module (CSWin's stripes), so the forward passes the weight through a view, whose backward
    gives the gradient contiguous strides (a view, no copy). For a map whose channels are its innermost axis
    (channels-last maps, views of a projection) that view has channels-last strides, so that the library
    convolution runs channels-last, as it does for such a map and weight (on the CPU several times faster
    than the NCHW copy it would make of a strided view); for other maps, the weight's own strides.

    ``forward(x, residual=None)``: ``residual + conv(x)`` (see :func:`mmpola.ops.depthwise_conv2d`)."""

    def __init__(self, channels, kernel_size, bias=True):
        if not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f'DepthwiseConv2d takes an odd kernel size (same padding at stride 1), got '
                             f'{kernel_size!r}')
        super().__init__(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, bias=bias)

    def forward(self, x, residual=None):
        if not isinstance(x, torch.Tensor):  # torch.fx proxies: the library convolution
            out = super().forward(x)
            return out if residual is None else residual + out
        weight = self.weight
        if x.stride(-3) == 1:  # channels innermost: a channels-last view of the weight
            weight = weight.view(weight.shape[0], *weight.shape[2:], 1).permute(0, 3, 1, 2)
        else:
            weight = weight.view(weight.shape)
        return depthwise_conv2d(x, weight, self.bias, depthwise_conv_impl(), residual=residual)


def resize_grid_embedding(embed, src_hw, dst_hw, mode='bilinear'):
    """Resize a learned grid embedding to another token grid.

    Args:
        embed: (1, Hs*Ws, C) embedding of a row-major Hs x Ws grid.
        src_hw: (Hs, Ws).
        dst_hw: (Hd, Wd) target grid.
        mode: ``'bilinear'`` (what the official forward does at run time) or ``'bicubic'`` (what
            the official fine-tuning loader does to checkpoints); align_corners is False.

    Returns:
        (1, Hd*Wd, C). The input itself when the grids are equal (exact identity, no copy).
    """
    src_hw, dst_hw = tuple(src_hw), tuple(dst_hw)
    if src_hw == dst_hw:
        return embed
    _, length, channels = embed.shape
    if length != src_hw[0] * src_hw[1]:
        raise ValueError(f'embedding has {length} tokens, which is not a {src_hw[0]}x{src_hw[1]} grid')
    grid = embed.reshape(1, src_hw[0], src_hw[1], channels).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=dst_hw, mode=mode, align_corners=False)
    return grid.flatten(2).transpose(1, 2)


# torch.fx records calls with traced sizes as one graph node (the sizes are known only at run time)
torch.fx.wrap('resize_grid_embedding')


class ParameterCache:
    """Remembers the last tensor (or tuple of tensors) made from parameters, such as a positional encoding
    resized to the run-time grid or several layers' weights concatenated.

    It depends on trainable parameters, so it is reused only without autograd (eval / inference), never while
    torch.compile, torch.export or torch.jit records the model (the computation belongs in their graph; their
    tensors have no storage to key on), and when none of them has been modified or moved since: a parameter's
    ``_version`` changes on an in-place update such as ``load_state_dict``, and every optimizer step drops what
    all caches keep (an optimizer hook; the fused optimizers update parameters without changing their versions).
    A plain attribute, not a buffer: it never enters a state dict, and copies (EMA models, ``deepcopy``) start
    empty.
    """

    # the caches that keep a tensor now, emptied by every optimizer step (_drop_kept_tensors)
    holding = weakref.WeakSet()

    def __init__(self):
        self.key = None
        self.value = None

    def get(self, params, key, make, enabled=True):
        """``make()``, or the tensor it made last for the same ``params`` (unchanged) and ``key``."""
        if not enabled or torch.is_grad_enabled() or recording():
            self.key = self.value = None
            return make()
        key = (key, torch.is_inference_mode_enabled(),
               tuple((p.data_ptr(), p._version, p.device, p.dtype) for p in params))
        if self.key != key:
            self.value = make()
            self.key = key
            ParameterCache.holding.add(self)
        return self.value

    def __deepcopy__(self, memo):
        return type(self)()

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.key = self.value = None


def _drop_kept_tensors(optimizer, args, kwargs):
    """After every optimizer step (any optimizer's): the caches keep no tensor made from the weights before it."""
    while ParameterCache.holding:
        cache = ParameterCache.holding.pop()
        cache.key = cache.value = None


register_optimizer_step_post_hook(_drop_kept_tensors)


class ResizedEmbeddingCache(ParameterCache):
    """The last run-time resize of a grid embedding (and its cast to another dtype)."""

    def get(self, param, src_hw, dst_hw, mode, enabled, dtype=None):
        """``param`` resized from grid ``src_hw`` to ``dst_hw`` (:func:`resize_grid_embedding`) in ``dtype``
        (``param``'s when None); kept for the next call where ``enabled`` (:class:`ParameterCache`)."""
        dtype = param.dtype if dtype is None else dtype
        if isinstance(dst_hw, torch.fx.Proxy):  # symbolic tracing
            return resize_grid_embedding(param, src_hw, dst_hw, mode).to(dtype)
        same = tuple(src_hw) == tuple(dst_hw)
        if same and dtype == param.dtype:
            return param
        return super().get((param, ), (tuple(dst_hw), dtype), lambda: (
            param if same else resize_grid_embedding(param, src_hw, dst_hw, mode)).to(dtype), enabled)


class SizeCache:
    """The last few tensors computed from a map size (least recently used out first).

    For tensors that depend on the run-time (H, W) but on no trainable parameter (RoPE tables of a
    buffer): a model called at the same sizes again (fixed training crops, the alternation of
    training and validation sizes) computes them once. ``key`` and ``buffer`` must name everything
    the tensor depends on: the sizes and the like in ``key``, the buffer it is made from in ``buffer``
    (its device, dtype, storage and version join the key). Nothing is kept while torch.compile,
    torch.export, torch.jit or an ONNX export records the model (the computation belongs in their graph;
    their tensors have no storage to key on), and tensors made in inference mode are kept apart (autograd
    refuses them). A plain attribute, never in a state dict; copies and pickles start empty.
    """

    def __init__(self, maxsize=4):
        self.maxsize = maxsize
        self.entries = OrderedDict()

    def get(self, key, make, buffer=None):
        """The tensor of ``key`` and ``buffer``: ``make()`` the first time (and after it fell out)."""
        if recording():
            return make()
        key = (key, None if buffer is None else (buffer.device, buffer.dtype, buffer.data_ptr(), buffer._version),
               torch.is_inference_mode_enabled())
        value = self.entries.get(key)
        if value is None:
            value = self.entries[key] = make()
            while len(self.entries) > self.maxsize:
                self.entries.popitem(last=False)
        else:
            self.entries.move_to_end(key)
        return value

    def __deepcopy__(self, memo):  # EMA copies / deepcopy must not share cached tensors
        return SizeCache(self.maxsize)

    def __getstate__(self):
        return {'maxsize': self.maxsize}

    def __setstate__(self, state):
        self.maxsize = state['maxsize']
        self.entries = OrderedDict()


def hooked(*modules):
    """Whether hooks would run around the call of one of ``modules``: forward hooks or pre-hooks, or backward
    hooks (a module's own or global ones, as ``nn.Module.__call__`` looks for them; None counts as no module). A
    fused path that would not call such a module, or would change what it takes or returns, calls the modules as
    they are instead, so that the hooks run and see their usual tensors and gradients."""
    if (torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
            or torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks):
        return any(module is not None for module in modules)
    for module in modules:  # a loop, not a generator: this runs several times in every block of every step
        if (getattr(module, '_forward_hooks', None) or getattr(module, '_forward_pre_hooks', None)
                or getattr(module, '_backward_hooks', None) or getattr(module, '_backward_pre_hooks', None)):
            return True
    return False


def _plain_linears(layers):
    """Whether ``layers`` are all plain ``nn.Linear`` modules of one input width and dtype, without hooks: one
    product with their weights concatenated computes what their calls compute."""
    first = layers[0]
    for layer in layers:  # a loop, not a generator: this runs in every block of every step
        if (type(layer) is not nn.Linear or layer.in_features != first.in_features
                or layer.weight.dtype != first.weight.dtype):
            return False
    return not hooked(*layers)


def _fused(x, *linears, elementwise=False):
    """Whether the input of linear layers made from ``x`` goes to the kernels of :mod:`mmpola.ops.recompute`:
    ``linears`` are plain ``nn.Linear`` s without hooks (:func:`_plain_linears`) and the recompute choice in force
    (``MMPOLA_RECOMPUTE`` or the backbone's) gives the LayerNorm's layers (the layers after an element-wise op with
    ``elementwise``) ``'triton'`` (:func:`mmpola.ops.recompute.recompute_layers_impl`)."""
    # the choice first: with the library's layers (the default) the step asks nothing more
    return recompute_layers_impl(elementwise) == 'triton' and _plain_linears(linears)


def _recomputes(x, linear, elementwise=True):
    """:func:`_fused` for a linear layer after an element-wise op (with ``elementwise``; else by the LayerNorm's
    layers' choice), where autograd records the call (the backward is what recomputes)."""
    return torch.is_grad_enabled() and _fused(x, linear, elementwise=elementwise)


def _gelu_recomputes(mlp, x):
    """Whether :func:`gelu_fc2` runs ``mlp``'s GELU and fc2 through :func:`mmpola.ops.gelu_linear` for the tokens
    ``x`` (or the hidden tokens made from them): where it recomputes (``_recomputes``; with
    ``MMPOLA_RECOMPUTE=triton`` or ``elementwise`` on a GPU), unless the dropout between them is on, the activation
    is not the exact GELU, or a module whose call the kernel replaces has hooks (the GELU, the dropout, fc1 whose
    bias the kernel adds)."""
    return (_recomputes(x, mlp.fc2) and not (mlp.training and mlp.drop.p > 0) and type(mlp.act) is nn.GELU
            and mlp.act.approximate == 'none' and not hooked(mlp.act, mlp.drop, getattr(mlp, 'fc1', None)))


def gelu_fc2(mlp, h, fc1_bias=None, recomputes=None):
    """``mlp.fc2(mlp.drop(mlp.act(h)))`` for an MLP with modules ``act`` (exact GELU), ``drop`` and ``fc2``:
    :func:`mmpola.ops.gelu_linear` where it recomputes (``recomputes``, by default ``_gelu_recomputes``: the
    backward keeps h only), else the modules. ``fc1_bias``: the bias of the layer that made h, left out of it,
    added before the GELU (where it recomputes only: :class:`Mlp`)."""
    if recomputes is None:
        recomputes = _gelu_recomputes(mlp, h)
    if recomputes:
        return gelu_linear(h, mlp.fc2.weight, mlp.fc2.bias, 'triton', input_bias=fc1_bias)
    return mlp.fc2(mlp.drop(mlp.act(h)))


def gated_proj_recomputes(s, proj, joins=False):
    """Whether :func:`gated_proj` multiplies s by the gate in :func:`mmpola.ops.gated_linear`'s kernels (else the
    library multiplies them before ``proj``). ``joins``: the caller's own kernels can multiply s by the gate, where
    they compute s (an attention's Function that takes the projection the gate is a view of); then the gate goes to
    gated_linear's kernels as the LayerNorm's layers go to theirs: with every layer's kernels (``'triton'``), not
    with ``'elementwise'``. In the attention's kernels the product costs no kernel and the projection keeps one
    gradient, where gated_linear's kernels add a product each way and autograd's stack of the projection's
    gradients, for one tensor of s's size less to keep."""
    return _recomputes(s, proj, elementwise=not joins)


def gated_proj(s, g, proj):
    """``proj(s * g)``: :func:`mmpola.ops.gated_linear` where it recomputes (:func:`gated_proj_recomputes`; with
    ``MMPOLA_RECOMPUTE=triton`` or ``elementwise`` on a GPU: the backward keeps s and g only, one kernel gives both
    their gradients); else the module."""
    if gated_proj_recomputes(s, proj):
        return gated_linear(s, g, proj.weight, proj.bias, 'triton')
    return proj(s * g)


# the first of several linear layers -> the ParameterCache of their weights and biases concatenated
_CONCATENATED = weakref.WeakKeyDictionary()


def _concatenated(layers, biased, x):
    """(weight, bias) of ``layers`` concatenated along their outputs (bias None where they have none). Without
    autograd (inference, evaluation) they are kept (:class:`ParameterCache`), in the dtype the layers compute
    in for x (under autocast its dtype): one forward makes them once, not one concatenation and cast per call."""
    dtype = autocast_dtype(x.device.type) or layers[0].weight.dtype
    weights, biases = [], []
    for layer in layers:  # a loop, not a comprehension: no Python call of its own (nor, for torch.compile, map)
        weights.append(layer.weight)
        if biased:
            biases.append(layer.bias)

    def make():
        return torch.cat(weights).to(dtype), torch.cat(biases).to(dtype) if biased else None

    # with autograd nothing is kept (an optimizer step drops what evaluation kept). While a graph is recorded the
    # dictionary is not even read: torch.compile would guard on its (weakly held, collectable) keys
    if torch.is_grad_enabled() or recording():
        return make()
    cache = _CONCATENATED.get(layers[0])
    if cache is None:
        cache = _CONCATENATED[layers[0]] = ParameterCache()
    return cache.get(weights + biases, (dtype, len(layers)), make)


def drop_path_scale(drop_path, x, dtype=None):
    """The factor per sample (B, ) that ``drop_path`` multiplies x (B, ...) by, drawn as timm's ``drop_path``
    draws it (the same random numbers, a tensor of x's dtype, or of ``dtype``: that of the tensor the module would
    get), or None where it passes x through: ``drop_path`` None, an ``nn.Identity``, or timm's ``DropPath`` in eval
    mode or with a zero rate. Only for those module types (others: TypeError)."""
    if drop_path is None or type(drop_path) is nn.Identity:
        return None
    if type(drop_path) is not DropPath:
        raise TypeError(f"drop_path_scale takes timm's DropPath or an nn.Identity, got {type(drop_path).__name__}")
    if not drop_path.training or drop_path.drop_prob == 0.:
        return None
    keep = 1 - drop_path.drop_prob
    scale = x.new_empty((x.shape[0], ) + (1, ) * (x.dim() - 1), dtype=dtype).bernoulli_(keep)
    if keep > 0. and drop_path.scale_by_keep:
        scale.div_(keep)
    return scale.view(-1)


def add_branch(x, branch, drop_path=None, gamma=None):
    """The residual connection ``x + drop_path(branch)``, or ``x + drop_path(gamma * branch)`` with a layer scale
    ``gamma`` (broadcastable to the branch), in the dtype those give.

    Where ``drop_path`` draws its factors as timm's ``DropPath`` does (:func:`drop_path_scale`: it, an
    ``nn.Identity`` or None, without hooks), in training with both a layer scale and stochastic depth the branch is
    multiplied once, by the product of the two small factors (one value per image and channel), where the modules
    multiply it by each: one kernel of the branch's size fewer in the forward and one in the backward (the
    gradients of the branch and of the factors are a product each, as the layer scale's are). Else (another
    module, hooks) the modules."""
    if not isinstance(branch, torch.Tensor) or not _draws_factors(drop_path):  # torch.fx proxies: the modules
        branch = branch if gamma is None else gamma * branch
        return x + (branch if drop_path is None else drop_path(branch))
    scale = drop_path_scale(drop_path, branch, None if gamma is None else promoted_dtype(gamma.dtype, branch.dtype))
    if scale is None:
        return x + (branch if gamma is None else gamma * branch)
    scale = scale.view(-1, *(1, ) * (branch.dim() - 1))  # in the product's dtype, as timm draws it
    return x + branch * (scale if gamma is None else gamma * scale)


def _draws_factors(drop_path):
    """Whether :func:`drop_path_scale` gives ``drop_path``'s factors (timm's DropPath, an nn.Identity or None,
    without hooks), so that a kernel can add the branch with them."""
    return type(drop_path) in (DropPath, nn.Identity, type(None)) and not hooked(drop_path)


def _kernel_norm(norm):
    """Whether the LayerNorm kernels of :mod:`mmpola.ops.recompute` can stand in for ``norm``: an ``nn.LayerNorm``
    of the last dim, with a weight and a bias, of at most ``NORM_MAX_CHANNELS`` channels, without hooks."""
    return (type(norm) is nn.LayerNorm and len(norm.normalized_shape) == 1 and norm.weight is not None
            and norm.bias is not None and norm.normalized_shape[0] <= NORM_MAX_CHANNELS and not hooked(norm))


def norm_linear(norm, linear, x, chunk=None, bias=True, branch=None, drop_path=None, repeat=(), stream=False):
    """``linear(norm(x))``: :func:`mmpola.ops.layer_norm_linear` where its kernels run (``_fused``; with
    ``MMPOLA_RECOMPUTE=triton`` on a GPU: the LayerNorm's kernel writes the rows in the linear layer's dtype, also
    without autograd, and the backward keeps x only and normalises it again) and ``norm`` is an ``nn.LayerNorm``
    of x's last dim with a weight and a bias, of at most ``NORM_MAX_CHANNELS`` channels; else the modules. ``norm``
    None: ``linear(x)``.

    ``linear`` may also be a tuple of linear layers of the normalised tokens, and ``chunk`` a channel count:
    then the operands of ``chunk`` channels that their outputs hold, one after another, as views (``chunk`` also
    takes a single layer's output apart), and after them those of ``repeat`` (at most one index) once more: an
    operand used twice, whose gradients the backward adds (:func:`mmpola.ops.layer_norm_linear`). One product
    with the layers' weights concatenated gives them all, on every path (plain ``nn.Linear`` layers of one
    input width and dtype without hooks; others are called one by one); where the kernels run, one kernel
    writes the product's gradient from theirs with its bias's.

    ``bias=False``: the single linear layer without its bias (its weight alone; the caller adds the bias).

    ``branch`` (x's shape): the residual connection before the norm, ``s = x + drop_path(branch)`` (``drop_path``
    timm's ``DropPath``, an ``nn.Identity`` or None); returns ``(s, linear(norm(s)))`` (with ``chunk``: s and
    the tuple of operands). Where the kernels run (``drop_path`` of those types) the LayerNorm's kernel adds the
    branch, with the factor per sample of stochastic depth (:func:`drop_path_scale`,
    :func:`mmpola.ops.add_layer_norm_linear`).

    ``stream=True`` (without a branch): returns ``(x, linear(norm(x)))`` too, x being the residual stream that
    goes on past the norm: where the kernels run, x comes back through the kernel's function
    (:func:`mmpola.ops.add_layer_norm_linear` without a branch), so that the gradient it gets from the layers after
    it joins the norm's in the LayerNorm's kernel; use the x returned. (So does the sum with a branch that the
    kernel does not add.)"""
    layers = linear if isinstance(linear, tuple) else (linear, )
    if (isinstance(linear, tuple) or repeat) and chunk is None:
        raise ValueError('norm_linear takes a tuple of linear layers, or repeats operands, with the chunk size of '
                         'their operands')
    if not bias and isinstance(linear, tuple):
        raise ValueError('norm_linear leaves out the bias of a single linear layer only')
    biased = {layer.bias is not None and bias for layer in layers}
    fused = len(biased) == 1 and _kernel_norm(norm) and _fused(x, *layers)
    add_in_kernel = fused and branch is not None and _draws_factors(drop_path)
    if branch is not None and not add_in_kernel:
        x = x + (branch if drop_path is None else drop_path(branch))
    returns_x = branch is not None or stream
    if fused:
        if len(layers) == 1:
            weight, layer_bias = layers[0].weight, layers[0].bias if bias else None
        else:
            weight, layer_bias = _concatenated(layers, biased == {True}, x)
        if not returns_x:
            return layer_norm_linear(x, norm.weight, norm.bias, norm.eps, weight, layer_bias, 'triton', chunk, repeat)
        branch = branch if add_in_kernel else None  # else x (the sum, where the branch was added) goes on as it is
        s, *result = add_layer_norm_linear(x, branch, norm.weight, norm.bias, norm.eps, weight, layer_bias, 'triton',
                                           drop_path_scale(drop_path, branch) if add_in_kernel else None, chunk,
                                           repeat)
        return s, (result[0] if chunk is None else tuple(result))
    y = x if norm is None else norm(x)
    if len(layers) > 1 and len(biased) == 1 and _plain_linears(layers):
        # one product with the weights concatenated (kept without autograd): one matrix product, one cast of the
        # weights under autocast and one set of gradient products in the backward, where each layer's call
        # would make its own
        outs = [F.linear(y, *_concatenated(layers, biased == {True}, y))]
    else:
        outs = [layer(y) if bias else F.linear(y, layer.weight) for layer in layers]
    if chunk is None:
        result = outs[0]
    else:
        result = [operand for out in outs for operand in (
            (out, ) if out.shape[-1] == chunk else out.unflatten(-1, (-1, chunk)).unbind(-2))]
        result = (*result, *[result[i] for i in repeat])
    return (x, result) if returns_x else result


def add_and_cast(x, branch, drop_path, dtype, as_map=False):
    """``(s, s.to(dtype))`` for the residual connection ``s = x + drop_path(branch)`` (``drop_path`` timm's
    ``DropPath``, an ``nn.Identity`` or None): a stage's last, whose sum the next stage reads in ``dtype``. Where
    the kernels of :mod:`mmpola.ops.recompute` run (``MMPOLA_RECOMPUTE=triton``, on a GPU) and ``drop_path`` is
    of those types, one kernel writes both (with the factor per sample of stochastic depth,
    :func:`drop_path_scale`; :func:`mmpola.ops.add_residual_and_cast`), s in the layout of its map with ``as_map``
    (tokens (B, H*W, C) that are a view of it); else the module and the library's addition and cast."""
    if _draws_factors(drop_path) and recompute_layers_impl(False) == 'triton':
        return add_residual_and_cast(x, branch, dtype, drop_path_scale(drop_path, branch), 'triton', as_map)
    s = x + (branch if drop_path is None else drop_path(branch))
    return s, s.to(dtype)


class Mlp(nn.Module):
    """fc1 -> GELU -> Dropout -> fc2 -> Dropout on (B, N, C) tokens (GELU to fc2: :func:`gelu_fc2`, which takes
    fc1's bias where it recomputes the GELU: its kernel adds the bias and sums its gradient).
    ``forward(x, norm=None, branch=None, drop_path=None)``: ``norm``, the block's LayerNorm before the MLP,
    applied to x first (LayerNorm to fc1: :func:`norm_linear`); with ``branch``, the residual connection before
    that norm: the MLP of ``s = x + drop_path(branch)``, returned as ``(s, out)`` (:func:`norm_linear`'s
    ``branch``)."""

    takes_branch = True  # forward(x, norm=, branch=, drop_path=): PreNormBlock passes its residual connection

    def __init__(self, in_features, hidden_features, drop=0.):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x, norm=None, branch=None, drop_path=None):
        recomputes = _gelu_recomputes(self, x)
        # fc1's bias goes to the GELU's kernel where it runs (gelu_linear's input_bias)
        fc1_bias = self.fc1.bias if recomputes and type(self.fc1) is nn.Linear else None
        h = norm_linear(norm, self.fc1, x, bias=fc1_bias is None, branch=branch, drop_path=drop_path)
        if branch is not None:
            x, h = h
        out = self.drop(gelu_fc2(self, h, fc1_bias, recomputes))
        return out if branch is None else (x, out)


def residual_mlp(mlp, x, branch, drop_path, norm, *args):
    """``(s, mlp(norm(s), *args))`` for the residual connection ``s = x + drop_path(branch)`` before a block's MLP:
    an MLP that ``takes_branch`` (:class:`Mlp`) adds it with its LayerNorm (in the norm's kernel where that runs),
    another gets ``norm=`` to apply; one with hooks gets the normalised tokens, as its hooks expect."""
    if hooked(mlp):
        s = x + drop_path(branch)
        return s, mlp(norm(s), *args)
    if getattr(mlp, 'takes_branch', False):
        return mlp(x, *args, norm=norm, branch=branch, drop_path=drop_path)
    s = x + drop_path(branch)
    return s, mlp(s, *args, norm=norm)


class PreNormBlock(nn.Module):
    """Pre-norm transformer block of PVT, PVTv2, Swin and the ViT: x + DropPath(Attn(LN(x), hw, **context)),
    then x + DropPath(MLP(LN(x))); LayerNorm eps ``norm_eps`` (1e-6; Swin's 1e-5).

    ``attn``: any attention kind (``attn(x, hw, **context)``); ``mlp_layer``: :class:`Mlp`, or an MLP that
    takes the map size too (``takes_hw = True``, as PVTv2's ConvMlp with its depthwise conv); the MLP gets
    ``norm2`` to apply (``norm=``), so that its fc1 can take the LayerNorm with it (:func:`norm_linear`), and
    so does an attention whose projections can (``takes_norm``: Pola's and FLatten's, without a spatial
    reduction). An MLP that ``takes_branch`` (both) also gets the attention's output and ``drop_path``, and
    adds them to x before its LayerNorm (``branch=``): in the norm's kernel where it runs.

    Between blocks (:func:`~mmpola.models.backbones.run_blocks`) the same goes for the MLP's output and the
    next block's ``norm1``: ``forward(..., defer=True)`` returns ``(x, mlp, drop_path)``, the last residual
    connection not added, and ``forward(..., residual=(branch, drop_path))`` takes the previous block's, its
    input being ``x + drop_path(branch)``; an attention that ``takes_branch`` adds it with the LayerNorm before
    its projections (:attr:`takes_residual`), else the block adds it first. Without one, such an attention
    returns x itself through that LayerNorm's function (``stream=True``), so that the gradient x gets from the
    rest of the block joins the norm's in its kernel.
    An attention or MLP with hooks is called on the normalised tokens and returns its output alone, as
    the hooks expect; a hooked norm, linear layer, GELU or drop path is called as it is (:func:`hooked`).
    Shapes: ``forward(x, hw, **context)``: (B, N, C), (H, W) -> (B, N, C).
    """

    defers_residual = True  # forward(..., defer=True)

    def __init__(self, dim, attn, mlp_ratio=4., drop=0., drop_path=0., mlp_layer=Mlp, norm_eps=1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio), drop=drop)
        self.mlp_takes_hw = getattr(mlp_layer, 'takes_hw', False)

    @property
    def takes_residual(self):
        """True where the attention adds the previous block's residual connection with ``norm1``
        (``takes_branch``): where the block's input is a sum that nothing else needs before that norm."""
        return getattr(self.attn, 'takes_branch', False)

    def forward(self, x, hw, residual=None, defer=False, **context):
        attn_hooked = hooked(self.attn)  # its hooks see the usual input (the normalised tokens) and output
        if residual is not None and self.takes_residual and not attn_hooked:  # with the norm before its projections
            branch, drop_path = residual
            x, attn = self.attn(x, hw, norm=self.norm1, branch=branch, drop_path=drop_path, **context)
        else:
            if residual is not None:
                branch, drop_path = residual
                x = x + drop_path(branch)
            if attn_hooked:
                attn = self.attn(self.norm1(x), hw, **context)
            elif self.takes_residual:  # x comes back through its projection's LayerNorm kernel (stream)
                x, attn = self.attn(x, hw, norm=self.norm1, stream=True, **context)
            elif getattr(self.attn, 'takes_norm', False):  # its projection takes the LayerNorm with it
                attn = self.attn(x, hw, norm=self.norm1, **context)
            else:
                attn = self.attn(self.norm1(x), hw, **context)
        x, mlp = residual_mlp(self.mlp, x, attn, self.drop_path, self.norm2, *((hw, ) if self.mlp_takes_hw else ()))
        if defer:
            return x, mlp, self.drop_path
        return x + self.drop_path(mlp)


@register_notrace_module  # torch.fx leaf: padding and (H, W) depend on the input size
class PatchEmbed(nn.Module):
    """Non-overlapping patch embedding: Conv2d(k = s = patch_size) -> flatten -> LayerNorm.

    Args:
        in_chans: input channels.
        embed_dim: output channels C.
        patch_size: kernel and stride.
        pad: ``False`` (PVT): sizes floor, ``H' = H // p`` as in the official and mmdet PVT.
            ``True`` (Swin): zero-pad right/bottom to a multiple of ``p`` first, so
            ``H' = ceil(H / p)`` as in mmdet's Swin (``padding='corner'``).
        norm_eps: LayerNorm eps (1e-5 in both official models).

    Shapes: (B, in_chans, H, W) -> tokens (B, H'*W', C) and (H', W').
    """

    def __init__(self, in_chans, embed_dim, patch_size, pad=False, norm_eps=1e-5):
        super().__init__()
        self.patch_size = patch_size
        self.pad = pad
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)

    def project(self, x):
        """The convolution's output map (B, embed_dim, H', W') (the input padded first where ``pad``)."""
        return self.proj(pad_image(x, self.patch_size) if self.pad else x)

    def forward(self, x):
        x = self.project(x)
        hw = tuple(x.shape[-2:])
        x = self.norm(x.flatten(2).transpose(1, 2))
        return x, hw

    def embed_and_add(self, x, encoding, dropout=None):
        """``(dropout(tokens + encoding(hw)), hw)`` for ``tokens, hw = self(x)``: ``encoding`` gives the tokens'
        positional encoding ((1, H'*W', C) or (H'*W', C)) for their map size. Where the kernels of
        :mod:`mmpola.ops.recompute` run (``MMPOLA_RECOMPUTE=triton``, on a GPU), the norm is an ``nn.LayerNorm``
        and nothing is hooked or dropped, :func:`mmpola.ops.layer_norm_add` normalises the convolution's output
        where it wrote it and adds the encoding in one kernel; else the modules and the library's addition."""
        norm = self.norm  # the implementation first: 'torch' while a tracer records (its proxies have no values)
        if (recompute_layers_impl(False) != 'triton' or not _kernel_norm(norm)
                or hooked(self, dropout) or (dropout is not None and dropout.training and dropout.p > 0)):
            x, hw = self(x)
            x = x + encoding(hw)
            return (x if dropout is None else dropout(x)), hw
        x = self.project(x)
        hw = tuple(x.shape[-2:])
        return layer_norm_add(x.flatten(2).transpose(1, 2), norm.weight, norm.bias, norm.eps, encoding(hw),
                              'triton'), hw


@register_notrace_module  # torch.fx leaf: odd sizes are padded
class PatchMerging(nn.Module):
    """2x2 patch merging of token grids with the official phase order (odd sides padded).

    Concatenates the phases (row0, col0), (row1, col0), (row0, col1), (row1, col1) -> ``norm``
    LayerNorm(4C) -> ``reduction`` Linear(4C, 2C, no bias). Odd H or W are zero-padded by one
    row/column at the bottom/right first.

    Shapes: ``forward(x, hw)``: (B, H*W, C), (H, W) -> (B, H'*W', 2C), (H', W') = ceil((H, W) / 2).
    """

    def __init__(self, dim, norm_eps=1e-5):
        super().__init__()
        self.dim = dim
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim, eps=norm_eps)

    def forward(self, x, hw):
        B, L, C = x.shape
        H, W = hw
        x = x.view(B, H, W, C)
        Hp, Wp = padded_side(H, 2), padded_side(W, 2)  # odd sides padded by one
        pad_b, pad_r = Hp - H, Wp - W
        out_hw = (Hp // 2, Wp // 2)
        if padding_needed(pad_b, pad_r):
            x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        # the four phases in one permutation (one copy each way; strided slices and their concatenation
        # would fill a zero tensor of the map's size per slice in the backward): (B, H', row, W', col, C) ->
        # (B, H', W', col, row, C), so channel group col * 2 + row, the official concatenation's order
        x = x.view(B, out_hw[0], 2, out_hw[1], 2, C).permute(0, 1, 3, 4, 2, 5).reshape(B, -1, 4 * C)
        return norm_linear(self.norm, self.reduction, x), out_hw
