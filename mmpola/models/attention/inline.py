"""Injective linear attention (InLine, NeurIPS 2024): kind ``'inline'``, letter ``'I'``."""
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_module

from mmpola.ops import check_attn_impl, inline_attention
from mmpola.registry import ATTENTIONS

from .common import check_attention_args

__all__ = ['InLineAttention']


@ATTENTIONS.register_module(name='inline')
@register_notrace_module  # torch.fx leaf: custom autograd core, per-image kernels
class InLineAttention(nn.Module):
    """Injective linear attention over one whole H x W token grid.

    * ``qkv_layout='fused'`` (InLine-Swin): ``qkv`` Linear(C, 3C).
    * ``qkv_layout='separate'`` (InLine-PVT): ``q`` Linear(C, C) and ``kv`` Linear(C, 2C).

    The core (:func:`mmpola.ops.inline_attention`, identity kernel) is followed by a local residual:
    a 3x3 depthwise conv over v whose kernels are predicted per image and channel from the mean
    token by ``residual`` (grouped 1x1 Conv1d(C, C) -> GELU -> Conv1d(C, 9C)); then ``proj``. There
    is no positional encoding and no spatial reduction (the official model has none in any release).

    Args:
        dim, num_heads, qkv_layout, qkv_bias, proj_drop, attn_impl, fp32_attn: as in
            :class:`~mmpola.models.attention.PolaAttention` (``attn_impl``: implementations of
            :func:`mmpola.ops.inline_attention`).
        sr_ratio: must be 1.

    Shapes: ``forward(x, hw)`` with x (B, N, C), hw = (H, W), N = H * W -> (B, N, C).
    """

    letter = 'I'
    title = 'InLine'
    paper = 'InLine'

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
        self.attn_impl = check_attn_impl(attn_impl, op='inline')
        self.fp32_attn = fp32_attn
        if qkv_layout == 'fused':
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        else:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.residual = nn.Sequential(
            nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads),
            nn.GELU(),
            nn.Conv1d(dim, dim * 9, kernel_size=1, groups=num_heads))

    def forward(self, x, hw, **context):
        B, N, C = x.shape
        H, W = hw
        if self.qkv_layout == 'fused':
            q, k, v = self.qkv(x).reshape(B, N, 3, C).unbind(2)
        else:
            q = self.q(x)
            k, v = self.kv(x).reshape(B, N, 2, C).unbind(2)
        kernels = self.residual(x.mean(dim=1).unsqueeze(-1)).reshape(B * C, 1, 3, 3)
        out = inline_attention(q, k, v, self.num_heads, fp32=self.fp32_attn, impl=self.attn_impl)
        v = v.reshape(B, H, W, C).permute(0, 3, 1, 2).reshape(1, B * C, H, W)
        local = F.conv2d(v, kernels.to(v.dtype), None, padding=1, groups=B * C)
        out = out + local.reshape(B, C, N).permute(0, 2, 1)
        return self.proj_drop(self.proj(out))

    def extra_repr(self):
        return f'dim={self.dim}, num_heads={self.num_heads}, attn_impl={self.attn_impl!r}'
