"""torch's ``scaled_dot_product_attention`` for the softmax kinds, with the choice of its backends made for
inputs whose shapes change.

On GPUs of compute capability 9.0 and 10.0 (H100, H200, B200) recent torch releases try cuDNN's attention
first wherever the mask needs no gradient: in training the kinds without a learned mask (PVT's and PVTv2's
spatial reduction, CSWin's stripes, PolaFormer++'s RoPE softmax, the ViT; Swin's windows add their learned
relative position bias, which cuDNN's attention does not differentiate), in evaluation and inference every
kind. cuDNN builds an execution graph for every new combination of the operands' shapes and strides, and
that build takes far longer than the attention itself (a few hundred milliseconds for a forward or a
backward is commonly reported). A detector's input size changes at nearly every training iteration with
multi-scale resizing and cropping, and from image to image at test time with keep-ratio resizing, and with it
the token count of a stage, the number of its windows or stripes, and so every softmax block's shapes: with
cuDNN first, each new size pays those builds, for every block shape.

:func:`scaled_dot_product_attention` is ``F.scaled_dot_product_attention`` with these implementations,
named by the environment variable ``MMPOLA_SDPA`` (``'auto'`` when unset):

* ``'auto'``: on CUDA tensors, torch's backends without cuDNN's attention (flash, memory-efficient and
  the unfused math, in torch's order; on GPUs where torch does not put cuDNN first this is torch's own
  choice), each enabled only as far as the user's settings (``torch.backends.cuda.enable_*_sdp``) enable
  it; elsewhere, and while torch.compile, torch.export or a tracer records the model
  (:func:`~mmpola.ops.dispatch.recording`: the graph they record makes its own choice), torch's choice;
* ``'torch'``: torch's choice everywhere (cuDNN first where torch puts it first), e.g. for inputs of
  fixed shapes, where cuDNN builds its graphs once.

docs/benchmarks.md has the commands that compare the two in training.

On the CPU, bfloat16 inputs go to torch's unfused math backend where torch's fused CPU kernel refuses them:
some torch builds (2.13) fail every bfloat16 call of it with "pack_vnni2 is only supported when avx512 is
supported" on CPUs with AMX / AVX-512 BF16 when ``ATEN_CPU_CAPABILITY`` caps the kernels below AVX-512. One
small call with its backward, at the first bfloat16 CPU call of the process, tells which.
"""
import torch
import torch.nn.functional as F

from .dispatch import implementation_from_env, recording

__all__ = ['SDPA_IMPLS', 'scaled_dot_product_attention', 'sdpa_impl']

SDPA_IMPLS = ('auto', 'torch')
ENV = 'MMPOLA_SDPA'


def sdpa_impl():
    """The implementation asked for by ``MMPOLA_SDPA`` (``'auto'`` when unset); an unknown name is one clear
    error."""
    return implementation_from_env(ENV, SDPA_IMPLS, "the softmax kinds' scaled_dot_product_attention")


# whether torch's fused CPU attention runs bfloat16 inputs here: None until the first such call asks
_CPU_BF16_FUSED = None


def _cpu_bf16_fused_runs():
    """Whether torch's fused CPU attention takes bfloat16 inputs in this process (asked once: a forward and
    backward of 256 tokens, more than its blocks of queries and keys, below which it takes another path)."""
    global _CPU_BF16_FUSED
    if _CPU_BF16_FUSED is None:
        try:  # its own generator (the process's random state stays as it is), autograd on whatever the caller's mode
            with torch.inference_mode(False), torch.enable_grad():
                q = torch.randn(1, 1, 256, 32, generator=torch.Generator().manual_seed(0)).bfloat16().requires_grad_()
                F.scaled_dot_product_attention(q, q, q).float().sum().backward()
            _CPU_BF16_FUSED = True
        except RuntimeError:
            _CPU_BF16_FUSED = False
    return _CPU_BF16_FUSED


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=None, impl=None):
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)``,
    under ``impl`` (:func:`sdpa_impl` when None): with ``'auto'``, on CUDA tensors, cuDNN's attention is left
    out of torch's choice of backend for this call (the backward runs the backend of its forward). Eager
    mode only: torch's switch is a process-wide flag, set back when the call returns or raises."""
    if impl is not None and impl not in SDPA_IMPLS:
        raise ValueError(f'impl must be one of {", ".join(SDPA_IMPLS)}, got {impl!r}')
    if q.is_cuda and torch.backends.cuda.cudnn_sdp_enabled() and not recording() and \
            (impl or sdpa_impl()) == 'auto':
        torch.backends.cuda.enable_cudnn_sdp(False)
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
        finally:
            torch.backends.cuda.enable_cudnn_sdp(True)
    if q.dtype is torch.bfloat16 and _CPU_BF16_FUSED is not True and q.device.type == 'cpu' and \
            not _cpu_bf16_fused_runs() and not recording():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
