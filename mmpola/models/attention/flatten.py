"""Focused linear attention (FLatten Transformer, ICCV 2023): kind ``'flatten'``."""
import torch
import torch.nn as nn
from timm.layers import register_notrace_module

from mmpola.ops import check_attn_impl, flatten_attention
from mmpola.ops.value_term_triton import flatten_value_term_triton
from mmpola.registry import ATTENTIONS

from ..layers import DepthwiseConv2d
from .grid_terms import JoinedValueTerm, KeyPositionalEncoding, add_to_patches, depthwise_value_term
from .projections import QKVProjections, check_attention_args, reduced_grid

__all__ = ['FocusedLinearAttention']


@ATTENTIONS.register_module(name='flatten')
@register_notrace_module  # torch.fx leaf: custom autograd core, size-dependent resize and cache
class FocusedLinearAttention(JoinedValueTerm, KeyPositionalEncoding, QKVProjections, nn.Module):
    """Focused linear attention over one whole H x W token grid.

    * ``qkv_layout='fused'`` (FLatten-Swin, the ViT): ``qkv`` Linear(C, 3C) gives q, k, v.
    * ``qkv_layout='separate'`` (FLatten-PVT, -PVTv2): ``q`` Linear(C, C); ``kv`` Linear(C, 2C) gives
      k, v from the map, spatially reduced first by ``sr`` / ``norm`` when ``sr_ratio > 1``.
    * ``qkv_layout='projected'`` (FLatten-CSWin): x holds the projected q, k, v (B, N, 3, C), or is
      the tuple of the three (B, N, C); no ``proj`` (the CSWin block owns both projections).

    k gets the learned ``positional_encoding`` (stored on the pretraining key grid, bilinearly
    resized to the real key grid when they differ); the core (:func:`mmpola.ops.flatten_attention`)
    applies the focusing feature map with the per-channel temperature ``softplus(scale)``; a
    depthwise conv ``dwc`` (d channels, shared by the heads) on v is added, then ``proj`` (where the core and
    ``dwc`` both run in their Triton kernels, through one autograd Function:
    :func:`~mmpola.ops.value_term_triton.flatten_value_term_triton`).

    Prefix tokens (``num_prefix_tokens`` in the call context, the ViT's class token): they take part
    in the core as queries and keys; the positional encoding and ``dwc`` act on the grid tokens only.

    Args:
        dim, num_heads, pe_grid, qkv_layout, qkv_bias, sr_ratio, proj_drop, attn_impl, fp32_attn,
            kernel_size, v_upsample: as in :class:`~mmpola.models.attention.PolaAttention`
            (``attn_impl``: implementations of :func:`mmpola.ops.flatten_attention`).
        focusing_factor: option; the power f of the focusing function (3 in every released model).

    Shapes: ``forward(x, hw, num_prefix_tokens=0, **inputs)`` with x (B, P + H*W, C) (``'projected'``:
    (B, N, 3, C)), hw = (H, W) -> (B, P + H*W, C); ``inputs``: the block's LayerNorm and residual connection
    that the projections take with them (``norm``, ``branch``, ``drop_path``, ``stream``:
    :meth:`~mmpola.models.attention.projections.QKVProjections._project_inputs`), with which the output is
    ``(x + drop_path(branch), out)`` (``(x, out)`` for ``stream``).
    """

    letter = 'L'
    title = 'FLatten'
    paper = 'FLatten Transformer'
    citation = 'FLatten Transformer, ICCV 2023'
    paper_title = 'FLatten Transformer: Vision Transformer using Focused Linear Attention'
    paper_url = 'https://github.com/LeapLabTHU/FLatten-Transformer'
    op = 'flatten'
    qkv_layouts = ('fused', 'separate', 'projected')
    prefix_tokens = True
    input_only_projected = True

    def __init__(self, dim, num_heads, pe_grid, qkv_layout='fused', qkv_bias=True, sr_ratio=1, proj_drop=0.,
                 attn_impl='auto', fp32_attn=True, focusing_factor=3, kernel_size=5, v_upsample='linear1d'):
        super().__init__()
        head_dim = check_attention_args(dim, num_heads, qkv_layout, sr_ratio, v_upsample)
        self.dim = dim
        self.num_heads = num_heads
        self.qkv_layout = qkv_layout
        self.sr_ratio = sr_ratio
        self.focusing_factor = focusing_factor
        self.v_upsample = v_upsample
        self.attn_impl = check_attn_impl(attn_impl, op=self.op)
        self.fp32_attn = fp32_attn
        self._init_input_projections(dim, qkv_layout, qkv_bias)
        self._init_output_projection(dim, qkv_layout, proj_drop)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        self.dwc = DepthwiseConv2d(head_dim, kernel_size)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self._init_positional_encoding(dim, reduced_grid(pe_grid, sr_ratio))

    def forward(self, x, hw, num_prefix_tokens=0, norm=None, branch=None, drop_path=None, stream=False, **context):
        P = num_prefix_tokens
        projected = self._project_inputs(x, hw, norm, value_twice=True, branch=branch, drop_path=drop_path,
                                         stream=stream)
        returns_x = branch is not None or stream
        s, (q, k, v, v_term), kv_hw = projected if returns_x else (None, *projected)
        if self._value_term_in_kernels(q, k, v, v_term, P):
            # the core and the depthwise term in the Triton kernels, with the head views and the merge of the
            # heads inside one autograd Function
            out = flatten_value_term_triton(q, k, v, v_term, self.scale, self.num_heads, self.dwc.weight,
                                            self.dwc.bias, hw, self.focusing_factor,
                                            key_bias=self.key_bias(kv_hw, k.dtype))
        else:
            out = self._core_and_value_term(q, k, v, v_term, kv_hw, hw, P)
        out = self._project_output(out)
        return (s, out) if returns_x else out

    def _core_and_value_term(self, q, k, v, v_term, kv_hw, hw, P):
        """The core (:func:`mmpola.ops.flatten_attention`) and the depthwise term of the projections q (B, N, C), k,
        v, v_term (B, n, C) as two ops; returns (B, N, C)."""
        B, n, C = k.shape
        # the positional encoding as the keys' bias: the Triton kernels add it where they read the keys
        out = flatten_attention(q, k, v, self.scale, self.num_heads, self.focusing_factor, fp32=self.fp32_attn,
                                impl=self.attn_impl, key_bias=self.key_bias(kv_hw, k.dtype, P))
        v = v_term[:, P:].reshape(B, n - P, self.num_heads, C // self.num_heads).transpose(1, 2)
        if P:
            return add_to_patches(out, depthwise_value_term(self.dwc, v, kv_hw, hw, self.v_upsample), P)
        # the term added to the core's output where the conv writes it, in the output's layout
        return depthwise_value_term(self.dwc, v, kv_hw, hw, self.v_upsample, residual=out)

    def extra_repr(self):
        return (f'dim={self.dim}, num_heads={self.num_heads}, pe_grid={self.pe_grid}, sr_ratio={self.sr_ratio}, '
                f'focusing_factor={self.focusing_factor}, qkv_layout={self.qkv_layout!r}, attn_impl={self.attn_impl!r}')
