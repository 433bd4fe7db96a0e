"""The plain ViT (DeiT) as a dense-prediction backbone with any registered attention kind that takes
prefix tokens: :class:`ViTBackbone` (registered as ``ViTBackbone``, family ``'vit'``; preset
``InLineDeiT`` in :mod:`.presets`).

The module tree is the official one (LeapLabTHU/InLine ``models/inline_deit.py``: timm 0.4.12's
``VisionTransformer`` with its attention replaced; DeiT's own with the softmax)::

    cls_token (1, 1, C), pos_embed (1, 1 + G*G, C)    G: the patch grid at pretraining
    patch_embed.proj                                  Conv2d(C_in, C, 16, stride 16)
    blocks.{j}.norm1 / .norm2                         LayerNorm eps 1e-6
    blocks.{j}.attn.*                                 the kind's module (``qkv_layout='fused'``: qkv / qkvg, proj ...)
    blocks.{j}.mlp.fc1 / .fc2
    norm                                              the final LayerNorm (classifier; dense ``final_norm``)

so official files load by filtering, and DeiT files (timm's ``deit_*``, softmax) are this
architecture with ``attn_type='S'``.

Dense prediction: every block is a stage (``num_stages`` = depth) whose output is the map of its
patch tokens at stride 16 (the class token stays in the sequence through every block, as in the
pretrained model, and is dropped from the outputs). The image is zero-padded right/bottom to a
multiple of the patch (mmseg's ViT ``padding='corner'``) and ``pos_embed`` follows the input grid:
the class token's entry as stored, the grid part resized bicubically (as mmseg's ViT and timm). The
attention gets ``num_prefix_tokens=1`` as call context: the class token takes part in the global
attention, the kind's grid terms (InLine's residual conv, FLatten / Pola's positional encoding and
``dwc``) act on the patch tokens only.
"""
import torch
import torch.nn as nn
from timm.layers import register_notrace_module, trunc_normal_

from ..checks import PolaConfigError
from ..classification_head import FinalNormHead, register_classification_head
from ..layers import PreNormBlock, pad_image, resize_grid_embedding, to_2tuple_int
from .base import DenseBackbone, drop_path_rates, register_architecture

__all__ = ['ViTBackbone', 'ViTHead', 'ViTPatchEmbed', 'resize_token_embedding']


def resize_token_embedding(embed, num_prefix_tokens, src_hw, dst_hw, mode='bicubic'):
    """A ViT position embedding (1, P + Hs*Ws, C) for another grid: the P prefix entries as they are,
    the grid part resized (:func:`mmpola.models.layers.resize_grid_embedding`)."""
    if tuple(src_hw) == tuple(dst_hw):
        return embed
    prefix, grid = embed[:, :num_prefix_tokens], embed[:, num_prefix_tokens:]
    return torch.cat([prefix, resize_grid_embedding(grid, src_hw, dst_hw, mode)], dim=1)


# torch.fx records calls with traced sizes as one graph node (the sizes are known only at run time)
torch.fx.wrap('resize_token_embedding')


@register_notrace_module  # torch.fx leaf: padding and (H, W) depend on the input size
class ViTPatchEmbed(nn.Module):
    """``proj`` Conv2d(k = s = patch) after zero-padding the image right/bottom to a multiple of the
    patch (mmseg's ViT ``padding='corner'``). (B, C_in, H, W) -> tokens (B, h*w, C), (h, w) =
    ceil((H, W) / patch)."""

    def __init__(self, in_chans, embed_dim, patch_size=16):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        x = self.proj(pad_image(x, self.patch_size))
        return x.flatten(2).transpose(1, 2), tuple(x.shape[-2:])


@register_architecture('vit', title='DeiT')
class ViTBackbone(DenseBackbone):
    """ViT / DeiT backbone with the attention of ``attn`` / ``attn_type``.

    Input (B, in_channels, H, W) with H, W >= 16 (any, odd and non-square included). Output: a tuple
    of NCHW maps (B, C, ceil(H / 16), ceil(W / 16)), one per ``out_indices`` block (the class token
    dropped); with ``final_norm`` the last block's map goes through the trained ``norm``. The
    pyramid necks of the ecosystem turn them into strides 4-32: mmseg's ``MultiLevelNeck`` for
    UperNet, mmpola's ``SimpleFeaturePyramid`` (ViTDet's simple feature pyramid) for detection.

    Args:
        arch: ``'tiny'``, ``'small'``, ``'base'`` (the InLine-DeiT sizes, see ``arch_settings``:
            widths 192 / 320 / 384, head dim 32, pretrained at 224 / 288 / 448) or a dict with
            ``embed_dims`` (int), ``depth``, ``num_heads``, ``img_size`` (the pretraining size).
        pretrain_img_size: the pretraining image size (sets the grid ``pos_embed`` and the attention's
            positional encodings are stored on). None: the arch's ``img_size``.
        patch_size: 16.
        in_channels: input image channels.
        out_indices: blocks (0-based) whose maps are returned. None: the last block of each quarter
            of the depth ((2, 5, 8, 11) at depth 12, as mmseg's ViT UperNet configs).
        final_norm: apply the trained ``norm`` to the last block's map (mmseg's ``final_norm``; off
            by default, as ViTDet and mmseg's DeiT configs).
        attn: the attention kind and its options (any kind that takes prefix tokens); see
            :class:`~mmpola.models.backbones.DenseBackbone`.
        attn_type: one letter for every block (the letter of ``attn`` or ``'S'``, DeiT's softmax) or one
            per block. None: the preset's (the kind in every block).
        mlp_ratio, qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path_rate: as in DeiT.
        frozen_stages: -1 none; 0 freezes the patch embedding, the class token and ``pos_embed``;
            k >= 1 also blocks 0..k-1.
        norm_eval, with_cp, recompute, attn_impl, fp32_attn, init_cfg: see
            :class:`~mmpola.models.backbones.DenseBackbone`.
        **unexpected: an error naming the attention options, which go in ``attn``.

    Attention context: ``pe_grid`` = the patch grid at pretraining, ``qkv_layout='fused'``; every call
    ``num_prefix_tokens=1``.
    """

    arch_settings = {
        'tiny': dict(embed_dims=192, depth=12, num_heads=6, img_size=224),
        'small': dict(embed_dims=320, depth=12, num_heads=10, img_size=288),
        'base': dict(embed_dims=384, depth=12, num_heads=12, img_size=448),
    }
    arch_keys = ('embed_dims', 'depth', 'num_heads', 'img_size')
    min_input_size = 16
    min_input_reason = 'one 16x16 patch'
    num_prefix_tokens = 1
    softmax_attn = 'softmax'
    softmax_name = 'DeiT (softmax ViT)'
    attention_context = ('qkv_layout',)
    official_key_pattern = 'blocks.0.attn.*'
    look_alikes = {'mmseg / mmpretrain ViT (not InLine; softmax attention only)': r'(^|\.)layers\.0\.ln1\.'}
    first_conv = 'patch_embed.proj'
    no_weight_decay_keys = ('pos_embed', 'cls_token')  # the official DeiT's no_weight_decay

    def __init__(self, arch='tiny', pretrain_img_size=None, patch_size=16, in_channels=3, out_indices=None,
                 final_norm=False, attn_type=None, mlp_ratio=4., qkv_bias=True, qk_scale=None, drop_rate=0.,
                 attn_drop_rate=0., drop_path_rate=0.1, frozen_stages=-1, norm_eval=False, with_cp=False,
                 recompute=None, attn=None, attn_impl='auto', fp32_attn=True, init_cfg=None, **unexpected):
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=False,
                         frozen_stages=frozen_stages, norm_eval=norm_eval, with_cp=with_cp, recompute=recompute,
                         attn=attn, attn_type=attn_type, attn_impl=attn_impl, fp32_attn=fp32_attn,
                         unexpected=unexpected, init_cfg=init_cfg)
        name = type(self).__name__
        settings = self.arch
        dim, heads = settings['embed_dims'], settings['num_heads']
        if not all(isinstance(settings[k], int) for k in self.arch_keys):
            raise PolaConfigError(f'{name}: arch {", ".join(self.arch_keys)} must be ints, got {settings!r}')
        self.embed_dims = [dim] * self.num_stages
        self.depths = [1] * self.num_stages
        self.resolve_block_kinds(self.depths)
        self.final_norm = final_norm
        self.patch_size = patch_size
        if pretrain_img_size is None:
            pretrain_img_size = settings['img_size']
        self.pretrain_img_size = to_2tuple_int(pretrain_img_size, 'pretrain_img_size')
        self.grid = tuple(s // patch_size for s in self.pretrain_img_size)

        self.patch_embed = ViTPatchEmbed(in_channels, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + self.grid[0] * self.grid[1], dim))
        self.pos_drop = nn.Dropout(p=drop_rate)
        dpr = drop_path_rates(drop_path_rate, [self.num_stages])[0]
        self.blocks = nn.ModuleList(
            PreNormBlock(dim, self.build_attention(j, 0, dim, heads, pe_grid=self.grid, qkv_layout='fused',
                                                   qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop_rate,
                                                   proj_drop=drop_rate),
                         mlp_ratio=mlp_ratio, drop=drop_rate, drop_path=dpr[j])
            for j in range(self.num_stages))
        if final_norm:
            self.norm = nn.LayerNorm(dim, eps=1e-6)
        trunc_normal_(self.pos_embed, std=.02)
        trunc_normal_(self.cls_token, std=.02)
        self._finish_init()

    @classmethod
    def stages_of(cls, arch):
        return arch['depth']

    def resolve_block_kinds(self, depths):
        """One letter (given or the preset's) stands for every block."""
        layout = self.attn_type or self.released_attn_type()
        if isinstance(layout, str) and len(layout) == 1:
            self.attn_type = layout * self.num_stages
        return super().resolve_block_kinds(depths)

    @classmethod
    def default_out_indices(cls, num_stages):
        """The last block of each quarter of the depth: (2, 5, 8, 11) at depth 12."""
        return tuple(sorted({max(num_stages * q // 4 - 1, 0) for q in range(1, 5)}))


    # ---------------------------------------------------------------------------------------------
    # DenseBackbone hooks: a stage per block

    def stage_stride(self, i):
        return self.patch_size

    def _stem(self, x):
        x, hw = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + resize_token_embedding(self.pos_embed, self.num_prefix_tokens, self.grid, hw)), hw

    def _enter_stage(self, i, x, hw):
        return x, hw

    def _stage_blocks(self, i):
        return [self.blocks[i]]

    def _block_context(self, i, x, hw):
        return dict(num_prefix_tokens=self.num_prefix_tokens)

    def output_norm(self, i):
        return self.norm if self.final_norm and i == self.num_stages - 1 else None

    def dense_only_modules(self):
        return []

    def stage_map(self, stage, norm=None):
        """A stage's (tokens, hw) -> the (B, C, h, w) map of its patch tokens (the class token dropped)."""
        tokens, hw = stage
        if norm is not None:
            tokens = norm(tokens)
        tokens = tokens[:, self.num_prefix_tokens:]
        return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, hw[0], hw[1]).contiguous()

    def _stem_parts(self):
        return [self.patch_embed, self.pos_drop], [self.cls_token, self.pos_embed]

    def _stage_parts(self, i):
        return [self.blocks[i]], []

    def stage_module(self, i):
        return f'blocks.{i}'


@register_classification_head('vit')
class ViTHead(FinalNormHead):
    """The official DeiT classifier: final LayerNorm ``norm``, the class token, linear ``head``."""

    backbone_kwargs = dict(final_norm=False)
    global_pools = ('token', 'avg', '')
    norm_eps = 1e-6

    @classmethod
    def features(cls, backbone, neck, stage):
        """The final tokens after the final norm as the one row of an NHWC map, (B, 1, 1 + h*w, C), class
        token first: timm's conventions give every entry but its own ViTs a map with two spatial axes, and
        the official pooling takes the class token, which a map of the patch grid would not hold."""
        tokens, _ = stage
        return neck.norm(tokens).unsqueeze(1)

    @classmethod
    def pool_size(cls, architecture, img_size, patch_size=16):
        """The (1, 1 + h*w) map of :meth:`features` at ``img_size``."""
        return 1, architecture.num_prefix_tokens + (img_size // patch_size) ** 2

    @classmethod
    def pool(cls, backbone, x, global_pool='token'):
        """(B, 1, 1 + h*w, C) -> ``'token'``: the class token (official); ``'avg'``: the mean of the patch tokens."""
        tokens = x[:, 0]
        if global_pool == 'avg':
            return tokens[:, backbone.num_prefix_tokens:].mean(dim=1)
        return tokens[:, 0]

    @classmethod
    def official_kwargs(cls, architecture, kwargs):
        """The official ``VisionTransformer`` arguments of InLine-DeiT (``embed_dim``, ``depth``, ``num_heads``,
        ``img_size`` ...)."""
        if not isinstance(kwargs.get('depth'), int) or 'embed_dim' not in kwargs:
            return None
        kwargs = dict(kwargs)
        for key, value in (('distilled', False), ('representation_size', None), ('hybrid_backbone', None)):
            if kwargs.pop(key, value) != value:
                raise ValueError(f'{key}={kwargs.get(key)!r} is not supported; no released model uses it')
        out = dict(family=architecture.family, num_classes=kwargs.pop('num_classes', 1000),
                   drop_rate=kwargs.pop('drop_rate', 0.), drop_path_rate=kwargs.pop('drop_path_rate', 0.),
                   arch=dict(embed_dims=kwargs.pop('embed_dim'), depth=kwargs.pop('depth'),
                             num_heads=kwargs.pop('num_heads'), img_size=kwargs.pop('img_size', 224)))
        for key in ('patch_size', 'qkv_bias', 'qk_scale', 'attn_drop_rate', 'mlp_ratio'):
            if key in kwargs:
                out[key] = kwargs.pop(key)
        for key in ('in_chans', 'norm_layer', 'act_layer', 'embed_layer', 'weight_init'):
            kwargs.pop(key, None)
        return out, kwargs, kwargs.pop('attn_type', None)
