"""Injective linear attention (InLine, NeurIPS 2024): kind ``'inline'``, letter ``'I'``."""
import torch.nn as nn
from timm.layers import register_notrace_module

from mmpola.ops import check_attn_impl, depthwise_conv2d, depthwise_conv_impl, inline_attention
from mmpola.ops.value_term_triton import inline_value_term_triton, value_term_joins
from mmpola.registry import ATTENTIONS

from .grid_terms import add_to_patches
from .projections import QKVProjections, check_attention_args

__all__ = ['InLineAttention']


@ATTENTIONS.register_module(name='inline')
@register_notrace_module  # torch.fx leaf: custom autograd core, per-image kernels
class InLineAttention(QKVProjections, nn.Module):
    """Injective linear attention over one whole H x W token grid.

    * ``qkv_layout='fused'`` (InLine-Swin, InLine-DeiT): ``qkv`` Linear(C, 3C).
    * ``qkv_layout='separate'`` (InLine-PVT): ``q`` Linear(C, C) and ``kv`` Linear(C, 2C).
    * ``qkv_layout='projected'`` (InLine-CSWin): x holds the projected q, k, v (B, N, 3, C), or is
      the tuple of the three (B, N, C); no ``proj`` (the CSWin block owns both projections), and the
      tokens the residual kernels are predicted from come as ``x_mean`` (B, C) in the call context
      (CSWin: the mean of the block input).

    The core (:func:`mmpola.ops.inline_attention`, identity kernel) is followed by a local residual:
    a 3x3 depthwise conv over v whose kernels are predicted per image and channel from the mean
    token by ``residual`` (grouped 1x1 Conv1d(C, C) -> GELU -> Conv1d(C, 9C)); then ``proj``. There
    is no positional encoding and no spatial reduction (the official model has none in any release).

    Where the core and the depthwise convolution both run in their Triton kernels (a GPU's default) and no prefix
    tokens come first, the module calls them through one autograd Function
    (:func:`~mmpola.ops.value_term_triton.inline_value_term_triton`), as Pola and FLatten attention their value
    term.

    Prefix tokens (``num_prefix_tokens``, the ViT's class token, as the official InLine-DeiT): they
    take part in the core and in the mean token; the residual conv runs on the grid tokens' v and is
    added to the grid tokens only.

    Args:
        dim, num_heads, qkv_layout, qkv_bias, proj_drop, attn_impl, fp32_attn: as in
            :class:`~mmpola.models.attention.PolaAttention` (``attn_impl``: implementations of
            :func:`mmpola.ops.inline_attention`).
        sr_ratio: must be 1.

    Shapes: ``forward(x, hw, num_prefix_tokens=0, x_mean=None)`` with x (B, P + H*W, C)
    (``'projected'``: (B, N, 3, C)), hw = (H, W) -> (B, P + H*W, C).
    """

    letter = 'I'
    title = 'InLine'
    paper = 'InLine'
    citation = 'InLine attention, NeurIPS 2024'
    paper_title = 'Bridging the Divide: Reconsidering Softmax and Linear Attention'
    paper_url = 'https://github.com/LeapLabTHU/InLine'
    op = 'inline'
    qkv_layouts = ('fused', 'separate', 'projected')
    prefix_tokens = True

    def __init__(self, dim, num_heads, qkv_layout='fused', qkv_bias=True, sr_ratio=1, proj_drop=0., attn_impl='auto',
                 fp32_attn=True):
        super().__init__()
        check_attention_args(dim, num_heads, qkv_layout)
        if sr_ratio != 1:
            raise ValueError(f'InLine attention has no spatial reduction (got sr_ratio={sr_ratio}); use '
                             "la_sr_ratios='1111' as every released InLine model")
        self.dim = dim
        self.num_heads = num_heads
        self.qkv_layout = qkv_layout
        self.attn_impl = check_attn_impl(attn_impl, op=self.op)
        self.fp32_attn = fp32_attn
        self._init_input_projections(dim, qkv_layout, qkv_bias)
        self._init_output_projection(dim, qkv_layout, proj_drop)
        self.residual = nn.Sequential(
            nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads),
            nn.GELU(),
            nn.Conv1d(dim, dim * 9, kernel_size=1, groups=num_heads))

    def forward(self, x, hw, num_prefix_tokens=0, x_mean=None, **context):
        H, W = hw
        P = num_prefix_tokens
        if self.qkv_layout == 'projected':
            if x_mean is None:
                raise ValueError("InLine attention with qkv_layout='projected' needs x_mean (B, C) in the call "
                                 'context: the mean token its residual kernels are predicted from')
        (q, k, v), _ = self._project_inputs(x, hw)
        B, N, C = q.shape
        if x_mean is None:
            x_mean = x.mean(dim=1)
        kernels = self.residual(x_mean.unsqueeze(-1)).reshape(B, C, 3, 3)
        if not P and value_term_joins(self.op, self.attn_impl, self.fp32_attn, depthwise_conv_impl(), q, k, v, v,
                                      kernels, self.num_heads):
            return self._project_output(inline_value_term_triton(q, k, v, v, self.num_heads, kernels, hw))
        out = inline_attention(q, k, v, self.num_heads, fp32=self.fp32_attn, impl=self.attn_impl)
        v = v[:, P:].reshape(B, H, W, C).permute(0, 3, 1, 2)
        # the kernels of each image on its own channels (MMPOLA_DEPTHWISE_CONV picks the implementation)
        if P:
            local = depthwise_conv2d(v, kernels.to(v.dtype), None, depthwise_conv_impl(), per_sample=True)
            out = add_to_patches(out, local.flatten(2).transpose(1, 2), P)
        else:  # added to the core's output where the conv writes it, in the output's tokens layout
            residual = out.transpose(1, 2).unflatten(2, (H, W))
            out = depthwise_conv2d(v, kernels.to(v.dtype), None, depthwise_conv_impl(), per_sample=True,
                                   residual=residual).flatten(2).transpose(1, 2)
        return self._project_output(out)

    def extra_repr(self):
        return (f'dim={self.dim}, num_heads={self.num_heads}, qkv_layout={self.qkv_layout!r}, '
                f'attn_impl={self.attn_impl!r}')
