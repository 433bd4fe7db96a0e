"""Polarity-aware linear attention (PolaFormer, ICLR 2025): kind ``'pola'``."""
import torch
import torch.nn as nn
from timm.layers import register_notrace_module

from mmpola.ops import check_attn_impl, pola_attention
from mmpola.ops.value_term_triton import pola_value_term_triton
from mmpola.registry import ATTENTIONS

from ..layers import DepthwiseConv2d
from .grid_terms import (
    JoinedValueTerm,
    KeyPositionalEncoding,
    add_to_patches,
    depthwise_value_heads,
    depthwise_value_term,
)
from .projections import QKVProjections, check_attention_args, reduced_grid

__all__ = ['PolaAttention']


@ATTENTIONS.register_module(name='pola')
@register_notrace_module  # torch.fx leaf: custom autograd core, size-dependent resize and cache
class PolaAttention(JoinedValueTerm, KeyPositionalEncoding, QKVProjections, nn.Module):
    """Polarity-aware linear attention over one whole H x W token grid (docs/design.md).

    The projection layouts:

    * ``qkv_layout='fused'`` (Pola-Swin, the ViT): ``qkvg`` Linear(C, 4C) gives q, k, v, g.
    * ``qkv_layout='separate'`` (Pola-PVT, -PVTv2): ``qg`` Linear(C, 2C) gives q, g; ``kv`` Linear(C, 2C)
      gives k, v from the map, spatially reduced first by ``sr`` (Conv2d k = s = sr_ratio) and
      ``norm`` (LayerNorm eps 1e-5) when ``sr_ratio > 1``.
    * ``qkv_layout='projected'`` (CSWin): x holds the projected q, k, v, g (B, N, 4, C:
      ``projections = 4``, so the CSWin block's ``qkv`` is Linear(C, 4C)), or is the tuple of the four
      (B, N, C); no ``proj``.

    k gets the learned ``positional_encoding``, stored on the pretraining key grid and bilinearly
    resized (align_corners False) to the real key grid when the two differ; the core
    (:func:`mmpola.ops.pola_attention`) mixes same-sign and opposite-sign branches; a depthwise conv
    ``dwc`` (d channels, shared by the heads) runs on v with the real (H, W); the sum is gated by
    the linear projection g and projected by ``proj`` (where the core and ``dwc`` both run in their Triton
    kernels, through one autograd Function, which also multiplies by g where the library's layers would:
    :func:`~mmpola.ops.value_term_triton.pola_value_term_triton`). Prefix
    tokens (``num_prefix_tokens``, the ViT's class token) take part in the core and the gate; the positional
    encoding and ``dwc`` act on the grid tokens only.

    Args:
        dim: channels C.
        num_heads: heads h (d = C / h, even: the values split into two halves).
        pe_grid: (H, W) token grid at pretraining; the encoding is stored on it after the spatial
            reduction (``pe_grid // sr_ratio``).
        qkv_layout: ``'fused'`` or ``'separate'`` (see above).
        qkv_bias: bias of the q/k/v/g projections (True in every released model).
        sr_ratio: spatial reduction of keys and values (``'separate'`` only).
        proj_drop: dropout after ``proj``.
        attn_impl: implementation of :func:`mmpola.ops.pola_attention` (``'auto'``, ``'fast'``,
            ``'reference'`` (the official op order) or a registered one). A plain attribute, so a
            backbone can switch it after construction (``set_attn_impl``).
        fp32_attn: run the core in fp32 under autocast (docs/design.md).
        alpha: option; p = 1 + alpha * sigmoid(power) lies in (1, 1 + alpha).
        kernel_size: option; kernel of ``dwc``.
        v_upsample: option; with ``sr_ratio > 1`` v has fewer tokens than the queries and is
            upsampled to N before ``dwc``: ``'linear1d'`` along the flattened token axis (official,
            needed for the official outputs) or ``'bilinear2d'`` on the 2-D grid (geometrically
            sound; a documented deviation for new training runs).

    Shapes: ``forward(x, hw, num_prefix_tokens=0, **inputs)`` with x (B, P + H*W, C) (``'projected'``:
    (B, N, 4, C)), hw = (H, W) -> (B, P + H*W, C); ``inputs``: the block's LayerNorm and residual connection
    that the projections take with them (``norm``, ``branch``, ``drop_path``, ``stream``:
    :meth:`~mmpola.models.attention.projections.QKVProjections._project_inputs`), with which the output is
    ``(x + drop_path(branch), out)`` (``(x, out)`` for ``stream``).
    """

    letter = 'L'
    title = 'Pola'
    paper = 'PolaFormer'
    citation = 'PolaFormer, ICLR 2025'
    paper_title = 'PolaFormer: Polarity-aware Linear Attention for Vision Transformers'
    paper_url = 'https://github.com/ZacharyMeng/PolaFormer'
    op = 'pola'
    qkv_layouts = ('fused', 'separate', 'projected')
    fused_projection = ('qkvg', 4)
    query_projection = ('qg', 2)
    projections = 4  # q, k, v, g (the 'projected' layout's operands)
    prefix_tokens = True
    input_only_projected = True

    def __init__(self, dim, num_heads, pe_grid, qkv_layout='fused', qkv_bias=True, sr_ratio=1, proj_drop=0.,
                 attn_impl='auto', fp32_attn=True, alpha=4.0, kernel_size=5, v_upsample='linear1d'):
        super().__init__()
        head_dim = check_attention_args(dim, num_heads, qkv_layout, sr_ratio, v_upsample)
        if head_dim % 2:
            raise ValueError(f'head dim {head_dim} (= {dim} / {num_heads}) must be even: '
                             'the value channels are split into two halves')
        self.dim = dim
        self.num_heads = num_heads
        self.qkv_layout = qkv_layout
        self.sr_ratio = sr_ratio
        self.alpha = alpha
        self.v_upsample = v_upsample
        self.attn_impl = check_attn_impl(attn_impl, op=self.op)
        self.fp32_attn = fp32_attn

        self._init_input_projections(dim, qkv_layout, qkv_bias)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        self._init_output_projection(dim, qkv_layout, proj_drop)
        self.dwc = DepthwiseConv2d(head_dim, kernel_size)
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, head_dim))
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self._init_positional_encoding(dim, reduced_grid(pe_grid, sr_ratio))

    def forward(self, x, hw, num_prefix_tokens=0, norm=None, branch=None, drop_path=None, stream=False, **context):
        P = num_prefix_tokens
        projected = self._project_inputs(x, hw, norm, value_twice=True, branch=branch, drop_path=drop_path,
                                         stream=stream)
        returns_x = branch is not None or stream
        s, (q, k, v, g, v_term), kv_hw = projected if returns_x else (None, *projected)
        if self._value_term_in_kernels(q, k, v, v_term, P):
            # the core and the depthwise term in the Triton kernels, with the head views and the merge of the
            # heads inside one autograd Function; the gate too, unless every layer's kernels run ('triton': then
            # gated_linear's multiply it), and then the Function also takes the projection whose views q, k, v and
            # g are, and gives it one gradient
            gate = g if self._function_takes_gate(q) else None
            out = pola_value_term_triton(q, k, v, v_term, self.power, self.scale, self.dwc.weight, self.dwc.bias,
                                         hw, alpha=self.alpha, key_bias=self.key_bias(kv_hw, k.dtype), gate=gate)
            out = self._project_gated_output(out, g) if gate is None else self._project_output(out)
        else:
            out = self._project_gated_output(self._core_and_value_term(q, k, v, v_term, kv_hw, hw, P), g)
        return (s, out) if returns_x else out

    def _core_and_value_term(self, q, k, v, v_term, kv_hw, hw, P):
        """The core (:func:`mmpola.ops.pola_attention`) and the depthwise term of the projections q (B, N, C), k,
        v, v_term (B, n, C) as two ops, on their heads' views; returns (B, N, C)."""
        B, N, C = q.shape
        heads, head_dim = self.num_heads, C // self.num_heads
        n = k.shape[1]
        # per-head views (B, h, N, d) of the projections, not copied: every implementation of the op
        # takes strided tensors (the fp32 island's cast, the feature maps and the products lay out
        # their own outputs; the reference copies to the official contiguous layout), and so does the
        # depthwise conv of the values (depthwise_value_heads). The positional encoding goes to the op
        # as the keys' bias: the Triton kernels add it where they read the keys, so the encoded keys
        # are no tensor of their own (the others get k + bias, in k's dtype, from the op's dispatch)
        q = q.reshape(B, N, heads, head_dim).transpose(1, 2)
        k = k.reshape(B, n, heads, head_dim).transpose(1, 2)
        v = v.reshape(B, n, heads, head_dim).transpose(1, 2)
        v_term = v_term.reshape(B, n, heads, head_dim).transpose(1, 2)  # the same values, for the depthwise term
        # scale is per channel (1, 1, C) and divides q and k before the head split in the
        # official code; elementwise, so dividing by its (1, h, 1, d) view gives the same bits.
        scale = self.scale.reshape(1, 1, heads, head_dim).transpose(1, 2)
        key_bias = self.key_bias(kv_hw, k.dtype, P).unflatten(-1, (heads, head_dim)).transpose(1, 2)
        out = pola_attention(q, k, v, self.power, scale, alpha=self.alpha, fp32=self.fp32_attn,
                             impl=self.attn_impl, key_bias=key_bias)
        if P:
            out = out.transpose(1, 2).reshape(B, N, C)
            term = depthwise_value_term(self.dwc, v_term[:, :, P:], kv_hw, hw, self.v_upsample)
            return add_to_patches(out, term, P)
        # the term added to the core's output (in the tokens' layout) where the conv writes it; merging the
        # heads is a view
        out = depthwise_value_heads(self.dwc, v_term, kv_hw, hw, self.v_upsample, residual=out)
        return out.transpose(1, 2).reshape(B, N, C)

    def extra_repr(self):
        return (f'dim={self.dim}, num_heads={self.num_heads}, pe_grid={self.pe_grid}, sr_ratio={self.sr_ratio}, '
                f'alpha={self.alpha}, qkv_layout={self.qkv_layout!r}, attn_impl={self.attn_impl!r}')
