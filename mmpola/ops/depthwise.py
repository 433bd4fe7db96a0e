"""Depthwise convolution of the token maps: one public function with a choice of implementation.

:func:`depthwise_conv2d` computes ``F.conv2d(x, weight, bias, padding=k // 2, groups=C)`` for an odd
k x k kernel at stride 1 (the value term of Pola / FLatten attention, CSWin's LePE, PolaFormer++'s
positional conv, LePE and FFN conv, PVTv2's MLP conv; :class:`mmpola.models.layers.DepthwiseConv2d` calls
it; InLine's local residual with kernels of its own per image, ``per_sample=True``). Its implementations:

* ``'torch'``: ``F.conv2d`` (cuDNN on CUDA);
* ``'triton'``: the Triton kernels of mmpola/ops/depthwise_triton.py, forward and backward, on CUDA
  (and under ``TRITON_INTERPRET=1`` on the CPU, for tests). They are compiled once per dtype, kernel
  size and channel bucket, and the map size is data to them, whereas the library convolution builds an
  execution plan for each new input shape (cuDNN's depthwise plans may compile kernels at run time):
  a detector's image size changes at every training iteration;
* ``'auto'``: the Triton kernels on CUDA tensors where they run (compute capability 8.0 or newer; not
  while torch.compile, torch.jit.trace or an ONNX export records the model), else the library
  convolution. docs/benchmarks.md has the commands that compare the two at fixed and at new shapes.

The implementation is chosen per call by ``impl``; :class:`~mmpola.models.layers.DepthwiseConv2d`
passes the value of the environment variable ``MMPOLA_DEPTHWISE_CONV`` (``'auto'`` when unset), so a
training run or a benchmark switches every depthwise conv of a model at once.
"""
import torch.nn.functional as F

from .depthwise_triton import depthwise_conv2d_triton
from .dispatch import implementation_from_env, recording, unviewed_when_compiling
from .triton_support import dry_running, triton_unsupported

__all__ = ['DEPTHWISE_IMPLS', 'auto_impl', 'depthwise_conv2d', 'depthwise_conv_impl', 'heads_as_maps', 'library_conv']

DEPTHWISE_IMPLS = ('auto', 'torch', 'triton')
ENV = 'MMPOLA_DEPTHWISE_CONV'


def depthwise_conv_impl():
    """The implementation asked for by ``MMPOLA_DEPTHWISE_CONV`` (``'auto'`` when unset); an unknown name
    is one clear error."""
    return implementation_from_env(ENV, DEPTHWISE_IMPLS, 'the depthwise convolution')


def _check(x, weight, bias, per_sample):
    dims = (4, ) if per_sample else (4, 5)
    B, C = (x.shape[0], x.shape[-3]) if x.dim() in dims else (None, None)
    expected = (B, C) if per_sample else (C, 1)
    if x.dim() not in dims or weight.dim() != 4 or tuple(weight.shape[:2]) != expected:
        layout = '(B, C, k, k), one kernel per image and channel' if per_sample else '(C, 1, k, k)'
        maps = '(B, C, H, W)' if per_sample else '(B, C, H, W) or (B, G, C, H, W)'
        raise ValueError(f'depthwise_conv2d expects x {maps} and weight {layout}, got {tuple(x.shape)} and '
                         f'{tuple(weight.shape)}')
    k = weight.shape[-1]
    if weight.shape[-2] != k or k % 2 == 0:
        raise ValueError(f'depthwise_conv2d expects an odd square kernel, got {tuple(weight.shape[-2:])}')
    if bias is not None and tuple(bias.shape) != ((B, C) if per_sample else (C, )):
        raise ValueError(f'depthwise_conv2d expects a bias of shape {(B, C) if per_sample else (C, )}, got '
                         f'{tuple(bias.shape)}')


def heads_as_maps(t, hw):
    """(B, h, H*W, d) per-head tokens -> their (B, h, d, H, W) maps, a view: the G = h maps per image that
    :func:`depthwise_conv2d` convolves by the same kernels (the attentions' values, one map per head)."""
    return t.unflatten(2, hw).permute(0, 1, 4, 2, 3)


def auto_impl(x):
    """What ``'auto'`` runs on ``x``: ``'triton'`` for CUDA tensors of float32 / float16 / bfloat16 where the
    kernels run (inside :func:`~mmpola.ops.triton_support.dry_run`: as on its GPU), unless a tracer records
    the call; else ``'torch'``."""
    if not (x.is_cuda or dry_running()) or recording():
        return 'torch'
    return 'triton' if triton_unsupported(x.device, x.dtype) is None else 'torch'  # it checks the dtype too


def library_conv(x, weight, bias=None, per_sample=False):
    """The library convolution of :func:`depthwise_conv2d` (``'torch'``): per-image kernels as one grouped
    convolution of the images' channels side by side; G maps per image (x (B, G, C, H, W)) as B * G images,
    copied channels-last when their strides do not merge (the output: channels-last, seen as (B, G, C, H, W))."""
    k = weight.shape[-1]
    if x.dim() == 5:
        B, G, C, H, W = x.shape
        # the convolution keeps its input for the backward: while torch.compile records, a copy, no view
        # (unviewed_when_compiling: inductor cannot order a channels-last view's strides at symbolic sizes)
        images = unviewed_when_compiling(x.permute(0, 1, 3, 4, 2).reshape(B * G, H, W, C).permute(0, 3, 1, 2))
        return library_conv(images, weight, bias).unflatten(0, (B, G))
    if not per_sample:
        return F.conv2d(x, weight, bias, padding=k // 2, groups=weight.shape[0])
    B, C, H, W = x.shape
    out = F.conv2d(x.reshape(1, B * C, H, W), weight.reshape(B * C, 1, k, k),
                   None if bias is None else bias.reshape(B * C), padding=k // 2, groups=B * C)
    return out.reshape(B, C, H, W)


def depthwise_conv2d(x, weight, bias=None, impl='auto', per_sample=False, residual=None):
    """``F.conv2d(x, weight, bias, padding=k // 2, groups=C)``: x (B, C, H, W), weight (C, 1, k, k), k odd.

    x may also be (B, G, C, H, W): G maps per image, each convolved by the same kernels (the heads of an
    attention's values, seen in place in their projection: the Triton kernels read the maps through both
    strides, where the library convolution needs one copy of them as B * G images).

    ``per_sample``: each image its own kernels, weight (B, C, k, k) and bias None or (B, C) (InLine's
    local residual, whose kernels are predicted per image). ``impl``: ``'auto'`` (:func:`auto_impl`: the
    Triton kernels on a GPU, else the library), ``'torch'`` or ``'triton'`` (CUDA tensors; a clear error
    where the kernels cannot run). Under autocast the Triton path takes the autocast dtype, as the
    convolution does. The Triton path returns a channels-last output (the library's is channels-last for
    a channels-last input with shared kernels).

    ``residual``: ``residual + conv``, residual of the output's shape (the attention output that Pola's and
    FLatten's value term and InLine's local residual are added to). The Triton path adds it where its kernel
    writes the output, in the residual's layout, when the two share a dtype: one kernel and no tensor of the
    convolution alone.
    """
    if impl not in DEPTHWISE_IMPLS:
        raise ValueError(f'impl must be one of {", ".join(DEPTHWISE_IMPLS)}, got {impl!r}')
    if impl == 'auto':
        impl = auto_impl(x)
    if impl == 'triton' or x.dim() == 5:
        _check(x, weight, bias, per_sample)
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f'depthwise_conv2d takes a residual of the output\'s shape {tuple(x.shape)}, got '
                         f'{tuple(residual.shape)}')
    if impl == 'triton' and x.numel():  # an empty input has nothing to launch: the library gives its empty output
        return depthwise_conv2d_triton(x, weight, bias, per_sample, residual)
    out = library_conv(x, weight, bias, per_sample)
    return out if residual is None else residual + out
