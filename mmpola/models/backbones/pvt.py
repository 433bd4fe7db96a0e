"""PVT-v1 as a dense-prediction backbone with any registered attention kind: :class:`PVTBackbone`
(registered as ``PVTBackbone``, family ``'pvt'``; presets ``PolaPVT``, ``FLattenPVT``,
``InLinePVT`` in :mod:`.presets`).

The module tree is the official one (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}.{j}.attn.*``
...), so official ImageNet checkpoints load by filtering keys (:meth:`PVTBackbone.checkpoint_filter`).
The official classifier: mean of the stage-4 tokens **without** a final norm, then a linear
``head`` (the official Pola and FLatten models own a ``norm`` their forward never uses; the
classifier has none and the filter drops it, so every parameter trains).
"""
import torch
import torch.nn as nn
from timm.layers import trunc_normal_

from mmpola.checkpoint import CheckpointMismatchError
from mmpola.ops.dispatch import autocast_dtype

from ..checks import check_stage_string, square_pretrain_size
from ..classification_head import ClassificationHead, register_classification_head
from ..layers import PatchEmbed, PreNormBlock, ResizedEmbeddingCache, tokens_as_map
from .base import DenseBackbone, drop_path_rates, register_architecture

__all__ = ['PVTBackbone', 'PVTHead', 'check_la_sr_ratios', 'pvt_classifier_kwargs', 'pvt_pos_grids',
           'pvt_stage_settings']


@register_architecture('pvt', title='PVT')
class PVTBackbone(DenseBackbone):
    """PVT-v1 backbone with the attention of ``attn`` / ``attn_type``.

    Input (B, in_channels, H, W) with H, W >= 32 (any, odd and non-square included). Output: a
    tuple of NCHW maps, one per ``out_indices`` entry, with channels ``embed_dims[i]`` and sizes
    H_1 = floor(H / 4), H_{i+1} = floor(H_i / 2) (strides 4, 8, 16, 32; conv patch embeddings
    without padding, as the official models and mmdet's PVT). Stage outputs are the raw block
    outputs (no norm), unless ``out_norm``.

    Positional encodings (``pos_embed{i}`` and the attention's ``positional_encoding`` where the
    kind has one) are stored on the pretraining grid and bilinearly resized to the real stage grid
    at run time (skipped when equal, so a 224 input reproduces the official network).

    Args:
        arch: ``'tiny'``, ``'small'``, ``'medium'``, ``'large'`` (see ``arch_settings``) or a dict
            with ``embed_dims``, ``num_heads``, ``mlp_ratios``, ``depths`` (four entries each).
        pretrain_img_size: image size of the pretraining (sets the stored grid of the positional
            encodings: 224 -> 56, 28, 14, 7).
        in_channels: input image channels.
        out_indices: stages (0-based) to return.
        attn: the attention kind and its options (``dict(type='pola', alpha=4.0)``); see
            :class:`~mmpola.models.backbones.DenseBackbone`.
        attn_type: one char per stage: the letter of ``attn`` (``'L'`` Pola / FLatten, ``'I'``
            InLine) or ``'S'`` softmax (``'M'`` mixed). None: the preset's string.
        la_sr_ratios: spatial reduction of the non-softmax blocks per stage, as a 4-digit string or a
            sequence (released: ``'1111'``; the official class default '8421' was *not* used).
        sr_ratios: spatial reduction of softmax ('S') blocks per stage.
        qkv_bias, qk_scale: projections' bias; softmax scale override ('S' blocks only).
        drop_rate, attn_drop_rate, drop_path_rate: dropout after projections and embeddings,
            attention dropout ('S' only), stochastic depth (linear over all blocks).
        out_norm: add a LayerNorm (eps 1e-6) ``norm{i}`` to every returned stage (new,
            dense-only parameters; off like mmdet's PVTv1).
        frozen_stages: -1 none; 0 freezes ``patch_embed1`` and ``pos_embed1``; k >= 1 freezes
            stages 1..k entirely (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}`` and its
            ``norm{i-1}``).
        norm_eval, with_cp, recompute, attn_impl, fp32_attn, init_cfg: see
            :class:`~mmpola.models.backbones.DenseBackbone`.
        **unexpected: an error naming the attention options, which go in ``attn``.

    Attention context: ``pe_grid`` = the stage grid at pretraining, ``qkv_layout='separate'``,
    ``sr_ratio`` (``la_sr_ratios`` or, for the softmax, ``sr_ratios``).

    Stages after ``max(out_indices)`` are built (so checkpoints load unchanged) but not run.
    """

    arch_settings = {
        'tiny': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8],
                     mlp_ratios=[8, 8, 4, 4], depths=[2, 2, 2, 2]),
        'small': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8],
                      mlp_ratios=[8, 8, 4, 4], depths=[3, 4, 6, 3]),
        'medium': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8],
                       mlp_ratios=[8, 8, 4, 4], depths=[3, 4, 18, 3]),
        'large': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8],
                      mlp_ratios=[8, 8, 4, 4], depths=[3, 8, 27, 3]),
    }
    arch_keys = ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')
    out_norm_eps = 1e-6
    softmax_attn = 'softmax'
    softmax_name = 'softmax PVT (PVT-v1)'
    attention_context = ('qkv_layout', 'sr_ratio')
    qkv_layout = 'separate'
    official_key_pattern = 'block1.*'
    look_alikes = {'mmdet/mmseg PVT (not Pola; softmax attention only)': r'(^|\.)layers\.0\.0\.projection\.'}
    first_conv = 'patch_embed1.proj'

    def __init__(self, arch='tiny', pretrain_img_size=224, in_channels=3, out_indices=(0, 1, 2, 3),
                 attn_type=None, la_sr_ratios='1111', sr_ratios=(8, 4, 2, 1), qkv_bias=True, qk_scale=None,
                 drop_rate=0., attn_drop_rate=0., drop_path_rate=0.1, out_norm=None,
                 frozen_stages=-1, norm_eval=False, with_cp=False, recompute=None, attn=None, attn_impl='auto',
                 fp32_attn=True, init_cfg=None, **unexpected):
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=out_norm,
                         frozen_stages=frozen_stages, norm_eval=norm_eval,
                         with_cp=with_cp, recompute=recompute, attn=attn, attn_type=attn_type, attn_impl=attn_impl,
                         fp32_attn=fp32_attn, unexpected=unexpected, init_cfg=init_cfg)
        self.init_stages()
        self.la_sr_ratios, self.sr_ratios, self.pretrain_img_size, grids = pvt_stage_settings(
            self.num_stages, la_sr_ratios, sr_ratios, pretrain_img_size)
        self.pos_embed_grids = [(g, g) for g in grids]

        dpr = drop_path_rates(drop_path_rate, self.depths)
        for i in range(self.num_stages):
            dim = self.embed_dims[i]
            patch_embed = PatchEmbed(in_channels if i == 0 else self.embed_dims[i - 1], dim,
                                     patch_size=4 if i == 0 else 2, pad=False)
            pos_embed = nn.Parameter(torch.zeros(1, grids[i] * grids[i], dim))
            blocks = nn.ModuleList()
            for j in range(self.depths[i]):
                softmax = self.block_kinds[i][j] == self.softmax_attn
                attn = self.build_attention(i, j, dim, self.num_heads[i], pe_grid=self.pos_embed_grids[i],
                                            qkv_layout='separate',
                                            sr_ratio=self.sr_ratios[i] if softmax else self.la_sr_ratios[i],
                                            qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop_rate,
                                            proj_drop=drop_rate)
                blocks.append(PreNormBlock(dim, attn, self.mlp_ratios[i], drop=drop_rate, drop_path=dpr[i][j]))
            setattr(self, f'patch_embed{i + 1}', patch_embed)
            setattr(self, f'pos_embed{i + 1}', pos_embed)
            setattr(self, f'pos_drop{i + 1}', nn.Dropout(p=drop_rate))
            setattr(self, f'block{i + 1}', blocks)
            setattr(self, f'_pos_embed_cache{i + 1}', ResizedEmbeddingCache())
        for i in range(self.num_stages):
            trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=.02)
        self._finish_init()

    # ---------------------------------------------------------------------------------------------
    # DenseBackbone hooks

    def _stem(self, x):
        return x, None

    def _enter_stage(self, i, x, hw):
        if i > 0:  # the channels-last view: the patch embedding's conv returns a channels-last map, whose tokens
            x = tokens_as_map(x, hw)  # are a contiguous view for its norm (no copy either way, or in the backward)
        return getattr(self, f'patch_embed{i + 1}').embed_and_add(x, lambda hw: self._pos_embed(i, hw),
                                                                  getattr(self, f'pos_drop{i + 1}'))

    def _handoff_dtype(self, i, x):
        # the next stage's patch embedding is a convolution, which autocast runs in its dtype
        dtype = autocast_dtype(x.device.type)
        return dtype if dtype != x.dtype else None

    def _stage_blocks(self, i):
        return getattr(self, f'block{i + 1}')

    def _stem_parts(self):
        return [self.patch_embed1], [self.pos_embed1]

    def _stage_parts(self, i):
        return ([getattr(self, f'patch_embed{i + 1}'), getattr(self, f'block{i + 1}')],
                [getattr(self, f'pos_embed{i + 1}')])

    def _pos_embed(self, i, hw):
        cache = getattr(self, f'_pos_embed_cache{i + 1}')
        return cache.get(getattr(self, f'pos_embed{i + 1}'), self.pos_embed_grids[i], hw, 'bilinear',
                         enabled=not self.training)

    def stage_module(self, i):
        return f'block{i + 1}'

    # ---------------------------------------------------------------------------------------------
    # checkpoints

    def checkpoint_filter(self, state_dict, source='the checkpoint', map_final_norm=False):
        """The shared filter, and a file whose stages were trained with other ``la_sr_ratios``
        refused (its positional encodings and reductions would not fit)."""
        check_la_sr_ratios(self, state_dict, source)
        return super().checkpoint_filter(state_dict, source, map_final_norm)



@register_classification_head('pvt')
class PVTHead(ClassificationHead):
    """The official PVT classifier: the defaults (mean of the stage-4 tokens without a final norm, a
    linear ``head``)."""

    @classmethod
    def official_kwargs(cls, architecture, kwargs):
        """The official ``PyramidVisionTransformer`` arguments (``embed_dims`` ...)."""
        return pvt_classifier_kwargs(architecture, kwargs)


def pvt_stage_settings(num_stages, la_sr_ratios, sr_ratios, pretrain_img_size):
    """PVT's and PVTv2's per-stage attention settings, checked: ``(la_sr_ratios`` (the linear stages'
    key pooling, a list of ints from a string or a sequence), ``sr_ratios`` (the softmax stages'
    reduction), the square ``pretrain_img_size`` as (H, W), the stage grids of the positional encodings at
    that size``)``."""
    la_sr_ratios = [int(c) for c in check_stage_string(
        ''.join(str(int(r)) for r in la_sr_ratios) if not isinstance(la_sr_ratios, str) else la_sr_ratios,
        '123456789', num_stages, 'la_sr_ratios')]
    size = square_pretrain_size(pretrain_img_size)
    return la_sr_ratios, list(sr_ratios), size, pvt_pos_grids(size[0], num_stages)


def pvt_pos_grids(img_size, num_stages=4):
    """The official PVT / PVTv2 stage grids at pretraining: stage 1 img // 4, stage i > 1
    (img // 2 ** i) // 2 (56, 28, 14, 7 at 224)."""
    return [img_size // 4] + [(img_size // 2 ** (i + 1)) // 2 for i in range(1, num_stages)]


def pvt_classifier_kwargs(cls, kwargs):
    """The arguments of the official PVT / PVTv2 classes (``embed_dims`` ...) -> ``(classifier kwargs
    of architecture ``cls``, the rest, the official attn_type)``, or None."""
    if 'embed_dims' not in kwargs:
        return None
    kwargs = dict(kwargs)
    if kwargs.pop('patch_size', 4) != 4:
        raise ValueError('only patch_size=4 (every released model) is supported')
    out = dict(family=cls.family, num_classes=kwargs.pop('num_classes', 1000),
               drop_rate=kwargs.pop('drop_rate', 0.), drop_path_rate=kwargs.pop('drop_path_rate', 0.),
               pretrain_img_size=kwargs.pop('img_size', 224),
               arch={key: list(kwargs.pop(key)) for key in cls.arch_keys})
    for key in ('qkv_bias', 'qk_scale', 'attn_drop_rate', 'sr_ratios', 'la_sr_ratios'):
        if key in kwargs:
            out[key] = kwargs.pop(key)
    kwargs.pop('num_stages', None)
    kwargs.pop('in_chans', None)
    attn_type = kwargs.pop('attn_type', None)
    return out, kwargs, attn_type


def check_la_sr_ratios(model, state_dict, source):
    """Refuse a PVT / PVTv2 file whose linear stages were trained with other ``la_sr_ratios`` than
    ``model`` was built with (its positional encodings and reductions would not fit)."""
    stored = _stored_la_sr_ratios(state_dict, model.num_stages)
    built = ''.join(str(r) for r in model.la_sr_ratios)
    if stored is not None and 'S' not in model.attn_type and stored != built:
        raise CheckpointMismatchError(
            f"{source} was trained with la_sr_ratios='{stored}' but the {type(model).__name__} was "
            f"built with '{built}'; pass la_sr_ratios='{stored}'")


def _stored_la_sr_ratios(state_dict, num_stages=4):
    """'1111'-style string of the spatial reduction of a PVT checkpoint's attention with positional
    encodings (Pola, FLatten), or None when a stage has none."""
    ratios = []
    for i in range(1, num_stages + 1):
        sr = state_dict.get(f'block{i}.0.attn.sr.weight')
        if f'block{i}.0.attn.positional_encoding' not in state_dict:
            return None  # softmax or InLine stage, or not a PVT checkpoint
        ratios.append(str(sr.shape[-1]) if sr is not None else '1')
    return ''.join(ratios)
