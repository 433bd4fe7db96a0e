"""Building blocks shared by the PVT and Swin families (Pola, FLatten, InLine and softmax attention).

Every module keeps the attribute names of the official PolaFormer / FLatten / InLine code (``qkvg``,
``qg``, ``q``, ``kv``, ``qkv``, ``power``, ``scale``, ``positional_encoding``, ``dwc``, ``residual``,
``proj``, ``relative_position_bias_table``, ``reduction`` ...), so official checkpoints load by
filtering keys, never by renaming them.

Token layout everywhere: ``x`` is (B, N, C), the row-major flatten of an H x W grid, and the grid
size travels beside it as ``hw = (H, W)``.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, register_notrace_module, trunc_normal_

from mmpola.ops import flatten_attention, inline_attention, pola_attention

__all__ = [
    'DropPath', 'Mlp', 'PatchEmbed', 'PatchMerging', 'PolaAttention', 'FocusedLinearAttention',
    'InLineAttention', 'PVTAttention', 'WindowAttention', 'resize_grid_embedding', 'to_2tuple_int',
    'init_official_weights',
]


def to_2tuple_int(value, name):
    """``224`` or ``(224, 224)`` -> ``(224, 224)``; anything else is a clear error."""
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise TypeError(f'{name} must be an int or a pair of ints, got {value!r}')


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


class _ResizedEmbeddingCache:
    """Remembers the last run-time resize of a grid embedding.

    The resized tensor depends on a trainable parameter, so it is reused only when no graph is
    being recorded (eval / inference) and the parameter has not been modified since (its
    ``_version`` changes on every in-place update, e.g. ``load_state_dict`` or an optimizer step).
    A plain attribute, not a buffer: it never enters a state dict.
    """

    def __init__(self):
        self.key = None
        self.value = None

    def get(self, param, src_hw, dst_hw, mode, enabled):
        if isinstance(dst_hw, torch.fx.Proxy):  # symbolic tracing
            return resize_grid_embedding(param, src_hw, dst_hw, mode)
        if tuple(src_hw) == tuple(dst_hw):
            return param
        if not enabled or torch.is_grad_enabled():
            self.key = self.value = None
            return resize_grid_embedding(param, src_hw, dst_hw, mode)
        key = (tuple(dst_hw), param.data_ptr(), param._version, param.device, param.dtype)
        if self.key != key:
            self.value = resize_grid_embedding(param, src_hw, dst_hw, mode)
            self.key = key
        return self.value

    def __deepcopy__(self, memo):  # EMA copies / deepcopy must not share a cached tensor
        return _ResizedEmbeddingCache()

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.key = self.value = None


def init_official_weights(module):
    """The official ``_init_weights``: Linear trunc_normal(.02) with zero bias, LayerNorm (1, 0).

    Conv2d layers (patch embeddings, ``dwc``, ``sr``) keep PyTorch's default init, and ``power``,
    ``scale`` and ``positional_encoding`` stay zero, exactly as in the official code.
    """
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.constant_(module.bias, 0)
    elif isinstance(module, nn.LayerNorm):
        nn.init.constant_(module.bias, 0)
        nn.init.constant_(module.weight, 1.0)


class Mlp(nn.Module):
    """fc1 -> GELU -> Dropout -> fc2 -> Dropout on (B, N, C) tokens."""

    def __init__(self, in_features, hidden_features, drop=0.):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        x = self.drop(self.act(self.fc1(x)))
        return self.drop(self.fc2(x))


@register_notrace_module  # torch.fx leaf: padding and (H, W) depend on the input size
class PatchEmbed(nn.Module):
    """Non-overlapping patch embedding: Conv2d(k = s = patch_size) -> flatten -> LayerNorm.

    Args:
        in_chans: input channels.
        embed_dim: output channels C.
        patch_size: kernel and stride.
        pad: ``False`` (Pola-PVT): sizes floor, ``H' = H // p`` as in the official and mmdet PVT.
            ``True`` (Pola-Swin): zero-pad right/bottom to a multiple of ``p`` first, so
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

    def forward(self, x):
        if self.pad:
            p = self.patch_size
            pad_h, pad_w = (-x.shape[-2]) % p, (-x.shape[-1]) % p
            if pad_h or pad_w:
                x = F.pad(x, (0, pad_w, 0, pad_h))
        x = self.proj(x)
        hw = tuple(x.shape[-2:])
        x = self.norm(x.flatten(2).transpose(1, 2))
        return x, hw


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


def depthwise_value_term(dwc, v, kv_hw, hw, v_upsample='linear1d'):
    """The ``dwc`` term of Pola / FLatten attention: a depthwise conv over each head's values.

    Args:
        dwc: Conv2d(d, d, groups=d), shared by the heads.
        v: (B, h, n, d) values on the key grid ``kv_hw``.
        hw: (H, W) query grid; values are upsampled to it first when n != H * W.
    Returns:
        (B, N, C) with C = h * d in head-major channel order.
    """
    B, heads, n, head_dim = v.shape
    H, W = hw
    if n != H * W:
        v = upsample_values(v, kv_hw, hw, v_upsample)
    v = v.reshape(B * heads, H, W, head_dim).permute(0, 3, 1, 2)
    return dwc(v).reshape(B, heads * head_dim, H * W).permute(0, 2, 1)


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


def check_attention_args(dim, num_heads, qkv_layout, layouts, sr_ratio=1, v_upsample='linear1d'):
    """The argument checks the linear attention modules share; ``layouts`` is the (Swin, PVT) pair of
    ``qkv_layout`` names. Returns the head dim."""
    if dim % num_heads:
        raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
    if qkv_layout not in layouts:
        raise ValueError(f"qkv_layout must be '{layouts[0]}' (Swin) or '{layouts[1]}' (PVT), got {qkv_layout!r}")
    if sr_ratio > 1 and qkv_layout != layouts[1]:
        raise ValueError('spatial reduction (sr_ratio > 1) exists only in the PVT layout')
    if v_upsample not in ('linear1d', 'bilinear2d'):
        raise ValueError(f"v_upsample must be 'linear1d' or 'bilinear2d', got {v_upsample!r}")
    return dim // num_heads


class KeyPositionalEncoding:
    """Mixin of Pola and FLatten attention: the learned ``positional_encoding`` added to the keys,
    stored on the pretraining grid ``pe_grid`` and bilinearly resized to the real key grid (the
    resized tensor is cached in eval mode)."""

    def _init_positional_encoding(self, dim, pe_grid):
        self.pe_grid = tuple(pe_grid)
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.pe_grid[0] * self.pe_grid[1], dim))
        self._pe_cache = _ResizedEmbeddingCache()

    def resized_positional_encoding(self, kv_hw):
        """(1, Hk*Wk, C) positional encoding for a Hk x Wk key grid (cached in eval mode)."""
        return self._pe_cache.get(self.positional_encoding, self.pe_grid, kv_hw, 'bilinear',
                                  enabled=not self.training)


@register_notrace_module  # torch.fx leaf: custom autograd core, size-dependent resize and cache
class PolaAttention(KeyPositionalEncoding, nn.Module):
    """Polarity-aware linear attention over one whole H x W token grid (docs/design.md).

    Both official variants in one module:

    * ``qkv_layout='qkvg'`` (Pola-Swin): ``qkvg`` Linear(C, 4C) gives q, k, v, g.
    * ``qkv_layout='qg_kv'`` (Pola-PVT): ``qg`` Linear(C, 2C) gives q, g; ``kv`` Linear(C, 2C)
      gives k, v from the map, spatially reduced first by ``sr`` (Conv2d k = s = sr_ratio) and
      ``norm`` (LayerNorm eps 1e-5) when ``sr_ratio > 1``.

    k gets the learned ``positional_encoding``, stored on the pretraining grid ``pe_grid`` and
    bilinearly resized (align_corners False) to the real key grid when the two differ; the core
    (``mmpola.ops.pola_attention``) mixes same-sign and opposite-sign branches; a depthwise conv
    ``dwc`` (d channels, shared by the heads) runs on v with the real (H, W); the sum is gated by
    the linear projection g and projected by ``proj``.

    Args:
        dim: channels C.
        num_heads: heads h (d = C / h).
        pe_grid: (Hg, Wg) grid of ``positional_encoding`` at pretraining, after the spatial
            reduction (PVT: stage grid // sr; Swin: the window, which at 224 is the stage map).
        qkv_layout: ``'qkvg'`` or ``'qg_kv'`` (see above).
        qkv_bias: bias of the q/k/v/g projections (True in every released model).
        sr_ratio: spatial reduction of keys and values (``'qg_kv'`` only).
        alpha: p = 1 + alpha * sigmoid(power) lies in (1, 1 + alpha).
        kernel_size: kernel of ``dwc``.
        proj_drop: dropout after ``proj``.
        v_upsample: with ``sr_ratio > 1`` v has fewer tokens than the queries and is upsampled to
            N before ``dwc``: ``'linear1d'`` along the flattened token axis (official, needed for
            the official outputs) or ``'bilinear2d'`` on the 2-D grid (geometrically sound; a
            documented deviation for new training runs).
        attn_impl: ``impl`` of ``pola_attention``: ``'auto'`` or ``'reference'`` (official op
            order, bit-exact to the official module in fp32). A plain attribute, so a wrapper can
            switch it after construction.
        fp32_attn: run the core in fp32 under autocast (docs/design.md).

    Shapes: ``forward(x, hw)`` with x (B, N, C), hw = (H, W), N = H * W -> (B, N, C).
    """

    def __init__(self, dim, num_heads, pe_grid, qkv_layout='qkvg', qkv_bias=True, sr_ratio=1,
                 alpha=4.0, kernel_size=5, proj_drop=0., v_upsample='linear1d', attn_impl='auto',
                 fp32_attn=True):
        super().__init__()
        head_dim = check_attention_args(dim, num_heads, qkv_layout, ('qkvg', 'qg_kv'), sr_ratio, v_upsample)
        if head_dim % 2:
            raise ValueError(f'head dim {head_dim} (= {dim} / {num_heads}) must be even: '
                             'the value channels are split into two halves')
        self.dim = dim
        self.num_heads = num_heads
        self.qkv_layout = qkv_layout
        self.sr_ratio = sr_ratio
        self.alpha = alpha
        self.v_upsample = v_upsample
        self.attn_impl = attn_impl
        self.fp32_attn = fp32_attn

        if qkv_layout == 'qkvg':
            self.qkvg = nn.Linear(dim, dim * 4, bias=qkv_bias)
        else:
            self.qg = nn.Linear(dim, dim * 2, bias=qkv_bias)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
            if sr_ratio > 1:
                self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
                self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size=kernel_size, groups=head_dim,
                             padding=kernel_size // 2)
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, head_dim))
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self._init_positional_encoding(dim, pe_grid)

    def forward(self, x, hw):
        B, N, C = x.shape
        H, W = hw
        heads, head_dim = self.num_heads, C // self.num_heads
        if self.qkv_layout == 'qkvg':
            q, k, v, g = self.qkvg(x).reshape(B, N, 4, C).unbind(2)
            kv_hw = (H, W)
        else:
            q, g = self.qg(x).reshape(B, N, 2, C).unbind(2)
            x_, kv_hw = spatial_reduction(x, hw, getattr(self, 'sr', None), getattr(self, 'norm', None))
            k, v = self.kv(x_).reshape(B, -1, 2, C).unbind(2)
        n = k.shape[1]
        k = k + self.resized_positional_encoding(kv_hw)

        # contiguous per-head layout: the reference data of the official model are reproduced
        # bit for bit with it (strided views change the matmul summation order for h > 1)
        q = q.reshape(B, N, heads, head_dim).transpose(1, 2).contiguous()
        k = k.reshape(B, n, heads, head_dim).transpose(1, 2).contiguous()
        v = v.reshape(B, n, heads, head_dim).transpose(1, 2).contiguous()
        # scale is per channel (1, 1, C) and divides q and k before the head split in the
        # official code; elementwise, so dividing by its (1, h, 1, d) view gives the same bits.
        scale = self.scale.reshape(1, 1, heads, head_dim).transpose(1, 2)
        out = pola_attention(q, k, v, self.power, scale, alpha=self.alpha, fp32=self.fp32_attn,
                             impl=self.attn_impl)
        out = out.transpose(1, 2).reshape(B, N, C)

        out = out + depthwise_value_term(self.dwc, v, kv_hw, (H, W), self.v_upsample)
        out = out * g
        return self.proj_drop(self.proj(out))

    def extra_repr(self):
        return (f'dim={self.dim}, num_heads={self.num_heads}, pe_grid={self.pe_grid}, '
                f'sr_ratio={self.sr_ratio}, alpha={self.alpha}, attn_impl={self.attn_impl!r}')


@register_notrace_module  # torch.fx leaf: custom autograd core, size-dependent resize and cache
class FocusedLinearAttention(KeyPositionalEncoding, nn.Module):
    """Focused linear attention (FLatten Transformer, ICCV 2023) over one whole H x W token grid.

    * ``qkv_layout='qkv'`` (FLatten-Swin): ``qkv`` Linear(C, 3C) gives q, k, v.
    * ``qkv_layout='q_kv'`` (FLatten-PVT): ``q`` Linear(C, C); ``kv`` Linear(C, 2C) gives k, v from
      the map, spatially reduced first by ``sr`` / ``norm`` when ``sr_ratio > 1``.

    k gets the learned ``positional_encoding`` (stored on ``pe_grid``, bilinearly resized to the
    real key grid when they differ); the core (:func:`mmpola.ops.flatten_attention`) applies the
    focusing feature map with the per-channel temperature ``softplus(scale)``; a depthwise conv
    ``dwc`` (d channels, shared by the heads) on v is added, then ``proj``.

    Args:
        dim, num_heads, pe_grid, qkv_bias, sr_ratio, kernel_size, proj_drop, v_upsample, attn_impl,
            fp32_attn: as in :class:`PolaAttention`.
        qkv_layout: ``'qkv'`` or ``'q_kv'``.
        focusing_factor: the power f of the focusing function (3 in every released model).

    Shapes: ``forward(x, hw)`` with x (B, N, C), hw = (H, W), N = H * W -> (B, N, C).
    """

    def __init__(self, dim, num_heads, pe_grid, qkv_layout='qkv', qkv_bias=True, sr_ratio=1, focusing_factor=3,
                 kernel_size=5, proj_drop=0., v_upsample='linear1d', attn_impl='auto', fp32_attn=True):
        super().__init__()
        head_dim = check_attention_args(dim, num_heads, qkv_layout, ('qkv', 'q_kv'), sr_ratio, v_upsample)
        self.dim = dim
        self.num_heads = num_heads
        self.qkv_layout = qkv_layout
        self.sr_ratio = sr_ratio
        self.focusing_factor = focusing_factor
        self.v_upsample = v_upsample
        self.attn_impl = attn_impl
        self.fp32_attn = fp32_attn
        if qkv_layout == 'qkv':
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        else:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size=kernel_size, groups=head_dim,
                             padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self._init_positional_encoding(dim, pe_grid)

    def forward(self, x, hw):
        B, N, C = x.shape
        if self.qkv_layout == 'qkv':
            q, k, v = self.qkv(x).reshape(B, N, 3, C).unbind(2)
            kv_hw = tuple(hw)
        else:
            q = self.q(x)
            x_, kv_hw = spatial_reduction(x, hw, getattr(self, 'sr', None), getattr(self, 'norm', None))
            k, v = self.kv(x_).reshape(B, -1, 2, C).unbind(2)
        n = k.shape[1]
        k = k + self.resized_positional_encoding(kv_hw)
        out = flatten_attention(q, k, v, self.scale, self.num_heads, self.focusing_factor, fp32=self.fp32_attn,
                                impl=self.attn_impl)
        v = v.reshape(B, n, self.num_heads, C // self.num_heads).transpose(1, 2)
        out = out + depthwise_value_term(self.dwc, v, kv_hw, hw, self.v_upsample)
        return self.proj_drop(self.proj(out))

    def extra_repr(self):
        return (f'dim={self.dim}, num_heads={self.num_heads}, pe_grid={self.pe_grid}, sr_ratio={self.sr_ratio}, '
                f'focusing_factor={self.focusing_factor}, attn_impl={self.attn_impl!r}')


@register_notrace_module  # torch.fx leaf: custom autograd core, size-dependent resize and cache
class InLineAttention(nn.Module):
    """Injective linear attention (InLine, NeurIPS 2024) over one whole H x W token grid.

    * ``qkv_layout='qkv'`` (InLine-Swin): ``qkv`` Linear(C, 3C).
    * ``qkv_layout='q_kv'`` (InLine-PVT): ``q`` Linear(C, C) and ``kv`` Linear(C, 2C).

    The core (:func:`mmpola.ops.inline_attention`, identity kernel) is followed by a local residual:
    a 3x3 depthwise conv over v whose kernels are predicted per image and channel from the mean
    token by ``residual`` (grouped 1x1 Conv1d(C, C) -> GELU -> Conv1d(C, 9C)); then ``proj``. There
    is no positional encoding and no spatial reduction (the official model has none in any release).

    Args:
        dim, num_heads, qkv_bias, proj_drop, attn_impl, fp32_attn: as in :class:`PolaAttention`.
        qkv_layout: ``'qkv'`` or ``'q_kv'``.
        sr_ratio: must be 1.

    Shapes: ``forward(x, hw)`` with x (B, N, C), hw = (H, W), N = H * W -> (B, N, C).
    """

    def __init__(self, dim, num_heads, qkv_layout='qkv', qkv_bias=True, sr_ratio=1, proj_drop=0., attn_impl='auto',
                 fp32_attn=True):
        super().__init__()
        check_attention_args(dim, num_heads, qkv_layout, ('qkv', 'q_kv'))
        if sr_ratio != 1:
            raise ValueError(f'InLine attention has no spatial reduction (got sr_ratio={sr_ratio}); use '
                             "la_sr_ratios='1111' as every released InLine model")
        self.dim = dim
        self.num_heads = num_heads
        self.qkv_layout = qkv_layout
        self.attn_impl = attn_impl
        self.fp32_attn = fp32_attn
        if qkv_layout == 'qkv':
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

    def forward(self, x, hw):
        B, N, C = x.shape
        H, W = hw
        if self.qkv_layout == 'qkv':
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


class PVTAttention(nn.Module):
    """Softmax attention of PVT 'S' blocks with optional spatial reduction.

    Keys: ``q`` Linear(C, C), ``kv`` Linear(C, 2C), ``proj``; ``sr`` and ``norm`` if sr_ratio > 1.
    Shapes: ``forward(x, hw)``: (B, N, C), (H, W) -> (B, N, C).
    """

    def __init__(self, dim, num_heads, qkv_bias=True, qk_scale=None, attn_drop=0., proj_drop=0.,
                 sr_ratio=1):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)

    def forward(self, x, hw):
        B, N, C = x.shape
        H, W = hw
        heads = self.num_heads
        q = self.q(x).reshape(B, N, heads, C // heads).permute(0, 2, 1, 3)
        x_, _ = spatial_reduction(x, hw, getattr(self, 'sr', None), getattr(self, 'norm', None))
        kv = self.kv(x_).reshape(B, -1, 2, heads, C // heads).permute(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


def relative_position_index(window_size):
    """(ws*ws, ws*ws) index into the ((2ws-1)^2, h) bias table (the Swin-v1 construction)."""
    coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size),
                                        indexing='ij'))
    coords = coords.flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    relative[:, :, 0] += window_size - 1
    relative[:, :, 1] += window_size - 1
    relative[:, :, 0] *= 2 * window_size - 1
    return relative.sum(-1)


class WindowAttention(nn.Module):
    """Swin-v1 window softmax attention with relative position bias (Pola-Swin 'S' blocks).

    Keys: ``qkv``, ``relative_position_bias_table`` ((2ws-1)^2, h), ``proj``. The
    ``relative_position_index`` buffer is recomputed at construction and not persistent (the
    loaders drop it from official checkpoints, where it is stored).

    Shapes: ``forward(x, mask)``: x (nW*B, ws*ws, C); mask None or (nW, ws*ws, ws*ws) with 0 /
    -100 -> (nW*B, ws*ws, C).
    """

    def __init__(self, dim, window_size, num_heads, qkv_bias=True, qk_scale=None, attn_drop=0.,
                 proj_drop=0.):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.dim = dim
        self.window_size = window_size
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1) ** 2, num_heads))
        index = relative_position_index(window_size)
        self.register_buffer('relative_position_index', index.to(self.relative_position_bias_table.device),
                             persistent=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        trunc_normal_(self.relative_position_bias_table, std=.02)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        heads = self.num_heads
        qkv = self.qkv(x).reshape(B_, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, heads, N, N)
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj_drop(self.proj(x))

    def extra_repr(self):
        return f'dim={self.dim}, window_size={self.window_size}, num_heads={self.num_heads}'


@register_notrace_module  # torch.fx leaf: odd sizes are padded
class PatchMerging(nn.Module):
    """2x2 patch merging with the official phase order (odd sides padded).

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
        if H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        x0 = x[:, 0::2, 0::2, :]
        x1 = x[:, 1::2, 0::2, :]
        x2 = x[:, 0::2, 1::2, :]
        x3 = x[:, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1)
        out_hw = (x.shape[1], x.shape[2])
        x = x.view(B, -1, 4 * C)
        return self.reduction(self.norm(x)), out_hw
