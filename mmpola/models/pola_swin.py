"""Pola-Swin: Swin-v1 with polarity-aware linear attention, as a dense-prediction backbone.

Spec: /work/shared/design/pola_spec.md (§1.2 attention, §1.8 block types, §1.9 model, §3.3 dense
forward). The module tree is the official one (``patch_embed``, ``layers.{i}.blocks.{j}.attn.qkvg``,
``layers.{i}.downsample.reduction`` ...), so official checkpoints load by filtering keys.

Pola blocks run over the whole stage map (no windows, no shift): at the pretraining resolution the
official Pola blocks are one window covering the whole map, unshifted (spec §1.8), so this is the
same computation, and at other sizes the positional encoding is resized to the map. Softmax
blocks use Swin's padded, shifted windows with a run-time mask, as mmdet's Swin.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from timm.layers import register_notrace_module

from .layers import (DropPath, Mlp, PatchEmbed, PatchMerging, PolaAttention, WindowAttention,
                     init_official_weights, to_2tuple_int)
from .utils import (check_frozen_stages, check_input, check_out_indices, is_pretrained_cfg,
                    pretrained_alias, resolve_arch)

__all__ = ['PolaSwin', 'PolaSwinBlock', 'PolaSwinStage', 'parse_swin_attn_type']

_STRUCTURE_KEYS = ('embed_dims', 'depths', 'num_heads')


def parse_swin_attn_type(attn_type, depths):
    """Per-block attention kinds from the official ``attn_type`` string (spec §1.8).

    One char per stage: ``'L'`` Pola, ``'S'`` softmax, ``'M'`` mixed, where the integer after the
    stage chars gives the number of leading Pola blocks of every 'M' stage ("LLMS3": stage 2
    blocks 0-2 Pola, the rest softmax).

    Returns:
        list (per stage) of lists (per block) of 'L' / 'S'.
    """
    num_stages = len(depths)
    if not isinstance(attn_type, str) or len(attn_type) < num_stages:
        raise ValueError(f'attn_type must be a string of {num_stages} chars from "LSM" (plus the '
                         f'Pola block count for "M" stages, e.g. "LLMS3"), got {attn_type!r}')
    stages, suffix = attn_type[:num_stages], attn_type[num_stages:]
    if any(c not in 'LSM' for c in stages):
        raise ValueError(f'attn_type {attn_type!r}: stage chars must be L, S or M')
    if 'M' in stages and not suffix.isdigit():
        raise ValueError(f'attn_type {attn_type!r}: an "M" stage needs the number of Pola blocks '
                         f'after the stage chars, e.g. "LLMS3"')
    if suffix and 'M' not in stages:
        raise ValueError(f'attn_type {attn_type!r}: trailing {suffix!r} without an "M" stage')
    kinds = []
    for c, depth in zip(stages, depths):
        if c == 'M':
            kinds.append(['L' if j < int(suffix) else 'S' for j in range(depth)])
        else:
            kinds.append([c] * depth)
    return kinds


def window_partition(x, window_size):
    """(B, H, W, C) with H, W multiples of ws -> (nW*B, ws, ws, C)."""
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows, window_size, H, W):
    """(nW*B, ws, ws, C) -> (B, H, W, C)."""
    B = int(windows.shape[0] / (H * W / window_size / window_size))
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


def shifted_window_mask(hw, window_size, shift_size, device):
    """(nW, ws*ws, ws*ws) mask with -100 between tokens of different regions after a cyclic shift.

    Built on the padded (H, W) like the official precomputed buffer and mmdet's run-time mask.
    """
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


@register_notrace_module  # torch.fx leaf: data-dependent padding, shifts and masks
class PolaSwinBlock(nn.Module):
    """Pre-norm Swin block with Pola ('L') or shifted-window softmax ('S') attention.

    Args:
        dim, num_heads, mlp_ratio, qkv_bias, qk_scale, drop, attn_drop, drop_path: as in Swin.
        attn_type: 'L' or 'S'.
        pe_grid: (side, side) grid of the Pola positional encoding ('L').
        window_size: softmax window ('S').
        shift: shift the windows by ws // 2 ('S'; odd blocks).
        clamp_shift: the classification rule: no shift when the map fits in one window
            (min(H, W) <= ws), as the official model decides at build time. Dense default False:
            always shift odd blocks, as mmdet's Swin.
        alpha, kernel_size, attn_impl, fp32_attn: Pola attention settings.

    Shapes: ``forward(x, hw)``: (B, H*W, C), (H, W) -> (B, H*W, C).
    """

    def __init__(self, dim, num_heads, attn_type='L', pe_grid=(56, 56), window_size=7, shift=False,
                 clamp_shift=False, mlp_ratio=4., qkv_bias=True, qk_scale=None, drop=0., attn_drop=0.,
                 drop_path=0., alpha=4.0, kernel_size=5, attn_impl='auto', fp32_attn=True):
        super().__init__()
        self.attn_type = attn_type
        self.window_size = window_size
        self.shift_size = window_size // 2 if shift else 0
        self.clamp_shift = clamp_shift
        self.norm1 = nn.LayerNorm(dim)
        if attn_type == 'L':
            self.attn = PolaAttention(dim, num_heads, pe_grid, qkv_layout='qkvg', qkv_bias=qkv_bias,
                                      alpha=alpha, kernel_size=kernel_size, proj_drop=drop,
                                      attn_impl=attn_impl, fp32_attn=fp32_attn)
        elif attn_type == 'S':
            self.attn = WindowAttention(dim, window_size, num_heads, qkv_bias=qkv_bias,
                                        qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop)
        else:
            raise ValueError(f"attn_type must be 'L' or 'S', got {attn_type!r}")
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self._mask_cache = (None, None)  # (key, mask); a plain attribute, never in state dicts

    def _window_attention(self, x, hw):
        B, L, C = x.shape
        H, W = hw
        ws = self.window_size
        shift = self.shift_size
        if self.clamp_shift and min(H, W) <= ws:
            shift = 0
        x = x.view(B, H, W, C)
        pad_b, pad_r = (-H) % ws, (-W) % ws
        if pad_b or pad_r:
            x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        Hp, Wp = H + pad_b, W + pad_r
        if shift:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
            mask = self._shift_mask((Hp, Wp), shift, x.device)
        else:
            mask = None
        windows = window_partition(x, ws).view(-1, ws * ws, C)
        windows = self.attn(windows, mask=mask)
        x = window_reverse(windows.view(-1, ws, ws, C), ws, Hp, Wp)
        if shift:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        if pad_b or pad_r:
            x = x[:, :H, :W, :].contiguous()
        return x.view(B, H * W, C)

    def _shift_mask(self, padded_hw, shift, device):
        key = (tuple(padded_hw), shift, device)
        if self._mask_cache[0] != key:
            self._mask_cache = (key, shifted_window_mask(padded_hw, self.window_size, shift, device))
        return self._mask_cache[1]

    def forward(self, x, hw):
        if self.attn_type == 'L':
            attn = self.attn(self.norm1(x), hw)
        else:
            attn = self._window_attention(self.norm1(x), hw)
        x = x + self.drop_path(attn)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PolaSwinStage(nn.Module):
    """``layers.{i}``: ``blocks`` then optional ``downsample`` (:class:`PatchMerging`)."""

    def __init__(self, blocks, downsample=None, with_cp=False):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample
        self.with_cp = with_cp

    def forward(self, x, hw):
        """(B, H*W, C), (H, W) -> stage output (before downsampling) and its (H, W)."""
        for block in self.blocks:
            if self.with_cp and torch.is_grad_enabled() and x.requires_grad:
                x = cp.checkpoint(block, x, hw, use_reentrant=False)
            else:
                x = block(x, hw)
        return x, hw


@MODELS.register_module()
class PolaSwin(BaseModule):
    """Pola-Swin backbone (PolaFormer, ICLR 2025) for mmdet / mmseg.

    Registered in mmengine's root ``MODELS`` registry, so ``dict(type='PolaSwin', ...)`` builds
    from mmdet's, mmseg's and any other OpenMMLab library's registry.

    Input (B, in_channels, H, W) with H, W >= 32 (any, odd and non-square included). Output: a
    tuple of NCHW maps (channels ``embed_dims * 2**i``) for ``out_indices``, each the stage output
    before patch merging through the output norm ``norm{i}``. Sizes ceil: the image is zero-padded
    right/bottom to a multiple of 4, and merging pads odd maps, so H_1 = ceil(H / 4),
    H_{i+1} = ceil(H_i / 2) (mmdet Swin convention).

    Stages: Pola blocks attend over the whole stage map with the positional encoding resized
    (bilinear) from its pretraining grid; softmax blocks pad to multiples of the window, shift odd
    blocks by ws // 2 and mask (run-time mask, as mmdet).

    Args:
        arch: ``'tiny'``, ``'small'``, ``'base'`` (see ``arch_settings``) or a dict with
            ``embed_dims`` (int, stage-1 width), ``depths`` and ``num_heads`` (four entries).
            The 384 model: ``arch='base', pretrain_img_size=384`` (window_size 96, softmax
            window 12).
        pretrain_img_size: pretraining image size; sets the stored grid of Pola positional
            encodings (side = min(window_size, pretrain_img_size / 4 / 2**i)).
        in_channels: input image channels.
        window_size: the official ``window_size`` of Pola blocks (None: pretrain_img_size // 4,
            i.e. 56 at 224 and 96 at 384, as released).
        softmax_window_size: window of softmax blocks (None: 7 if window_size <= 56 else 12, the
            official rule), clamped to the stage grid at pretraining as the official code does.
        mlp_ratio: MLP hidden ratio.
        attn_type: per-stage 'L' / 'S' / 'M' string (released: ``'LLSS'``).
        alpha, kernel_size: Pola exponent range and dwc kernel.
        qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path_rate: as in Swin.
        out_indices: stages (0-based) to return.
        out_norm: add the output LayerNorms ``norm{i}`` (eps 1e-5) for ``out_indices`` (new,
            dense-only parameters, as mmdet). ``False`` returns raw stage outputs (classifier).
        clamp_shift: see :class:`PolaSwinBlock` (``False`` for dense prediction).
        frozen_stages: -1 none; 0 freezes ``patch_embed``; k >= 1 also ``layers[0..k-1]`` (blocks
            and their downsample) and ``norm{i}`` for i < k (mmdet's rule). Kept through
            ``train()``.
        norm_eval: accepted for API compatibility; a no-op (LayerNorm only, no running stats).
        with_cp: gradient checkpointing of every block.
        attn_impl, fp32_attn: passed to every :class:`PolaAttention`.
        pretrained: deprecated alias of ``init_cfg=dict(type='Pretrained', checkpoint=...)``.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL, prefix=None, use_ema=True,
            map_final_norm=False)``: loads through :func:`mmpola.checkpoint.load_pola_checkpoint`.
            ``map_final_norm=True`` copies the trained classification ``norm`` into ``norm3``.

    Stages after ``max(out_indices)`` are built (so checkpoints load unchanged) but not run.
    """

    arch_settings = {
        'tiny': dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24]),
        'small': dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24]),
        'base': dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32]),
    }
    num_stages = 4
    min_input_size = 32
    official_name = 'Pola-Swin'
    official_key_pattern = 'layers.0.blocks.*'

    def __init__(self, arch='tiny', pretrain_img_size=224, in_channels=3, window_size=None,
                 softmax_window_size=None, mlp_ratio=4., attn_type='LLSS', alpha=4.0, kernel_size=5,
                 qkv_bias=True, qk_scale=None, drop_rate=0., attn_drop_rate=0., drop_path_rate=0.2,
                 out_indices=(0, 1, 2, 3), out_norm=True, clamp_shift=False, frozen_stages=-1,
                 norm_eval=False, with_cp=False, attn_impl='auto', fp32_attn=True, pretrained=None,
                 init_cfg=None):
        init_cfg = pretrained_alias(pretrained, init_cfg)
        super().__init__(init_cfg=init_cfg)
        name = type(self).__name__
        settings = resolve_arch(arch, self.arch_settings, _STRUCTURE_KEYS, name)
        embed_dims = settings['embed_dims']
        if not isinstance(embed_dims, int):
            raise ValueError(f'{name}: embed_dims must be the stage-1 width (int), got {embed_dims!r}')
        self.depths = list(settings['depths'])
        self.num_heads = list(settings['num_heads'])
        if len(self.depths) != self.num_stages or len(self.num_heads) != self.num_stages:
            raise ValueError(f'{name}: depths and num_heads need {self.num_stages} entries each')
        self.embed_dims = [embed_dims * 2 ** i for i in range(self.num_stages)]
        self.out_indices = check_out_indices(out_indices, self.num_stages, name)
        self.frozen_stages = check_frozen_stages(frozen_stages, self.num_stages, name)
        self.attn_type = attn_type
        self.block_types = parse_swin_attn_type(attn_type, self.depths)
        self.in_channels = in_channels
        self.norm_eval = norm_eval  # no-op: LayerNorm only
        self.out_norm = out_norm
        self.pretrain_img_size = to_2tuple_int(pretrain_img_size, 'pretrain_img_size')
        if self.pretrain_img_size[0] != self.pretrain_img_size[1]:
            raise ValueError(f'{name}: pretrain_img_size must be square (official models are), got '
                             f'{self.pretrain_img_size}')
        patches = self.pretrain_img_size[0] // 4
        self.window_size = patches if window_size is None else window_size
        if softmax_window_size is None:
            softmax_window_size = 7 if self.window_size <= 56 else 12
        self.softmax_window_size = softmax_window_size

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size=4, pad=True)
        self.pos_drop = nn.Dropout(p=drop_rate)
        total = sum(self.depths)
        dpr = torch.linspace(0, drop_path_rate, total, device='cpu').tolist() if total > 1 else [0.0] * total
        self.layers = nn.ModuleList()
        cur = 0
        for i in range(self.num_stages):
            dim = self.embed_dims[i]
            res = patches // 2 ** i  # stage grid at pretraining
            pe_side = min(self.window_size, res)
            ws = min(softmax_window_size, res)
            blocks = [
                PolaSwinBlock(dim, self.num_heads[i], attn_type=kind, pe_grid=(pe_side, pe_side),
                              window_size=ws, shift=(j % 2 == 1), clamp_shift=clamp_shift,
                              mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale,
                              drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[cur + j],
                              alpha=alpha, kernel_size=kernel_size, attn_impl=attn_impl,
                              fp32_attn=fp32_attn)
                for j, kind in enumerate(self.block_types[i])]
            cur += self.depths[i]
            downsample = PatchMerging(dim) if i < self.num_stages - 1 else None
            self.layers.append(PolaSwinStage(blocks, downsample, with_cp=with_cp))
        if out_norm:
            for i in self.out_indices:
                self.add_module(f'norm{i}', nn.LayerNorm(self.embed_dims[i]))
        self.apply(init_official_weights)
        self._freeze_stages()

    @property
    def out_channels(self):
        """Channels of the returned maps, in ``out_indices`` order (for necks' in_channels)."""
        return [self.embed_dims[i] for i in self.out_indices]

    @property
    def with_cp(self):
        return self.layers[0].with_cp

    @with_cp.setter
    def with_cp(self, value):
        for stage in self.layers:
            stage.with_cp = value

    def init_weights(self):
        """Load ``init_cfg`` type 'Pretrained' with mmpola's loader; other configs go to mmengine."""
        if is_pretrained_cfg(self.init_cfg):
            from mmpola.checkpoint import load_pola_checkpoint
            cfg = dict(self.init_cfg)
            load_pola_checkpoint(self, cfg['checkpoint'], prefix=cfg.get('prefix'),
                                 use_ema=cfg.get('use_ema', True),
                                 map_final_norm=cfg.get('map_final_norm', False),
                                 map_location=cfg.get('map_location', 'cpu'))
            self._is_init = True
        else:
            super().init_weights()
        self._freeze_stages()

    def set_attn_impl(self, impl):
        """Switch every Pola attention between ``'auto'`` and ``'reference'``."""
        for module in self.modules():
            if isinstance(module, PolaAttention):
                module.attn_impl = impl

    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        modules = [self.patch_embed, self.pos_drop]
        for i in range(self.frozen_stages):
            modules.append(self.layers[i])
            if hasattr(self, f'norm{i}'):
                modules.append(getattr(self, f'norm{i}'))
        for module in modules:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode=True):
        """Set train/eval mode, keeping frozen stages frozen (``norm_eval`` has nothing to do)."""
        super().train(mode)
        self._freeze_stages()
        return self

    def forward_stages(self, x, last_stage=None):
        """Run the stages 0..last_stage.

        Args:
            x: (B, in_channels, H, W) images.
            last_stage: last 0-based stage to run (default: the last one).

        Returns:
            list of (tokens (B, H_i*W_i, C_i), (H_i, W_i)): every stage's output before patch
            merging and before any output norm.
        """
        check_input(x, self.in_channels, self.min_input_size, type(self).__name__)
        last_stage = self.num_stages - 1 if last_stage is None else last_stage
        x, hw = self.patch_embed(x)
        x = self.pos_drop(x)
        outs = []
        for i in range(last_stage + 1):
            stage = self.layers[i]
            x, hw = stage(x, hw)
            outs.append((x, hw))
            if i < last_stage:
                x, hw = stage.downsample(x, hw)
        return outs

    def forward(self, x):
        """(B, C_in, H, W) -> tuple of (B, C_i, H_i, W_i) for i in ``out_indices``."""
        stages = self.forward_stages(x, max(self.out_indices))
        outs = []
        for i in self.out_indices:
            tokens, (H, W) = stages[i]
            if self.out_norm:
                tokens = getattr(self, f'norm{i}')(tokens)
            outs.append(tokens.reshape(-1, H, W, self.embed_dims[i]).permute(0, 3, 1, 2).contiguous())
        return tuple(outs)
