"""Swin-v1 as a dense-prediction backbone with any registered attention kind: :class:`SwinBackbone`
(registered as ``SwinBackbone``, family ``'swin'``; presets ``PolaSwin``, ``FLattenSwin``,
``InLineSwin`` in :mod:`.presets`).

The module tree is the official one (``patch_embed``, ``layers.{i}.blocks.{j}.attn.*``,
``layers.{i}.downsample.reduction`` ...), so official checkpoints load by filtering keys.

Linear-attention blocks run over the whole stage map (no windows, no shift): at the pretraining
resolution the official linear blocks (window 56 at 224) are one window covering the whole map,
unshifted, so this is the same computation, and at other sizes the positional encoding (where the
kind has one) is resized to the map. Softmax blocks (kind ``'window_softmax'``) use Swin's padded,
shifted windows with a run-time mask, as mmdet's Swin. The official classifier: final ``norm``
(LN eps 1e-5), average pool over the tokens, linear ``head``; its softmax blocks do not shift a map
that fits in one window (``clamp_shift``).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checks import square_pretrain_size
from ..classification_head import FinalNormHead, register_classification_head
from ..layers import PatchEmbed, PatchMerging, PreNormBlock
from .base import DenseBackbone, drop_path_rates, register_architecture

__all__ = ['SwinBackbone', 'SwinHead', 'SwinStage']


class SwinStage(nn.Module):
    """``layers.{i}``: ``blocks`` then optional ``downsample`` (:class:`PatchMerging`)."""

    def __init__(self, blocks, downsample=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


@register_architecture('swin', title='Swin')
class SwinBackbone(DenseBackbone):
    """Swin-v1 backbone with the attention of ``attn`` / ``attn_type``.

    Input (B, in_channels, H, W) with H, W >= 32 (any, odd and non-square included). Output: a
    tuple of NCHW maps (channels ``embed_dims * 2**i``) for ``out_indices``, each the stage output
    before patch merging through the output norm ``norm{i}``. Sizes ceil: the image is zero-padded
    right/bottom to a multiple of 4, and merging pads odd maps, so H_1 = ceil(H / 4),
    H_{i+1} = ceil(H_i / 2) (mmdet Swin convention).

    Args:
        arch: ``'tiny'``, ``'small'``, ``'base'`` (see ``arch_settings``) or a dict with
            ``embed_dims`` (int, stage-1 width), ``depths`` and ``num_heads`` (four entries).
            The 384 model: ``arch='base', pretrain_img_size=384`` (window_size 96, softmax
            window 12).
        pretrain_img_size: pretraining image size; sets the stored grid of positional encodings
            (side = min(window_size, pretrain_img_size / 4 / 2**i)).
        in_channels: input image channels.
        window_size: the official ``window_size`` of linear blocks (None: pretrain_img_size // 4,
            i.e. 56 at 224 and 96 at 384, as released).
        softmax_window_size: window of softmax blocks (None: the official rule of the release,
            :meth:`default_softmax_window_size`), clamped to the stage grid at pretraining as the
            official code does.
        mlp_ratio: MLP hidden ratio.
        attn: the attention kind and its options (``dict(type='pola', alpha=4.0)``); see
            :class:`~mmpola.models.backbones.DenseBackbone`.
        attn_type: per-stage string of the letter of ``attn`` / 'S' / 'M' (see
            :func:`~mmpola.models.backbones.parse_attn_type`). None: the preset's string.
        qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path_rate: as in Swin.
        out_indices: stages (0-based) to return.
        out_norm: add the output LayerNorms ``norm{i}`` (eps 1e-5) for ``out_indices`` (new,
            dense-only parameters, as mmdet; default True). ``False`` returns raw stage outputs
            (classifier).
        clamp_shift: the classification shift rule (``False`` for dense prediction; see
            :class:`~mmpola.models.attention.WindowAttention`).
        frozen_stages: -1 none; 0 freezes ``patch_embed``; k >= 1 also ``layers[0..k-1]`` (blocks
            and their downsample) and ``norm{i}`` for i < k (mmdet's rule).
        norm_eval, with_cp, recompute, attn_impl, fp32_attn: see
            :class:`~mmpola.models.backbones.DenseBackbone`.
        init_cfg: see :class:`~mmpola.models.backbones.DenseBackbone`; ``map_final_norm=True`` copies
            the trained classification ``norm`` into ``norm3``.
        **unexpected: an error naming the attention options, which go in ``attn``.

    Attention context: ``pe_grid`` = the linear window at pretraining (the stage grid at 224),
    ``qkv_layout='fused'``, ``window_size`` (the softmax window), ``shift`` (odd blocks),
    ``clamp_shift``.

    Stages after ``max(out_indices)`` are built (so checkpoints load unchanged) but not run.
    """

    arch_settings = {
        'tiny': dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24]),
        'small': dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24]),
        'base': dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32]),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    out_norm_eps = 1e-5
    default_out_norm = True
    softmax_attn = 'window_softmax'
    attention_context = ('qkv_layout', 'window_size', 'shift', 'clamp_shift')
    official_key_pattern = 'layers.0.blocks.*'
    look_alikes = {'mmdet/mmseg Swin (not Pola; softmax attention only)': r'(^|\.)stages\.0\.blocks\.'}
    first_conv = 'patch_embed.proj'

    def __init__(self, arch='tiny', pretrain_img_size=224, in_channels=3, window_size=None,
                 softmax_window_size=None, mlp_ratio=4., attn_type=None, qkv_bias=True, qk_scale=None,
                 drop_rate=0., attn_drop_rate=0., drop_path_rate=0.2, out_indices=(0, 1, 2, 3), out_norm=None,
                 clamp_shift=False, frozen_stages=-1, norm_eval=False, with_cp=False, recompute=None,
                 attn=None, attn_impl='auto', fp32_attn=True, init_cfg=None, **unexpected):
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=out_norm,
                         frozen_stages=frozen_stages, norm_eval=norm_eval,
                         with_cp=with_cp, recompute=recompute, attn=attn, attn_type=attn_type, attn_impl=attn_impl,
                         fp32_attn=fp32_attn, unexpected=unexpected, init_cfg=init_cfg)
        name = type(self).__name__
        settings = self.arch
        embed_dims = settings['embed_dims']
        self.embed_dims = self.doubling_widths()
        self.init_stages(('depths', 'num_heads'))
        self.clamp_shift = clamp_shift
        self.pretrain_img_size = square_pretrain_size(pretrain_img_size, name)
        patches = self.pretrain_img_size[0] // 4
        self.window_size = patches if window_size is None else window_size
        if softmax_window_size is None:
            softmax_window_size = self.default_softmax_window_size(self.window_size)
        self.softmax_window_size = softmax_window_size

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size=4, pad=True)
        self.pos_drop = nn.Dropout(p=drop_rate)
        dpr = drop_path_rates(drop_path_rate, self.depths)
        self.layers = nn.ModuleList()
        for i in range(self.num_stages):
            dim = self.embed_dims[i]
            res = patches // 2 ** i  # stage grid at pretraining
            pe_side = min(self.window_size, res)
            ws = min(softmax_window_size, res)
            blocks = []
            for j in range(self.depths[i]):
                attn = self.build_attention(i, j, dim, self.num_heads[i], pe_grid=(pe_side, pe_side),
                                            qkv_layout='fused', window_size=ws, shift=j % 2 == 1,
                                            clamp_shift=clamp_shift, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                            attn_drop=attn_drop_rate, proj_drop=drop_rate)
                blocks.append(PreNormBlock(dim, attn, mlp_ratio=mlp_ratio, drop=drop_rate, drop_path=dpr[i][j],
                                           norm_eps=1e-5))
            downsample = PatchMerging(dim) if i < self.num_stages - 1 else None
            self.layers.append(SwinStage(blocks, downsample))
        self._finish_init()

    @staticmethod
    def default_softmax_window_size(window_size):
        """The official softmax window for a linear ``window_size``: 7 up to 56, else 12."""
        return 7 if window_size <= 56 else 12

    # ---------------------------------------------------------------------------------------------
    # DenseBackbone hooks

    def _stem(self, x):
        x, hw = self.patch_embed(x)
        return self.pos_drop(x), hw

    def _enter_stage(self, i, x, hw):
        return self.layers[i - 1].downsample(x, hw) if i > 0 else (x, hw)

    def _stage_blocks(self, i):
        return self.layers[i].blocks

    def _stem_parts(self):
        return [self.patch_embed, self.pos_drop], []

    def _stage_parts(self, i):
        return [self.layers[i]], []

    def stage_module(self, i):
        return f'layers.{i}.blocks'


@register_classification_head('swin')
class SwinHead(FinalNormHead):
    """The official Swin classifier: final LayerNorm ``norm``, average pool, linear ``head``."""

    backbone_kwargs = dict(out_norm=False, clamp_shift=True)

    @classmethod
    def pool(cls, backbone, x, global_pool='avg'):
        """The official op order: adaptive average pool over the token axis."""
        return torch.flatten(F.adaptive_avg_pool1d(x.flatten(1, 2).transpose(1, 2), 1), 1)

    @classmethod
    def official_kwargs(cls, architecture, kwargs):
        """The official ``SwinTransformer`` arguments of the releases (``embed_dim`` ...)."""
        if 'embed_dim' not in kwargs or 'depths' not in kwargs:
            return None
        kwargs = dict(kwargs)
        if kwargs.pop('patch_size', 4) != 4:
            raise ValueError('only patch_size=4 (every released model) is supported')
        if kwargs.pop('ape', False):
            raise ValueError('ape=True (absolute position embedding) is not supported; no released model uses it')
        if not kwargs.pop('patch_norm', True):
            raise ValueError('patch_norm=False is not supported; every released model uses it')
        out = dict(family=architecture.family, num_classes=kwargs.pop('num_classes', 1000),
                   drop_rate=kwargs.pop('drop_rate', 0.), drop_path_rate=kwargs.pop('drop_path_rate', 0.),
                   pretrain_img_size=kwargs.pop('img_size', 224),
                   arch=dict(embed_dims=kwargs.pop('embed_dim'), depths=list(kwargs.pop('depths')),
                             num_heads=list(kwargs.pop('num_heads'))))
        for key in ('qkv_bias', 'qk_scale', 'attn_drop_rate', 'window_size', 'mlp_ratio'):
            if key in kwargs:
                out[key] = kwargs.pop(key)
        for key in ('use_checkpoint', 'in_chans'):
            kwargs.pop(key, None)
        attn_type = kwargs.pop('attn_type', None)
        return out, kwargs, attn_type
