"""The PolaFormer++ macro architecture as a dense-prediction backbone with any registered attention
kind: :class:`PolaPPBackbone` (registered as ``PolaPPBackbone``, family ``'polapp'``; preset
``PolaPP``, with PaCS attention, in :mod:`.presets`).

Convolutional stem, stages of blocks with a depthwise positional conv, LayerNorm2d, layer scale and
2-D RoPE tables handed to the attention, BatchNorm patch merging. The module tree is the official
one (``patch_embed.proj.{0..10}``, ``layers.{i}.blocks.{j}.attn.qkvg``, ``layers.{i}.RoPE_linear.angle``,
``layers.{i}.downsample.reduction`` ...; the dense output norms ``extra_norms.{i}``), so official
classification and dense checkpoints load by filtering keys. The official classifier: a 1x1
projection ``proj``, BatchNorm ``norm``, swish, average pool and a 1x1 conv ``head``.

Layout: every block works on NCHW maps (B, C, H, W), channels-last in memory (so that the LayerNorms, the
linear layers and the attention read the (B, H, W, C) rows or the (B, N, C) tokens as views, without a copy); the
attention gets the N = H * W tokens in row-major order. The stem, the patch merging and the maps the backbone
returns are contiguous NCHW.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import RotaryEmbedding
from ..checks import PolaConfigError
from ..classification_head import ClassificationHead, register_classification_head
from ..layers import DepthwiseConv2d, DropPath, add_branch, trunc_normal_init
from .base import DenseBackbone, drop_path_rates, register_architecture

__all__ = ['PolaPPBackbone', 'PolaPPHead', 'PolaPPBlock', 'LayerNorm2d', 'ConvStem', 'ConvDownsample',
           'PROJECTION']

# width of the classification projection of the released sizes
PROJECTION = {'b0': 2048, 'b1': 2048, 'b2': 2048, 'b3': 2048, 'b4': 2048, 'b5': 2560}


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of an NCHW map (eps 1e-6), parameters under ``norm.*``.

    The normalised map comes channels-last in memory (the (B, C, H, W) view of the LayerNorm's (B, H, W, C) rows),
    and a channels-last map is read as it is: the blocks' stream is channels-last (:class:`PolaPPBackbone`), so
    that neither the norm nor the token views of its output copy the map."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class FeedForwardNetwork(nn.Module):
    """fc1 -> GELU -> (3x3 depthwise conv + identity) -> fc2 on NCHW maps (the official ``ffn``)."""

    def __init__(self, dim, hidden_dim, drop=0.):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.dwconv = DepthwiseConv2d(hidden_dim, 3)  # runs on a channels-last view
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        x = self.drop(F.gelu(self.fc1(x.permute(0, 2, 3, 1)))).permute(0, 3, 1, 2)  # channels last for fc1
        x = self.dwconv(x, residual=x)  # dwconv(x) + x (in the Triton kernel, where it runs)
        return self.drop(self.fc2(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)


class PolaPPBlock(nn.Module):
    """x + pos(x), then x + DropPath(gamma_1 * Attn(LN(x))), x + DropPath(gamma_2 * FFN(LN(x))).

    ``attn``: any attention kind, called on the map's tokens with the stage's RoPE tables as
    context. ``layer_scale_init``: initial value of ``gamma_1`` / ``gamma_2``, None for no layer scale.
    Shapes: ``forward(x, hw, **context)``: (B, C, H, W) -> (B, C, H, W).
    """

    def __init__(self, dim, attn, mlp_ratio, drop_path=0., layer_scale_init=1.0, drop=0.):
        super().__init__()
        self.pos = DepthwiseConv2d(dim, 3)
        self.norm1 = LayerNorm2d(dim)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = LayerNorm2d(dim)
        self.ffn = FeedForwardNetwork(dim, int(mlp_ratio * dim), drop=drop)
        self.layer_scale = layer_scale_init is not None
        if self.layer_scale:
            self.gamma_1 = nn.Parameter(torch.full((1, dim, 1, 1), float(layer_scale_init)))
            self.gamma_2 = nn.Parameter(torch.full((1, dim, 1, 1), float(layer_scale_init)))

    def forward(self, x, hw, **context):
        x = self.pos(x, residual=x)  # x + pos(x) (in one Triton kernel, where it runs)
        y = self.norm1(x)
        attn = self.attn(y.flatten(2).transpose(1, 2), hw, **context).transpose(1, 2).reshape(y.shape)
        x = add_branch(x, attn, self.drop_path, self.gamma_1 if self.layer_scale else None)
        ffn = self.ffn(self.norm2(x))
        return add_branch(x, ffn, self.drop_path, self.gamma_2 if self.layer_scale else None)


class ConvDownsample(nn.Module):
    """3x3 stride-2 conv + BatchNorm (``reduction``, ``norm``): (B, C, H, W) -> (B, C', ceil(H/2), ceil(W/2))."""

    def __init__(self, dim, out_dim):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = nn.BatchNorm2d(out_dim)

    def forward(self, x):
        return self.norm(self.reduction(x))


class PolaPPStage(nn.Module):
    """Blocks of one stage (``blocks``), its RoPE angles (``RoPE`` of a head, ``RoPE_linear`` of the
    twice as wide PaCS feature maps) and the downsampling after it (``downsample``)."""

    def __init__(self, dim, out_dim, num_heads, blocks):
        super().__init__()
        self.RoPE = RotaryEmbedding(dim, num_heads)
        self.RoPE_linear = RotaryEmbedding(2 * dim, num_heads)
        self.blocks = nn.ModuleList(blocks)
        self.downsample = ConvDownsample(dim, out_dim) if out_dim is not None else None

    def rope_tables(self, hw):
        """The blocks' context for an H x W map: ``rope_head`` and ``rope_feature``, each (2, H*W, c)."""
        return dict(rope_head=self.RoPE(hw), rope_feature=self.RoPE_linear(hw))


class ConvStem(nn.Module):
    """The official stem ``patch_embed.proj``: four 3x3 convs (strides 2, 1, 1, 2) with BatchNorm,
    GELU between them; (B, C_in, H, W) -> (B, dim, ceil(ceil(H/2)/2), ...)."""

    def __init__(self, in_channels, dim):
        super().__init__()
        half = dim // 2
        self.proj = nn.Sequential(
            nn.Conv2d(in_channels, half, 3, 2, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, dim, 3, 2, 1), nn.BatchNorm2d(dim))

    def forward(self, x):
        return self.proj(x)


@register_architecture('polapp', title='PolaFormer++')
class PolaPPBackbone(DenseBackbone):
    """The PolaFormer++ architecture with the attention of ``attn`` / ``attn_type``.

    Input (B, in_channels, H, W), any H, W >= 32 (odd and non-square included): RoPE tables are
    built for the real map size of every stage. Output: a tuple of NCHW maps for ``out_indices``,
    channels ``embed_dims[i]``, sizes H_1 = ceil(ceil(H / 2) / 2), H_{i+1} = ceil(H_i / 2)
    (strides 4, 8, 16, 32): each stage's last block output before its patch merging, through the
    stage's dense output norm ``extra_norms.{i}`` (LayerNorm2d) when ``out_norm``, as the official
    dense backbone (which builds the norms of all four stages; here only the returned stages have one,
    so every parameter takes part in the loss, and official dense files load with the others reported
    as unexpected).

    Args:
        arch: ``'b0'`` ... ``'b5'`` (see ``arch_settings``) or a dict with ``embed_dims``, ``depths``,
            ``num_heads``, ``mlp_ratios``, ``layer_scale_init_values`` (four entries each; a None
            initial value builds the stage without layer scale).
        in_channels: input image channels.
        out_indices: stages (0-based) to return.
        attn: the attention kind and its options; see :class:`~mmpola.models.backbones.DenseBackbone`.
        attn_type: one char per stage, the letter of ``attn`` (PaCS: ``'L'``) or ``'S'`` softmax
            attention with RoPE (released: ``'LLSS'``).
        drop_rate: dropout inside the FFNs (the official models use 0).
        drop_path_rate: stochastic depth, linear over all blocks (official: b0-b2 0.1, b3 0.15,
            b4 0.4, b5 0.55 for ImageNet; the dense configs set theirs).
        out_norm: build and apply the dense output norms ``extra_norms.{i}`` of the returned stages
            (parameters of the official dense backbone only; the classifier builds it without them).
        frozen_stages: -1 none; 0 freezes the stem ``patch_embed``; k >= 1 also freezes stages
            1..k (``layers[i]`` with its patch merging, and ``extra_norms.{i}``). Frozen parts stay in
            eval mode and without gradients through ``train()``.
        norm_eval: keep every BatchNorm (stem, patch merging) in eval mode while training, freezing
            its running statistics. Off by default: the official dense code trains them (its
            ``norm_eval`` argument is ignored there).
        with_cp, recompute, attn_impl, fp32_attn: see :class:`~mmpola.models.backbones.DenseBackbone`
            (``attn_impl``: PaCS implementations; the softmax runs SDPA unless ``'reference'``).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL, prefix=None, use_ema=True)``
            loads official classification (``state_dict_ema`` when present and ``use_ema``) or
            dense files, mmengine checkpoints of our runs and bare state dicts through
            :func:`mmpola.checkpoint.load_checkpoint`; the classification projection, its
            BatchNorm and the head are dropped; other init configs go to mmengine.

    Attention context: ``pe_grid`` = the stage grid at 224, ``qkv_layout='fused'``; every call gets
    the RoPE tables ``rope_head`` and ``rope_feature`` of the map.

    Stages after ``max(out_indices)`` are built (checkpoints load unchanged) but not run.
    """

    arch_settings = {
        'b0': dict(embed_dims=[32, 64, 128, 384], depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 12],
                   mlp_ratios=[3.5] * 4, layer_scale_init_values=[1.0] * 4),
        'b1': dict(embed_dims=[32, 64, 192, 384], depths=[2, 2, 4, 2], num_heads=[1, 2, 6, 12],
                   mlp_ratios=[3.5] * 4, layer_scale_init_values=[1.0] * 4),
        'b2': dict(embed_dims=[64, 128, 256, 512], depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8],
                   mlp_ratios=[3.5] * 4, layer_scale_init_values=[1.0] * 4),
        'b3': dict(embed_dims=[64, 128, 320, 512], depths=[3, 5, 9, 3], num_heads=[1, 2, 5, 8],
                   mlp_ratios=[3.5] * 4, layer_scale_init_values=[1.0] * 4),
        'b4': dict(embed_dims=[96, 192, 384, 512], depths=[4, 6, 12, 6], num_heads=[1, 2, 6, 8],
                   mlp_ratios=[3.5] * 4, layer_scale_init_values=[1.0, 1.0, 1e-6, 1e-6]),
        'b5': dict(embed_dims=[96, 192, 448, 640], depths=[4, 7, 19, 8], num_heads=[1, 2, 7, 10],
                   mlp_ratios=[3.5] * 4, layer_scale_init_values=[1e-6] * 4),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'layer_scale_init_values')
    default_out_norm = True
    init_layers = (nn.Conv2d,)  # the official init: Conv2d trunc-normal, Linear layers keep PyTorch's
    softmax_attn = 'rope_softmax'
    attention_context = ('qkv_layout',)
    official_key_pattern = 'layers.0.blocks.0.norm1.norm.weight'
    first_conv = 'patch_embed.proj.0'

    def __init__(self, arch='b2', in_channels=3, out_indices=(0, 1, 2, 3), attn_type=None, drop_rate=0.,
                 drop_path_rate=0.1, out_norm=True, frozen_stages=-1, norm_eval=False, with_cp=False, recompute=None,
                 attn=None, attn_impl='auto', fp32_attn=True, init_cfg=None, **unexpected):
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=out_norm,
                         frozen_stages=frozen_stages, norm_eval=norm_eval, with_cp=with_cp, recompute=recompute,
                         attn=attn, attn_type=attn_type, attn_impl=attn_impl, fp32_attn=fp32_attn,
                         unexpected=unexpected, init_cfg=init_cfg)
        self.init_stages()

        self.patch_embed = ConvStem(in_channels, self.embed_dims[0])
        dpr = drop_path_rates(drop_path_rate, self.depths)
        self.layers = nn.ModuleList()
        for i, dim in enumerate(self.embed_dims):
            grid = 224 // 2 ** (i + 2)  # the stage map at the pretraining size
            blocks = [PolaPPBlock(dim, self.build_attention(i, j, dim, self.num_heads[i], pe_grid=(grid, grid),
                                                            qkv_layout='fused', proj_drop=drop_rate),
                                  self.mlp_ratios[i], drop_path=dpr[i][j],
                                  layer_scale_init=self.layer_scale_init_values[i], drop=drop_rate)
                      for j in range(self.depths[i])]
            out_dim = self.embed_dims[i + 1] if i < self.num_stages - 1 else None
            self.layers.append(PolaPPStage(dim, out_dim, self.num_heads[i], blocks))
        self._finish_init()

    def _add_output_norms(self):
        # keyed by stage index, so the names are the official 'extra_norms.{i}' whichever stages are
        # returned (a norm for a stage that is not returned would never get a gradient)
        self.extra_norms = nn.ModuleDict({str(i): LayerNorm2d(self.embed_dims[i]) for i in self.out_indices})

    def output_norm(self, i):
        return self.extra_norms[str(i)] if self.out_norm else None

    def dense_only_modules(self):
        return ['extra_norms'] if self.out_norm else []

    # ---------------------------------------------------------------------------------------------
    # DenseBackbone hooks: the stem gives an NCHW map, each stage downsamples the previous output
    # and hands its blocks the RoPE tables of the real map size

    def _stem(self, x):
        return self.patch_embed(x), None

    def _enter_stage(self, i, x, hw):
        # the blocks' stream channels-last in memory: their LayerNorms, linear layers, depthwise convolutions and
        # attention take the channels innermost, as views of it; the stem and the patch merging convolve
        # contiguous maps (so that their weights' gradients keep the weights' strides)
        if i > 0:
            x = self.layers[i - 1].downsample(x.contiguous())
        return x.contiguous(memory_format=torch.channels_last), x.shape[-2:]

    def _block_context(self, i, x, hw):
        return self.layers[i].rope_tables(hw)

    def _stage_blocks(self, i):
        return self.layers[i].blocks

    def _stage_output(self, x, hw):
        return x

    def stage_map(self, stage, norm=None):
        return (stage if norm is None else norm(stage)).contiguous()

    def _stem_parts(self):
        return [self.patch_embed], []

    def _stage_parts(self, i):
        modules = [self.layers[i]]
        if self.out_norm and str(i) in self.extra_norms:
            modules.append(self.extra_norms[str(i)])
        return modules, []

    def stage_module(self, i):
        return f'layers.{i}.blocks'


@register_classification_head('polapp')
class PolaPPHead(ClassificationHead):
    """The official PolaFormer++ classifier: 1x1 projection ``proj`` (``projection`` channels),
    BatchNorm ``norm``, swish, average pool, 1x1 conv ``head``."""

    backbone_kwargs = dict(out_norm=False)
    modules = ('proj', 'norm', 'head')
    args = ('projection',)

    @classmethod
    def neck(cls, backbone, projection=None):
        """``projection``: channels of the 1x1 projection (default: the released value of the preset,
        ``PROJECTION``; required for a custom arch)."""
        if projection is None:
            if backbone.arch_name not in PROJECTION:
                raise PolaConfigError('a custom PolaFormer++ arch needs projection= (channels of the classification '
                                      f'projection; released sizes use {sorted(set(PROJECTION.values()))})')
            projection = PROJECTION[backbone.arch_name]
        proj = nn.Conv2d(backbone.embed_dims[-1], projection, 1)
        trunc_normal_init(proj, backbone.init_layers)
        return {'proj': proj, 'norm': nn.BatchNorm2d(projection)}, projection

    @classmethod
    def features(cls, backbone, neck, stage):
        return F.silu(neck.norm(neck.proj(stage.contiguous()))).permute(0, 2, 3, 1)

    @classmethod
    def pool(cls, backbone, x, global_pool='avg'):
        return x.mean(dim=(1, 2))  # the official average pool of the (B, P, h, w) map

    @classmethod
    def build_head(cls, backbone, num_features, num_classes):
        """The official head: a 1x1 convolution of the pooled (B, P, 1, 1) map."""
        if num_classes <= 0:
            return nn.Identity()
        head = nn.Conv2d(num_features, num_classes, 1)
        trunc_normal_init(head, backbone.init_layers)
        return head

    @classmethod
    def logits(cls, head, x, pooled):
        if pooled:
            return head(x[:, :, None, None]).flatten(1)
        return head(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)

    @classmethod
    def official_kwargs(cls, architecture, kwargs):
        """The official ``POLA`` arguments (``embed_dims``, ``depths``, ``num_heads``, ``mlp_ratios``,
        ``drop_path_rate``, ``projection``, ``layerscales``, ``layer_init_values``, ``num_classes``,
        ``flagss``)."""
        if not {'projection', 'layerscales', 'layer_init_values', 'flagss'} & set(kwargs):
            return None
        kwargs = dict(kwargs)
        layerscales = kwargs.pop('layerscales', [False] * 4)
        init_values = kwargs.pop('layer_init_values', [1e-6] * 4)
        arch = dict(embed_dims=list(kwargs.pop('embed_dims')), depths=list(kwargs.pop('depths')),
                    num_heads=list(kwargs.pop('num_heads')), mlp_ratios=list(kwargs.pop('mlp_ratios')),
                    layer_scale_init_values=[v if on else None for on, v in zip(layerscales, init_values)])
        out = dict(family=architecture.family, arch=arch, num_classes=kwargs.pop('num_classes', 1000),
                   projection=kwargs.pop('projection', 1024), drop_path_rate=kwargs.pop('drop_path_rate', 0.1))
        if 'in_chans' in kwargs:
            out['in_channels'] = kwargs.pop('in_chans')
        attn_type = None
        if 'flagss' in kwargs:
            flags = kwargs.pop('flagss')
            kinds = [set(f[:d]) for f, d in zip(flags, arch['depths'])]
            if any(len(k) != 1 for k in kinds):
                raise ValueError('per-block attention flags that differ within a stage are not supported')
            attn_type = ''.join('L' if k == {'l'} else 'S' for k in kinds)
        return out, kwargs, attn_type
