"""The PVT family: PVT-v1 macro architecture with a linear attention of the lineage, as a
dense-prediction backbone (:class:`PVTBackbone`), and its registered members (:class:`PolaPVT`).

The module tree is the official one (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}.{j}.attn.*``
...), so official ImageNet checkpoints load by filtering keys (``mmpola.checkpoint``). What every
dense backbone shares (arguments, stage loop, freezing, loading) lives in
:class:`mmpola.models.base.DenseBackbone`.
"""
import torch
import torch.nn as nn
from mmengine.registry import MODELS
from timm.layers import trunc_normal_

from .attention_kinds import build_attention
from .base import DenseBackbone, drop_path_rates, tokens_to_nchw
from .layers import DropPath, Mlp, PatchEmbed, _ResizedEmbeddingCache, to_2tuple_int
from .utils import PolaConfigError, check_stage_string

__all__ = ['PVTBackbone', 'PVTBlock', 'PolaPVT', 'FLattenPVT', 'InLinePVT']


class PVTBlock(nn.Module):
    """Pre-norm PVT block: x + DropPath(Attn(LN(x))), then x + DropPath(MLP(LN(x))); LN eps 1e-6.

    ``attn`` is any module of :mod:`mmpola.models.attention_kinds` (``attn(x, hw)``).
    Shapes: ``forward(x, hw)``: (B, H*W, C), (H, W) -> (B, H*W, C).
    """

    def __init__(self, dim, attn, mlp_ratio, drop=0., drop_path=0.):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x, hw):
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PVTBackbone(DenseBackbone):
    """PVT-family backbone; a registered member sets ``attn_kind`` (its linear attention).

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
        attn_type: one char per stage: the letter of ``attn_kind`` (``'L'`` Pola / FLatten,
            ``'I'`` InLine) or ``'S'`` softmax. None: the released string (``default_attn_type``).
        la_sr_ratios: spatial reduction of the linear-attention blocks per stage, as a 4-digit
            string or a sequence (released: ``'1111'``; the official class default '8421' was
            *not* used).
        sr_ratios: spatial reduction of softmax ('S') blocks per stage.
        qkv_bias, qk_scale: projections' bias; softmax scale override ('S' blocks only).
        drop_rate, attn_drop_rate, drop_path_rate: dropout after projections and embeddings,
            attention dropout ('S' only), stochastic depth (linear over all blocks).
        out_norm: add a LayerNorm (eps 1e-6) ``norm{i}`` to every returned stage (new,
            dense-only parameters; off like mmdet's PVTv1). ``norm_after_stage``: its deprecated
            alias.
        frozen_stages: -1 none; 0 freezes ``patch_embed1`` and ``pos_embed1``; k >= 1 freezes
            stages 1..k entirely (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}`` and its
            ``norm{i-1}``).
        norm_eval, with_cp, pretrained, init_cfg: see :class:`DenseBackbone`.
        attn_impl, fp32_attn: passed to every linear attention (``'reference'`` forces the
            official op order; ``fp32_attn`` keeps the core in fp32 under autocast).
        **attn_options: the options of ``attn_kind`` (``ATTENTION_KINDS[kind].options``), e.g.
            Pola ``alpha=4.0, kernel_size=5, v_upsample='linear1d'``.

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
    default_out_norm = False
    default_attn_type = None  # set by the members ('LLLL' ...)
    official_key_pattern = 'block1.*'

    def __init__(self, arch='tiny', pretrain_img_size=224, in_channels=3, out_indices=(0, 1, 2, 3),
                 attn_type=None, la_sr_ratios='1111', sr_ratios=(8, 4, 2, 1), qkv_bias=True, qk_scale=None,
                 drop_rate=0., attn_drop_rate=0., drop_path_rate=0.1, out_norm=None, norm_after_stage=None,
                 frozen_stages=-1, norm_eval=False, with_cp=False, attn_impl='auto', fp32_attn=True,
                 pretrained=None, init_cfg=None, **attn_options):
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=out_norm,
                         norm_after_stage=norm_after_stage, frozen_stages=frozen_stages, norm_eval=norm_eval,
                         with_cp=with_cp, pretrained=pretrained, init_cfg=init_cfg)
        settings = self.arch
        self.embed_dims = list(settings['embed_dims'])
        self.depths = list(settings['depths'])
        self.num_heads = list(settings['num_heads'])
        self.mlp_ratios = list(settings['mlp_ratios'])
        for key in self.arch_keys:
            if len(settings[key]) != self.num_stages:
                raise PolaConfigError(f'arch {key} must have {self.num_stages} entries, got {settings[key]!r}')
        self.check_attn_options(attn_options)
        letters = self.attention_letters()
        attn_type = self.default_attn_type if attn_type is None else attn_type
        self.attn_type = check_stage_string(attn_type, ''.join(letters), self.num_stages, 'attn_type')
        self.la_sr_ratios = [int(c) for c in check_stage_string(
            ''.join(str(int(r)) for r in la_sr_ratios) if not isinstance(la_sr_ratios, str)
            else la_sr_ratios, '123456789', self.num_stages, 'la_sr_ratios')]
        self.sr_ratios = list(sr_ratios)
        self.pretrain_img_size = to_2tuple_int(pretrain_img_size, 'pretrain_img_size')
        if self.pretrain_img_size[0] != self.pretrain_img_size[1]:
            raise PolaConfigError('pretrain_img_size must be square (official models are), got '
                                  f'{self.pretrain_img_size}')

        # official grids: stage 1 img // 4, stage i > 1 (img // 2 ** i) // 2
        img = self.pretrain_img_size[0]
        grids = [img // 4] + [(img // 2 ** (i + 1)) // 2 for i in range(1, self.num_stages)]
        self.pos_embed_grids = [(g, g) for g in grids]

        dpr = drop_path_rates(drop_path_rate, self.depths)
        for i in range(self.num_stages):
            dim = self.embed_dims[i]
            patch_embed = PatchEmbed(in_channels if i == 0 else self.embed_dims[i - 1], dim,
                                     patch_size=4 if i == 0 else 2, pad=False)
            pos_embed = nn.Parameter(torch.zeros(1, grids[i] * grids[i], dim))
            kind = letters[self.attn_type[i]]
            sr = self.sr_ratios[i] if kind == 'softmax' else self.la_sr_ratios[i]
            pe_side = grids[i] // sr
            options = {} if kind == 'softmax' else attn_options
            blocks = nn.ModuleList([
                PVTBlock(dim, build_attention(kind, 'pvt', dim, self.num_heads[i], pe_grid=(pe_side, pe_side),
                                              sr_ratio=sr, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                              attn_drop=attn_drop_rate, proj_drop=drop_rate,
                                              attn_impl=attn_impl, fp32_attn=fp32_attn, **options),
                         self.mlp_ratios[i], drop=drop_rate, drop_path=dpr[i][j])
                for j in range(self.depths[i])])
            setattr(self, f'patch_embed{i + 1}', patch_embed)
            setattr(self, f'pos_embed{i + 1}', pos_embed)
            setattr(self, f'pos_drop{i + 1}', nn.Dropout(p=drop_rate))
            setattr(self, f'block{i + 1}', blocks)
            setattr(self, f'_pos_embed_cache{i + 1}', _ResizedEmbeddingCache())
        for i in range(self.num_stages):
            trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=.02)
        self._finish_init()

    # ---------------------------------------------------------------------------------------------
    # DenseBackbone hooks

    def _stem(self, x):
        return x, None

    def _enter_stage(self, i, x, hw):
        if i > 0:
            x = tokens_to_nchw(x, hw)
        x, hw = getattr(self, f'patch_embed{i + 1}')(x)
        return getattr(self, f'pos_drop{i + 1}')(x + self._pos_embed(i, hw)), hw

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


@MODELS.register_module()
class PolaPVT(PVTBackbone):
    """Pola-PVT backbone (PolaFormer, ICLR 2025) for mmdet / mmseg: :class:`PVTBackbone` with
    polarity-aware linear attention (:class:`~mmpola.models.layers.PolaAttention`).

    Registered in mmengine's root ``MODELS`` registry, so ``dict(type='PolaPVT', ...)`` builds
    from mmdet's, mmseg's and any other OpenMMLab library's registry.

    Pola options: ``alpha=4.0`` (p in (1, 1 + alpha)), ``kernel_size=5`` (depthwise conv on v),
    ``v_upsample='linear1d'`` (how v reaches the query grid when ``la_sr_ratios`` > 1: official
    ``'linear1d'`` or the geometric ``'bilinear2d'``). ``attn_type``: ``'L'`` Pola, ``'S'`` softmax
    per stage (released ``'LLLL'``).
    """
    attn_kind = 'pola'
    default_attn_type = 'LLLL'
    official_name = 'Pola-PVT'


@MODELS.register_module()
class FLattenPVT(PVTBackbone):
    """FLatten-PVT backbone (FLatten Transformer, ICCV 2023) for mmdet / mmseg: :class:`PVTBackbone`
    with focused linear attention (:class:`~mmpola.models.layers.FocusedLinearAttention`).

    FLatten options: ``focusing_factor=3``, ``kernel_size=5``, ``v_upsample='linear1d'`` (see
    :class:`PolaPVT`). ``attn_type``: ``'L'`` focused linear, ``'S'`` softmax per stage (released
    ``'LLLL'``).
    """
    attn_kind = 'flatten'
    default_attn_type = 'LLLL'
    official_name = 'FLatten-PVT'


@MODELS.register_module()
class InLinePVT(PVTBackbone):
    """InLine-PVT backbone (InLine attention, NeurIPS 2024) for mmdet / mmseg: :class:`PVTBackbone`
    with injective linear attention (:class:`~mmpola.models.layers.InLineAttention`; no positional
    encoding inside the attention, no spatial reduction: ``la_sr_ratios`` must stay ``'1111'``).

    The released models use twice the heads of PVT (``arch_settings``). ``attn_type``: ``'I'``
    InLine, ``'S'`` softmax per stage (released ``'IIII'``). No attention options.
    """
    arch_settings = {
        name: dict(settings, num_heads=[2, 4, 10, 16]) for name, settings in PVTBackbone.arch_settings.items()}
    attn_kind = 'inline'
    default_attn_type = 'IIII'
    official_name = 'InLine-PVT'
