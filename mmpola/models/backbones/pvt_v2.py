"""PVTv2 as a dense-prediction backbone with any registered attention kind: :class:`PVTv2Backbone`
(registered as ``PVTv2Backbone``, family ``'pvt_v2'``; preset ``FLattenPVTv2`` in :mod:`.presets`).

PVTv2 is PVT-v1 with overlapping patch embeddings (7x7 stride 4, then 3x3 stride 2, zero-padded:
sizes ceil), a 3x3 depthwise convolution inside the MLP, no absolute position embedding, and a
trained LayerNorm after every stage (``norm{i}``, 1-based) whose output feeds the next stage. The
module tree is the official one (whai362/PVT ``pvt_v2.py``; FLatten-PVTv2 changes only
``block{i}.{j}.attn``)::

    patch_embed{i}.proj / .norm     overlapping patch embedding (LayerNorm eps 1e-5)
    block{i}.{j}.norm1 / .norm2     LayerNorm eps 1e-6
    block{i}.{j}.attn.*             the PVT-layout module of the kind (q / qg, kv, sr, norm, proj ...)
    block{i}.{j}.mlp.fc1 / .dwconv.dwconv / .fc2
    norm{i}                         the stage norms (eps 1e-6)

so official files load by filtering (the classification ``head`` dropped), and plain PVTv2 files
(whai362) are this architecture with ``attn_type='SSSS'``. The attention modules are the PVT ones
(``qkv_layout='separate'``, spatial reduction ``sr_ratio``). The official classifier: the mean of
the stage-4 tokens after ``norm4``, then a linear ``head``.
"""
import math

import torch.nn as nn
from timm.layers import register_notrace_module

from ..checks import PolaConfigError
from ..classification_head import ClassificationHead, register_classification_head
from ..layers import (
    DepthwiseConv2d,
    PreNormBlock,
    gelu_fc2,
    map_as_tokens,
    norm_linear,
    tokens_as_map,
    trunc_normal_init,
)
from .base import DenseBackbone, drop_path_rates, register_architecture, tokens_to_nchw
from .pvt import check_la_sr_ratios, pvt_classifier_kwargs, pvt_stage_settings

__all__ = ['PVTv2Backbone', 'PVTv2Head', 'OverlapPatchEmbed', 'ConvMlp']


@register_notrace_module  # torch.fx leaf: (H, W) depend on the input size
class OverlapPatchEmbed(nn.Module):
    """Conv2d(kernel k, stride s, padding k // 2) -> flatten -> LayerNorm (eps 1e-5, as the official
    module builds it).

    Shapes: (B, C_in, H, W) -> tokens (B, H'*W', C), (H', W') with H' = floor((H - 1) / s) + 1 (ceil(H / s)).
    """

    def __init__(self, in_chans, embed_dim, patch_size, stride):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x):
        x = self.proj(x)
        hw = tuple(x.shape[-2:])
        return self.norm(x.flatten(2).transpose(1, 2)), hw


class DWConv(nn.Module):
    """The MLP's 3x3 depthwise conv on the token map (``dwconv.dwconv``, the official nesting). It runs on
    the tokens' channels-last view and returns contiguous tokens: no copy on either side, so the GELU and
    ``fc2`` after it (and their backward) see contiguous tensors."""

    def __init__(self, dim):
        super().__init__()
        self.dwconv = DepthwiseConv2d(dim, 3)

    def forward(self, x, hw):
        return map_as_tokens(self.dwconv(tokens_as_map(x, hw)))


class ConvMlp(nn.Module):
    """fc1 -> dwconv (3x3 depthwise) -> GELU -> Dropout -> fc2 -> Dropout on (B, H*W, C) tokens (GELU to fc2:
    :func:`~mmpola.models.layers.gelu_fc2`); ``norm``, ``branch``, ``drop_path``: as
    :class:`~mmpola.models.layers.Mlp`'s."""

    takes_hw = True  # forward(x, hw): PreNormBlock passes the map size
    takes_branch = True

    def __init__(self, dim, hidden, drop=0.):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConv(hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x, hw, norm=None, branch=None, drop_path=None):
        h = norm_linear(norm, self.fc1, x, branch=branch, drop_path=drop_path)
        if branch is not None:
            x, h = h
        out = self.drop(gelu_fc2(self, self.dwconv(h, hw)))
        return out if branch is None else (x, out)


@register_architecture('pvt_v2', title='PVTv2')
class PVTv2Backbone(DenseBackbone):
    """PVTv2 backbone with the attention of ``attn`` / ``attn_type``.

    Input (B, in_channels, H, W) with H, W >= 32 (any, odd and non-square included). Output: a tuple
    of NCHW maps for ``out_indices``, channels ``embed_dims[i]``, sizes H_1 = ceil(H / 4),
    H_{i+1} = ceil(H_i / 2) (strides 4, 8, 16, 32): each stage's output after its trained stage norm
    ``norm{i+1}``, which is also what the next stage receives (as the official classifier and the
    official dense backbone). There are no other output norms (``out_norm`` is refused).

    Args:
        arch: ``'b0'`` ... ``'b5'`` (see ``arch_settings``; b5 exists in the FLatten code only) or a
            dict with ``embed_dims``, ``num_heads``, ``mlp_ratios``, ``depths`` (four entries each).
        pretrain_img_size: the pretraining image size (sets the stored grid of the attention's
            positional encodings: 224 -> 56, 28, 14, 7).
        in_channels: input image channels.
        out_indices: stages (0-based) to return.
        attn: the attention kind and its options; see :class:`~mmpola.models.backbones.DenseBackbone`.
        attn_type: one char per stage: the letter of ``attn`` or ``'S'`` (PVTv2's spatial-reduction
            softmax) or ``'M'`` mixed. None: the preset's.
        la_sr_ratios: spatial reduction of the non-softmax blocks per stage (released: ``'1111'``).
        sr_ratios: spatial reduction of the softmax blocks per stage (PVTv2's 8, 4, 2, 1).
        qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path_rate: as in PVTv2.
        frozen_stages: -1 none; 0 freezes ``patch_embed1``; k >= 1 also stages 1..k (their patch
            embedding, blocks and stage norm).
        norm_eval, with_cp, recompute, attn_impl, fp32_attn, init_cfg: see
            :class:`~mmpola.models.backbones.DenseBackbone`.
        **unexpected: an error naming the attention options, which go in ``attn``.

    Attention context: ``pe_grid`` = the stage grid at pretraining, ``qkv_layout='separate'``,
    ``sr_ratio``.

    Stages after ``max(out_indices)`` are built (so checkpoints load unchanged) but not run.
    """

    arch_settings = {
        'b0': dict(embed_dims=[32, 64, 160, 256], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                   depths=[2, 2, 2, 2]),
        'b1': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                   depths=[2, 2, 2, 2]),
        'b2': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                   depths=[3, 4, 6, 3]),
        'b3': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                   depths=[3, 4, 18, 3]),
        'b4': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                   depths=[3, 8, 27, 3]),
        'b5': dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[4, 4, 4, 4],
                   depths=[3, 6, 40, 3]),
    }
    arch_keys = ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')
    softmax_attn = 'softmax'
    softmax_name = 'softmax PVTv2 (whai362/PVT)'
    attention_context = ('qkv_layout', 'sr_ratio')
    qkv_layout = 'separate'
    official_key_pattern = 'block1.0.mlp.dwconv.dwconv.*'
    first_conv = 'patch_embed1.proj'

    def __init__(self, arch='b0', pretrain_img_size=224, in_channels=3, out_indices=(0, 1, 2, 3), attn_type=None,
                 la_sr_ratios='1111', sr_ratios=(8, 4, 2, 1), qkv_bias=True, qk_scale=None, drop_rate=0.,
                 attn_drop_rate=0., drop_path_rate=0.1, out_norm=None, frozen_stages=-1, norm_eval=False,
                 with_cp=False, recompute=None, attn=None, attn_impl='auto', fp32_attn=True, init_cfg=None,
                 **unexpected):
        if out_norm:
            raise PolaConfigError(f'{type(self).__name__}: out_norm=True is not available: every PVTv2 stage output '
                                  'already goes through its trained stage norm norm1..norm4 (the official outputs)')
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=False,
                         frozen_stages=frozen_stages, norm_eval=norm_eval, with_cp=with_cp, recompute=recompute,
                         attn=attn, attn_type=attn_type, attn_impl=attn_impl, fp32_attn=fp32_attn,
                         unexpected=unexpected, init_cfg=init_cfg)
        self.init_stages()
        self.la_sr_ratios, self.sr_ratios, self.pretrain_img_size, grids = pvt_stage_settings(
            self.num_stages, la_sr_ratios, sr_ratios, pretrain_img_size)

        dpr = drop_path_rates(drop_path_rate, self.depths)
        for i in range(self.num_stages):
            dim = self.embed_dims[i]
            patch_embed = OverlapPatchEmbed(in_channels if i == 0 else self.embed_dims[i - 1], dim,
                                            patch_size=7 if i == 0 else 3, stride=4 if i == 0 else 2)
            blocks = nn.ModuleList()
            for j in range(self.depths[i]):
                softmax = self.block_kinds[i][j] == self.softmax_attn
                attn = self.build_attention(i, j, dim, self.num_heads[i], pe_grid=(grids[i], grids[i]),
                                            qkv_layout='separate',
                                            sr_ratio=self.sr_ratios[i] if softmax else self.la_sr_ratios[i],
                                            qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop_rate,
                                            proj_drop=drop_rate)
                blocks.append(PreNormBlock(dim, attn, self.mlp_ratios[i], drop=drop_rate, drop_path=dpr[i][j],
                                          mlp_layer=ConvMlp))
            setattr(self, f'patch_embed{i + 1}', patch_embed)
            setattr(self, f'block{i + 1}', blocks)
            setattr(self, f'norm{i + 1}', nn.LayerNorm(dim, eps=1e-6))
        self._finish_init()

    def init_module(self, module):
        """The official PVTv2 init: Linear and LayerNorm as every release, Conv2d weights
        normal(0, sqrt(2 / fan_out)) with fan_out = k * k * out_channels / groups, zero biases."""
        trunc_normal_init(module)
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels // module.groups
            module.weight.data.normal_(0, math.sqrt(2.0 / fan_out))
            if module.bias is not None:
                module.bias.data.zero_()

    # ---------------------------------------------------------------------------------------------
    # DenseBackbone hooks

    def _stem(self, x):
        return x, None

    def _enter_stage(self, i, x, hw):
        if i > 0:  # the channels-last view: the patch embedding's conv returns a channels-last map, whose tokens
            x = tokens_as_map(x, hw)  # are a contiguous view for its norm (no copy either way, or in the backward)
        return getattr(self, f'patch_embed{i + 1}')(x)

    def _stage_blocks(self, i):
        return getattr(self, f'block{i + 1}')

    def _exit_stage(self, i, x, hw):
        return getattr(self, f'norm{i + 1}')(x)

    def stage_map(self, stage, norm=None):
        """The stage norm's tokens as a contiguous map (no output norm exists). Its gradient goes back to that
        norm, which reads the channel-strided view as it is: no copy to contiguous tokens first."""
        tokens, hw = stage
        return tokens_to_nchw(tokens, hw)

    def _stem_parts(self):
        return [self.patch_embed1], []

    def _stage_parts(self, i):
        return [getattr(self, f'{name}{i + 1}') for name in ('patch_embed', 'block', 'norm')], []

    def stage_module(self, i):
        return f'norm{i + 1}'  # the stage output is the stage norm's

    # ---------------------------------------------------------------------------------------------
    # checkpoints

    def checkpoint_filter(self, state_dict, source='the checkpoint', map_final_norm=False):
        """The shared filter, and a file whose stages were trained with other ``la_sr_ratios`` refused."""
        check_la_sr_ratios(self, state_dict, source)
        return super().checkpoint_filter(state_dict, source, map_final_norm)


@register_classification_head('pvt_v2')
class PVTv2Head(ClassificationHead):
    """The official PVTv2 classifier: mean of the stage-4 tokens (after its stage norm ``norm4``), a
    linear ``head`` (the defaults)."""

    @classmethod
    def official_kwargs(cls, architecture, kwargs):
        """The official ``PyramidVisionTransformerV2`` arguments (``embed_dims`` ...: those of PVT's
        class, so an official PVTv2 model is named by ``family='pvt_v2'``)."""
        return pvt_classifier_kwargs(architecture, kwargs)
