"""The softmax attentions of the macro architectures, letter ``'S'``: PVT's spatial-reduction
attention (kind ``'softmax'``, also the global attention of PVTv2 and the ViT), Swin's shifted-window
attention (kind ``'window_softmax'``) and CSWin's cross-shaped stripes with LePE (kind
``'stripe_softmax'``).

Every kind attends through :func:`torch.nn.functional.scaled_dot_product_attention` (flash or
memory-efficient kernels on CUDA, no (N, N) score matrix in memory; cuDNN's attention left out by default:
:mod:`mmpola.ops.sdpa`); Swin's relative position bias and shift mask are its one additive float
``attn_mask``.
"""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_module, trunc_normal_

from mmpola.ops import scaled_dot_product_attention
from mmpola.ops.dispatch import padding_needed, unviewed_when_compiling
from mmpola.registry import ATTENTIONS

from ..layers import DepthwiseConv2d, crop_map, norm_linear, padded_side
from .projections import QKV_LAYOUTS, spatial_reduction

__all__ = ['SpatialReductionAttention', 'WindowAttention', 'StripeAttention', 'softmax_attention', 'window_partition',
           'window_reverse', 'shifted_window_mask', 'relative_position_index']


def softmax_attention(q, k, v, scale, attn_drop, attn_mask=None):
    """softmax(q k^T * scale + attn_mask) v with dropout on the attention weights, through
    :func:`torch.nn.functional.scaled_dot_product_attention` (:func:`mmpola.ops.sdpa.scaled_dot_product_attention`:
    on CUDA, without cuDNN's attention, which builds a graph for every new input size).

    Args:
        q, k, v: (B, heads, N, d), (B, heads, n, d), (B, heads, n, d).
        scale: the softmax scale (``qk_scale`` or d ** -0.5).
        attn_drop: the module's ``nn.Dropout``: its probability applies in training mode.
        attn_mask: None or an additive float mask broadcastable to (B, heads, N, n), of q's dtype.

    Returns:
        (B, heads, N, d).
    """
    if attn_mask is not None and q.device.type == 'cpu' and torch.is_grad_enabled() and attn_mask.requires_grad:
        # a mask that needs its gradient (Swin's learned bias in training) sends the CPU's SDPA to its
        # unfused math path, slower than the three explicit steps. The softmax stays in the scores' dtype, as
        # in the fused kernels (the CPU's autocast leaves it there anyway): a count made with a GPU's autocast
        # lists, which would promote it to float32, then keeps and casts what a GPU does
        attn = torch.baddbmm(attn_mask.expand(*q.shape[:-1], k.shape[-2]).flatten(0, -3), q.flatten(0, -3),
                             k.flatten(0, -3).transpose(-2, -1), alpha=scale)
        attn = attn_drop(attn.softmax(dim=-1, dtype=attn.dtype))
        return (attn @ v.flatten(0, -3)).view(*q.shape[:-1], v.shape[-1])
    dropout_p = attn_drop.p if attn_drop.training else 0.0
    return scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


@ATTENTIONS.register_module(name='softmax')
class SpatialReductionAttention(nn.Module):
    """Softmax attention of PVT-v1 / PVTv2 with optional spatial reduction of keys and values, and the
    global multi-head attention of the ViT (DeiT).

    Keys: ``q`` Linear(C, C), ``kv`` Linear(C, 2C), ``proj``; ``sr`` (Conv2d k = s = sr_ratio) and
    ``norm`` if sr_ratio > 1. With ``qkv_layout='fused'`` one ``qkv`` Linear(C, 3C) and no reduction:
    timm's / DeiT's ``Attention`` (the ViT's softmax, whose class token simply takes part).

    Shapes: ``forward(x, hw)``: (B, N, C), (H, W) -> (B, N, C).
    """

    letter = 'S'
    title = 'softmax'
    qkv_layouts = ('separate', 'fused')
    prefix_tokens = True  # global attention: prefix tokens are tokens like the others

    def __init__(self, dim, num_heads, qkv_layout='separate', qkv_bias=True, qk_scale=None, attn_drop=0.,
                 proj_drop=0., sr_ratio=1):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        if qkv_layout not in QKV_LAYOUTS or (qkv_layout == 'fused' and sr_ratio > 1):
            raise ValueError(f"qkv_layout must be 'separate' or 'fused' (without spatial reduction), got "
                             f'{qkv_layout!r} with sr_ratio={sr_ratio}')
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.qkv_layout = qkv_layout
        if qkv_layout == 'fused':
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        else:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)

    def forward(self, x, hw, **context):
        B, N, C = x.shape
        heads = self.num_heads
        if self.qkv_layout == 'fused':
            q, k, v = self.qkv(x).reshape(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        elif self.sr_ratio == 1:  # keys and values of the tokens themselves: q and kv one product (norm_linear)
            q, k, v = norm_linear(None, (self.q, self.kv), x, chunk=C)
            q, k, v = [t.view(B, N, heads, C // heads).transpose(1, 2) for t in (q, k, v)]
        else:
            q = unviewed_when_compiling(self.q(x).reshape(B, N, heads, C // heads).permute(0, 2, 1, 3))
            x_, _ = spatial_reduction(x, hw, getattr(self, 'sr', None), getattr(self, 'norm', None))
            kv = self.kv(x_).reshape(B, -1, 2, heads, C // heads).permute(2, 0, 3, 1, 4)
            k, v = kv.unbind(0)  # one stack in the backward (indexing: a zero-filled copy each, then a sum)
        x = softmax_attention(q, k, v, self.scale, self.attn_drop).transpose(1, 2).reshape(B, N, C)
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


def window_partition(x, window_size):
    """(B, H, W, C) with H, W multiples of ws -> (nW*B, ws, ws, C)."""
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    # while compiling a copy first: whether the permutation is contiguous already (one window per row) would be
    # a guard on the sizes
    return unviewed_when_compiling(x.permute(0, 1, 3, 2, 4, 5)).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows, window_size, H, W):
    """(nW*B, ws, ws, C) -> (B, H, W, C)."""
    B = windows.shape[0] // ((H // window_size) * (W // window_size))  # integers: no guard under torch.compile
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    return unviewed_when_compiling(x.permute(0, 1, 3, 2, 4, 5)).contiguous().view(B, H, W, -1)


def shifted_window_mask(hw, window_size, shift_size, device):
    """(nW, ws*ws, ws*ws) float32 mask with -100 between tokens of different regions after a cyclic
    shift, 0 elsewhere.

    Built on the padded (H, W) like the official precomputed buffer and mmdet's run-time mask. The
    masks of the last few (H, W, window, shift, device) are kept (shared by every block, read-only):
    detection inputs change size, the blocks of a stage share theirs.
    """
    if torch.compiler.is_compiling():  # traced into the compiled graph, which keeps no Python cache; the sides
        # may be symbolic (dynamic shapes): taken as they are, as int() would fix them
        return _build_shifted_window_mask(tuple(hw), window_size, shift_size, device)
    return _kept_shifted_window_mask(tuple(int(side) for side in hw), int(window_size), int(shift_size),
                                     torch.device(device))


@functools.lru_cache(maxsize=16)
def _kept_shifted_window_mask(hw, window_size, shift_size, device):
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor, also when first built for inference
        return _build_shifted_window_mask(hw, window_size, shift_size, device)


def _build_shifted_window_mask(hw, window_size, shift_size, device):
    H, W = hw
    img_mask = torch.zeros((1, H, W, 1), device=device)
    slices = (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None))
    cnt = 0
    for h in slices:
        for w in slices:
            img_mask[:, h, w, :] = cnt
            cnt += 1
    mask_windows = window_partition(img_mask, window_size).view(-1, window_size * window_size)
    mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
    return mask.masked_fill(mask != 0, float(-100.0)).masked_fill(mask == 0, float(0.0))


@ATTENTIONS.register_module(name='window_softmax')
@register_notrace_module  # torch.fx leaf: data-dependent padding, shifts and masks
class WindowAttention(nn.Module):
    """Swin-v1 shifted-window softmax attention with relative position bias (Swin 'S' blocks).

    The map is zero-padded right/bottom to multiples of the window, cyclically shifted by
    ``window_size // 2`` when ``shift`` (the odd blocks of a stage) with the run-time shift mask
    built on the padded size (as mmdet's Swin), split into windows, attended, and put back.

    Keys: ``qkv``, ``relative_position_bias_table`` ((2ws-1)^2, h), ``proj``. The
    ``relative_position_index`` buffer is recomputed at construction and not persistent (the
    loaders drop it from official checkpoints, where it is stored).

    Args:
        dim, num_heads: channels and heads.
        window_size: the window side ws.
        shift: shift the windows by ws // 2 (odd blocks).
        clamp_shift: the classification rule: no shift when the map fits in one window
            (min(H, W) <= ws), as the official model decides at build time. Dense default False:
            always shift, as mmdet's Swin.
        qkv_bias, qk_scale, attn_drop, proj_drop: as in Swin.

    Shapes: ``forward(x, hw)``: (B, H*W, C), (H, W) -> (B, H*W, C).
    """

    letter = 'S'
    title = 'window softmax'

    def __init__(self, dim, num_heads, window_size=7, shift=False, clamp_shift=False, qkv_bias=True, qk_scale=None,
                 attn_drop=0., proj_drop=0.):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.dim = dim
        self.window_size = window_size
        self.shift_size = window_size // 2 if shift else 0
        self.clamp_shift = clamp_shift
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

    def forward(self, x, hw, **context):
        B, L, C = x.shape
        H, W = hw
        ws = self.window_size
        shift = self.shift_size
        if self.clamp_shift and min(H, W) <= ws:
            shift = 0
        x = x.view(B, H, W, C)
        Hp, Wp = padded_side(H, ws), padded_side(W, ws)
        pad_b, pad_r = Hp - H, Wp - W
        padded = padding_needed(pad_b, pad_r)
        if padded:
            x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        if shift:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
            mask = shifted_window_mask((Hp, Wp), ws, shift, x.device)
        else:
            mask = None
        windows = window_partition(x, ws).view(-1, ws * ws, C)
        windows = self.attend(windows, mask)
        x = window_reverse(windows.view(-1, ws, ws, C), ws, Hp, Wp)
        if shift:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        if padded:
            x = crop_map(x, 0, 0, H, W)
        return x.view(B, H * W, C)

    def relative_position_bias(self):
        """(heads, ws*ws, ws*ws): the bias table gathered by the relative position index."""
        N = self.window_size ** 2
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        return bias.permute(2, 0, 1).contiguous()

    def attend(self, x, mask=None):
        """Softmax attention within windows: x (nW*B, ws*ws, C); mask None or (nW, ws*ws, ws*ws)
        with 0 / -100 -> (nW*B, ws*ws, C).

        The relative position bias (gathered once) and the shift mask are one additive ``attn_mask``
        of q's dtype: (1, heads, N, N) without a mask, (nW, heads, N, N) with one, repeated for each
        image of the batch only when the batch has several.
        """
        B_, N, C = x.shape
        heads = self.num_heads
        q, k, v = self.qkv(x).reshape(B_, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        attn_mask = self.relative_position_bias().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn_mask = (attn_mask + mask.unsqueeze(1)).to(q.dtype)
            if B_ != nW:  # the windows are image-major (B*nW): the (nW, ...) mask is repeated per image
                attn_mask = attn_mask.expand(B_ // nW, -1, -1, -1, -1).reshape(B_, heads, N, N)
        x = softmax_attention(q, k, v, self.scale, self.attn_drop, attn_mask.to(q.dtype))
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B_, N, C)))

    def extra_repr(self):
        return f'dim={self.dim}, window_size={self.window_size}, num_heads={self.num_heads}, shift={self.shift_size}'


@ATTENTIONS.register_module(name='stripe_softmax')
@register_notrace_module  # torch.fx leaf: data-dependent padding and stripes
class StripeAttention(nn.Module):
    """CSWin's softmax attention in stripes with LePE (the official ``LePEAttention``; weights
    ``get_v``): the softmax of CSWin's 'S' blocks, called by the block with its channels of the
    projected q, k, v (``qkv_layout='projected'``, docs/design.md "CSWin: the block owns the
    projections").

    ``orientation='vertical'``: windows of the whole height by ``split_size`` columns (the official
    branch 0); ``'horizontal'``: ``split_size`` rows by the whole width (branch 1); ``'whole'``: the
    whole map (CSWin's last stage). LePE: a 3x3 depthwise conv ``get_v`` of v computed inside each
    stripe (zero padding at the stripe borders), added to the attention output. At any input size the
    q, k, v maps are zero-padded symmetrically (top/bottom, left/right halves) to whole stripes and
    the output is cropped back, without masking the padded keys, exactly as the official CSWin
    segmentation backbone.

    Args:
        dim: the branch's channels c; num_heads: its heads.
        split_size: the stripe width.
        orientation: ``'vertical'``, ``'horizontal'`` or ``'whole'``.
        qkv_layout: must be ``'projected'`` (the block owns the projections).
        qk_scale: softmax scale override (default d ** -0.5); attn_drop: attention dropout.

    Shapes: ``forward(x, hw)``: x (B, H*W, 3, c) projected q, k, v -> (B, H*W, c).
    """

    letter = 'S'
    title = 'stripe softmax'
    qkv_layouts = ('projected',)
    applies_lepe = True  # its LePE is per stripe (the CSWin block adds the whole-map LePE of the other kinds)
    ORIENTATIONS = ('vertical', 'horizontal', 'whole')

    def __init__(self, dim, num_heads, split_size=7, orientation='whole', qkv_layout='projected', qk_scale=None,
                 attn_drop=0.):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        if qkv_layout != 'projected':
            raise ValueError("stripe softmax attention runs inside CSWin blocks, which own the projections "
                             f"(qkv_layout='projected'), got {qkv_layout!r}")
        if orientation not in self.ORIENTATIONS:
            raise ValueError(f'orientation must be one of {self.ORIENTATIONS}, got {orientation!r}')
        self.dim, self.num_heads, self.split_size, self.orientation = dim, num_heads, split_size, orientation
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.get_v = DepthwiseConv2d(dim, 3)
        self.attn_drop = nn.Dropout(attn_drop)

    def stripe(self, hw):
        """(height, width) of a stripe on an H x W map."""
        H, W = hw
        if self.orientation == 'whole':
            return H, W
        return (H, self.split_size) if self.orientation == 'vertical' else (self.split_size, W)

    def forward(self, x, hw, **context):
        B, N, _, C = x.shape
        H, W = hw
        hsp, wsp = self.stripe(hw)
        Hp = padded_side(H, self.split_size) if self.orientation == 'horizontal' else H  # whole stripes
        Wp = padded_side(W, self.split_size) if self.orientation == 'vertical' else W
        pad_h, pad_w = Hp - H, Wp - W
        top, left = pad_h // 2, pad_w // 2
        x = x[:, :, :3]
        padded = padding_needed(pad_h, pad_w)
        if padded:
            # padded in the tokens' layout, the channels innermost: padded as (B, 3, C, H, W) maps, q, k and v
            # would have a head dim of stride Hp * Wp, which the fused kernels of scaled_dot_product_attention
            # (flash, memory-efficient, cuDNN) refuse, so that its math path would run
            x = F.pad(x.reshape(B, H, W, 3, C), (0, 0, 0, 0, left, pad_w - left, top, pad_h - top)).flatten(1, 2)
        maps = x.permute(0, 2, 3, 1).reshape(B, 3, C, Hp, Wp)
        q, k, v = maps.unbind(1)
        heads, d, L = self.num_heads, C // self.num_heads, hsp * wsp
        q = _stripe_tokens(q, hsp, wsp).reshape(-1, L, heads, d).permute(0, 2, 1, 3)
        k = _stripe_tokens(k, hsp, wsp).reshape(-1, L, heads, d).permute(0, 2, 1, 3)
        lepe = self.get_v(_stripe_maps(v, hsp, wsp)).reshape(-1, heads, d, L).permute(0, 1, 3, 2)
        v = _stripe_tokens(v, hsp, wsp).reshape(-1, L, heads, d).permute(0, 2, 1, 3)  # d contiguous: fused kernels
        out = (softmax_attention(q, k, v, self.scale, self.attn_drop) + lepe).transpose(1, 2).reshape(-1, L, C)
        out = _merge_stripes(out, hsp, wsp, Hp, Wp)
        if padded:
            out = crop_map(out, top, left, H, W)
        return out.reshape(B, N, C)

    def extra_repr(self):
        return f'dim={self.dim}, num_heads={self.num_heads}, split_size={self.split_size}, {self.orientation}'


def _stripe_tokens(t, hsp, wsp):
    """(B, C, H, W) -> (B * stripes, hsp * wsp, C), stripes in row-major order (official ``img2windows``)."""
    B, C, H, W = t.shape
    t = t.view(B, C, H // hsp, hsp, W // wsp, wsp)
    return t.permute(0, 2, 4, 3, 5, 1).reshape(-1, hsp * wsp, C)


def _stripe_maps(t, hsp, wsp):
    """(B, C, H, W) -> (B * stripes, C, hsp, wsp): every stripe as its own small map."""
    B, C, H, W = t.shape
    t = t.view(B, C, H // hsp, hsp, W // wsp, wsp)
    return t.permute(0, 2, 4, 1, 3, 5).reshape(-1, C, hsp, wsp)


def _merge_stripes(stripes, hsp, wsp, H, W):
    """(B * stripes, hsp * wsp, C) -> (B, H, W, C) (official ``windows2img``)."""
    B = stripes.shape[0] // ((H // hsp) * (W // wsp))
    stripes = stripes.view(B, H // hsp, W // wsp, hsp, wsp, -1)
    return stripes.permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, -1)
