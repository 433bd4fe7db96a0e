"""The terms the linear attention kinds add on the token grid, beside their attention core: the learned
key positional encoding (``positional_encoding``, Pola and FLatten), the depthwise-convolution value
term (``dwc``, with the values of a spatially reduced key grid upsampled first), and how a term reaches
the grid tokens only when prefix tokens (a ViT's class token) come first."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmpola.ops import depthwise_conv_impl
from mmpola.ops.depthwise import heads_as_maps
from mmpola.ops.value_term_triton import value_term_joins

from ..layers import ResizedEmbeddingCache, hooked

__all__ = ['KeyPositionalEncoding', 'JoinedValueTerm', 'upsample_values', 'depthwise_value_heads',
           'depthwise_value_term', 'split_prefix', 'add_to_patches']


class KeyPositionalEncoding:
    """Mixin of Pola and FLatten attention: the learned ``positional_encoding`` added to the keys (as the
    ops' key bias), stored on the pretraining key grid and bilinearly resized to the real key grid (the
    resized tensor is cached in eval mode)."""

    def _init_positional_encoding(self, dim, key_grid):
        self.pe_grid = tuple(key_grid)
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.pe_grid[0] * self.pe_grid[1], dim))
        self._pe_cache = ResizedEmbeddingCache()

    def resized_positional_encoding(self, kv_hw, dtype=None):
        """(1, Hk*Wk, C) positional encoding for a Hk x Wk key grid, in ``dtype`` (the parameter's when None;
        cached in eval mode)."""
        return self._pe_cache.get(self.positional_encoding, self.pe_grid, kv_hw, 'bilinear',
                                  enabled=not self.training, dtype=dtype)

    def key_bias(self, kv_hw, dtype, num_prefix_tokens=0):
        """(1, P + Hk*Wk, C) the encoding as the keys' bias (``key_bias`` of the attention ops, added to the
        keys where the Triton kernels read them: mmpola.ops.dispatch), zero on the P prefix tokens, in the
        keys' ``dtype``.

        Under autocast the keys come from a projection in half precision and the encoding is a float32
        parameter: added as they are, type promotion would make the keys float32, twice the bytes the
        attention core reads and saves for backward, for no more precision than the projection gave
        them. The resized encoding is cast to the keys' dtype first (no-op in float32 training; in eval
        mode the cast is cached with the resize); its gradient still reaches the parameter in float32.
        """
        encoding = self.resized_positional_encoding(kv_hw, dtype)
        if num_prefix_tokens:
            encoding = F.pad(encoding, (0, 0, num_prefix_tokens, 0))
        return encoding


class JoinedValueTerm:
    """Mixin of the attentions whose depthwise value term (``dwc``) can run with their core in one autograd
    Function (:mod:`mmpola.ops.value_term_triton`): Pola and FLatten, whose op is ``op``, implementation
    ``attn_impl`` and fp32 island ``fp32_attn``."""

    def _value_term_in_kernels(self, q, k, v, v_term, num_prefix_tokens):
        """Whether the joined Function computes the core and the depthwise term of these projections (B, N, C): the
        keys are the grid's tokens (no prefix tokens, no spatial reduction), both run in their Triton kernels
        (``attn_impl`` and ``MMPOLA_DEPTHWISE_CONV`` resolve to them:
        :func:`~mmpola.ops.value_term_triton.value_term_joins`), and no hook of ``dwc`` expects its own call."""
        return (not num_prefix_tokens and k.shape[1] == q.shape[1] and not hooked(self.dwc)
                and value_term_joins(self.op, self.attn_impl, self.fp32_attn, depthwise_conv_impl(), q, k, v, v_term,
                                     self.dwc.weight, self.num_heads))


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


def depthwise_value_heads(dwc, v, kv_hw, hw, v_upsample='linear1d', residual=None):
    """The ``dwc`` term of Pola / FLatten attention per head: a depthwise conv over each head's values.

    Args:
        dwc: a :class:`~mmpola.models.layers.DepthwiseConv2d` of d channels, shared by the heads.
        v: (B, h, n, d) values on the key grid ``kv_hw``, of any strides (e.g. a view of the projection).
        hw: (H, W) query grid; values are upsampled to it first when n != H * W.
        residual: None, or the attention core's output (B, h, N, d), of any strides, to add the term to.
    Returns:
        (B, h, N, d), the heads' layout of the attention core's output (a view of the conv's
        channels-last output: added to the core's output before the heads are merged, no copy); with
        ``residual``, ``residual`` + the term in the residual's layout (the Triton kernel adds it where it
        writes the term).

    The conv takes the heads' maps as one (B, h, d, H, W) view of v, channels-last as in the official code:
    the Triton kernels read them in place, the library convolution copies them once as B * h images.
    ``dwc`` is a :class:`mmpola.models.layers.DepthwiseConv2d` (its weight's gradient contiguous whatever the
    input's layout, see there why).
    """
    if residual is not None and hooked(dwc):  # its hooks see the term alone
        return residual + depthwise_value_heads(dwc, v, kv_hw, hw, v_upsample)
    if v.shape[2] != hw[0] * hw[1]:
        v = upsample_values(v, kv_hw, hw, v_upsample)
    maps = dwc(heads_as_maps(v, hw), None if residual is None else heads_as_maps(residual, hw))
    return maps.permute(0, 1, 3, 4, 2).flatten(2, 3)  # (B, h, H*W, d): a view of a channels-last output


def depthwise_value_term(dwc, v, kv_hw, hw, v_upsample='linear1d', residual=None):
    """:func:`depthwise_value_heads` as (B, N, C) tokens, C = h * d in head-major channel order; ``residual``:
    None, or (B, N, C) tokens (the core's output) to add the term to, in their layout."""
    B, heads, _, head_dim = v.shape
    if residual is not None:
        residual = residual.unflatten(-1, (heads, head_dim)).transpose(1, 2)
    return depthwise_value_heads(dwc, v, kv_hw, hw, v_upsample, residual).transpose(1, 2).reshape(
        B, -1, heads * head_dim)


def split_prefix(x, num_prefix_tokens):
    """(prefix tokens, grid tokens) of (B, P + H*W, C) tokens (a ViT's class token first)."""
    return x[:, :num_prefix_tokens], x[:, num_prefix_tokens:]


def add_to_patches(x, term, num_prefix_tokens):
    """``x`` with ``term`` (B, H*W, C) added to its grid tokens only (the prefix tokens unchanged)."""
    if not num_prefix_tokens:
        return x + term
    prefix, patches = split_prefix(x, num_prefix_tokens)
    return torch.cat([prefix, patches + term], dim=1)
