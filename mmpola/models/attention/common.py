"""Pieces the linear-attention kinds share: the projection layouts, the learned key positional
encoding, PVT's spatial reduction of keys and values, and the depthwise-convolution value term.

Official parameter names are kept (``qkvg``, ``qg``, ``q``, ``kv``, ``qkv``, ``sr``, ``norm``,
``dwc``, ``positional_encoding``), so official checkpoints load by filtering keys.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import ResizedEmbeddingCache

__all__ = ['QKV_LAYOUTS', 'QKVProjections', 'check_attention_args', 'reduced_grid', 'KeyPositionalEncoding',
           'spatial_reduction', 'upsample_values', 'depthwise_value_heads', 'depthwise_value_term', 'split_prefix',
           'add_to_patches']

# 'fused': one projection of the tokens gives every operand (Swin, PolaFormer++, the ViT: ``qkv`` /
# ``qkvg``); 'separate': queries from the tokens, keys and values from a second projection ``kv`` of
# the (optionally spatially reduced) map (PVT, PVTv2: ``q`` / ``qg`` and ``kv``); 'projected': the
# module gets the operands already projected, x (B, N, P, C) with P = its ``projections`` (q, k, v;
# Pola also g), and returns (B, N, C) before any output projection: it owns neither the input
# projections nor ``proj`` (CSWin, whose block shares one ``qkv`` and one ``proj`` between its
# branches; docs/design.md, "CSWin: the block owns the projections")
QKV_LAYOUTS = ('fused', 'separate', 'projected')


def check_attention_args(dim, num_heads, qkv_layout='fused', sr_ratio=1, v_upsample='linear1d'):
    """The argument checks the linear attention modules share; returns the head dim."""
    if dim % num_heads:
        raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
    if qkv_layout not in QKV_LAYOUTS:
        raise ValueError(f"qkv_layout must be 'fused' (Swin, ViT), 'separate' (PVT) or 'projected' (CSWin), got "
                         f'{qkv_layout!r}')
    if sr_ratio > 1 and qkv_layout != 'separate':
        raise ValueError("spatial reduction (sr_ratio > 1) needs the separate key/value projection (PVT's "
                         "qkv_layout='separate')")
    if v_upsample not in ('linear1d', 'bilinear2d'):
        raise ValueError(f"v_upsample must be 'linear1d' or 'bilinear2d', got {v_upsample!r}")
    return dim // num_heads


class QKVProjections:
    """Mixin of the linear attention modules: the projections of ``qkv_layout`` (``QKV_LAYOUTS``) under
    the official names. ``fused_projection`` = (name, operands) of the 'fused' Linear (``('qkv', 3)``;
    Pola ``('qkvg', 4)``, the operands q, k, v, g); ``query_projection`` = (name, operands) of the
    'separate' layout's Linear of the tokens (``('q', 1)``; Pola ``('qg', 2)``, q and g), beside ``kv``
    Linear(C, 2C) of the (optionally spatially reduced: ``sr`` / ``norm``) map."""

    fused_projection = ('qkv', 3)
    query_projection = ('q', 1)

    def _init_input_projections(self, dim, qkv_layout, qkv_bias):
        if qkv_layout == 'fused':
            name, operands = self.fused_projection
            setattr(self, name, nn.Linear(dim, dim * operands, bias=qkv_bias))
        elif qkv_layout == 'separate':
            name, operands = self.query_projection
            setattr(self, name, nn.Linear(dim, dim * operands, bias=qkv_bias))
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)

    def _init_output_projection(self, dim, qkv_layout, proj_drop):
        if qkv_layout != 'projected':
            self.proj = nn.Linear(dim, dim)
            self.proj_drop = nn.Dropout(proj_drop)

    def _project_inputs(self, x, hw):
        """(the operands (B, N, C) each, in the order of the fused projection; k and v: (B, n, C)),
        (Hk, Wk) the key grid."""
        if self.qkv_layout == 'projected':
            return x[:, :, :self.fused_projection[1]].unbind(2), tuple(hw)
        B, N, C = x.shape
        if self.qkv_layout == 'fused':
            name, operands = self.fused_projection
            return getattr(self, name)(x).reshape(B, N, operands, C).unbind(2), tuple(hw)
        name, operands = self.query_projection
        query = getattr(self, name)(x)
        query = (query,) if operands == 1 else query.reshape(B, N, operands, C).unbind(2)
        x_, kv_hw = spatial_reduction(x, hw, getattr(self, 'sr', None), getattr(self, 'norm', None))
        k, v = self.kv(x_).reshape(B, -1, 2, C).unbind(2)
        return (query[0], k, v, *query[1:]), kv_hw

    def _project_output(self, out):
        """``proj`` and its dropout, except in the 'projected' layout (the caller owns ``proj``)."""
        if self.qkv_layout == 'projected':
            return out
        return self.proj_drop(self.proj(out))


def reduced_grid(pe_grid, sr_ratio):
    """The key grid of a ``pe_grid`` map after a spatial reduction by ``sr_ratio``."""
    return tuple(side // sr_ratio for side in pe_grid)


class KeyPositionalEncoding:
    """Mixin of Pola and FLatten attention: the learned ``positional_encoding`` added to the keys,
    stored on the pretraining key grid and bilinearly resized to the real key grid (the resized
    tensor is cached in eval mode)."""

    def _init_positional_encoding(self, dim, key_grid):
        self.pe_grid = tuple(key_grid)
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.pe_grid[0] * self.pe_grid[1], dim))
        self._pe_cache = ResizedEmbeddingCache()

    def resized_positional_encoding(self, kv_hw):
        """(1, Hk*Wk, C) positional encoding for a Hk x Wk key grid (cached in eval mode)."""
        return self._pe_cache.get(self.positional_encoding, self.pe_grid, kv_hw, 'bilinear',
                                  enabled=not self.training)


def spatial_reduction(x, hw, sr, norm):
    """Keys/values source of PVT attention: (B, N, C) -> ``sr`` conv (k = s = r) -> LayerNorm.

    Returns (tokens (B, n, C), (Hk, Wk)); the input itself when ``sr`` is None.
    """
    if sr is None:
        return x, tuple(hw)
    B, N, C = x.shape
    x = sr(x.permute(0, 2, 1).reshape(B, C, *hw))
    kv_hw = tuple(x.shape[-2:])
    return norm(x.reshape(B, C, -1).permute(0, 2, 1)), kv_hw


def upsample_values(v, kv_hw, hw, mode):
    """(B, h, n, d) values of a spatially reduced key grid -> (B, h, N, d) on the query grid.

    ``mode='linear1d'``: along the flattened token axis (the official PVT models' choice, needed for
    their outputs); ``'bilinear2d'``: on the 2-D grid (geometrically sound; a documented deviation).
    """
    B, heads, n, head_dim = v.shape
    N = hw[0] * hw[1]
    if mode == 'linear1d':
        v = F.interpolate(v.transpose(-2, -1).reshape(B * heads, head_dim, n), size=N, mode='linear')
        return v.reshape(B, heads, head_dim, N).transpose(-2, -1)
    v = v.transpose(-2, -1).reshape(B * heads, head_dim, *kv_hw)
    v = F.interpolate(v, size=hw, mode='bilinear', align_corners=False)
    return v.reshape(B, heads, head_dim, N).transpose(-2, -1)


def depthwise_value_heads(dwc, v, kv_hw, hw, v_upsample='linear1d'):
    """The ``dwc`` term of Pola / FLatten attention per head: a depthwise conv over each head's values.

    Args:
        dwc: Conv2d(d, d, groups=d), shared by the heads.
        v: (B, h, n, d) values on the key grid ``kv_hw``.
        hw: (H, W) query grid; values are upsampled to it first when n != H * W.
    Returns:
        (B, h, N, d), the heads' layout of the attention core's output (a view of the conv's
        channels-last output: added to the core's output before the heads are merged, no copy).

    The conv runs on a channels-last view, as in the official code; ``dwc`` is made by
    :func:`mmpola.models.layers.depthwise_conv` (its weight stored channels-last, see there why).
    """
    B, heads, n, head_dim = v.shape
    H, W = hw
    if n != H * W:
        v = upsample_values(v, kv_hw, hw, v_upsample)
    v = v.reshape(B * heads, H, W, head_dim).permute(0, 3, 1, 2)
    return dwc(v).permute(0, 2, 3, 1).reshape(B, heads, H * W, head_dim)


def depthwise_value_term(dwc, v, kv_hw, hw, v_upsample='linear1d'):
    """:func:`depthwise_value_heads` as (B, N, C) tokens, C = h * d in head-major channel order."""
    B, heads, _, head_dim = v.shape
    return depthwise_value_heads(dwc, v, kv_hw, hw, v_upsample).transpose(1, 2).reshape(B, -1, heads * head_dim)


def split_prefix(x, num_prefix_tokens):
    """(prefix tokens, grid tokens) of (B, P + H*W, C) tokens (a ViT's class token first)."""
    return x[:, :num_prefix_tokens], x[:, num_prefix_tokens:]


def add_to_patches(x, term, num_prefix_tokens):
    """``x`` with ``term`` (B, H*W, C) added to its grid tokens only (the prefix tokens unchanged)."""
    if not num_prefix_tokens:
        return x + term
    prefix, patches = split_prefix(x, num_prefix_tokens)
    return torch.cat([prefix, patches + term], dim=1)
