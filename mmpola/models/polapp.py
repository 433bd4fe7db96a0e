"""PolaFormer++ (PolaPP): convolutional stem, stages of blocks with a depthwise positional conv,
LayerNorm2d, layer scale and 2-D RoPE, BatchNorm patch merging; PaCS linear attention in the
first stages and softmax attention in the last ones.

The module tree is the official one (``patch_embed.proj.{0..10}``, ``layers.{i}.blocks.{j}.attn.qkvg``,
``layers.{i}.RoPE_linear.angle``, ``layers.{i}.downsample.reduction`` ...; the dense output norms
``extra_norms.{i}``), so official classification and dense checkpoints load by filtering keys.

Layout: every block works on NCHW maps (B, C, H, W); attention flattens them to N = H * W tokens
in row-major order.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from timm.layers import DropPath, register_notrace_module, trunc_normal_

from mmpola.ops import pacs_attention, rope_angles, rope_rotate, rope_tables
from mmpola.ops.dispatch import check_attn_impl

from .attention_kinds import AttentionKind, build_attention, register_attention_kind
from .base import DenseBackbone, drop_path_rates
from .timm_conventions import TimmClassifierMixin, check_global_pool
from .utils import PolaConfigError, check_stage_string, is_pretrained_cfg

__all__ = ['PolaPP', 'PolaPPClassifier', 'PolaPPBlock', 'PaCSAttention', 'RoPESoftmaxAttention', 'LayerNorm2d']

_STRUCTURE_KEYS = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'layer_scale_init_values')


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of an NCHW map (eps 1e-6), parameters under ``norm.*``."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1).contiguous()).permute(0, 3, 1, 2).contiguous()


@register_notrace_module  # torch.fx leaf: the tables depend on the run-time map size
class RotaryEmbedding(nn.Module):
    """The official 2-D RoPE angles (buffer ``angle``, kept in checkpoints) -> tables of a grid.

    ``dim`` is the width the rotation acts on summed over heads: C for softmax attention, 2C for the
    PaCS feature maps (which are twice as wide as a head).
    """

    def __init__(self, dim, num_heads, base=10000.0):
        super().__init__()
        self.register_buffer('angle', rope_angles(dim, num_heads, base))

    def forward(self, hw):
        """(H, W) -> (2, H * W, 2 * len(angle)): sin and cos stacked (one tensor, so a traced graph can
        index it)."""
        return torch.stack(rope_tables(self.angle, hw))


@register_notrace_module  # torch.fx leaf: custom autograd Function, run-time shapes
class PaCSAttention(nn.Module):
    """Polarity-aware linear attention with channel-wise spikiness (the official linear block).

    ``qkvg`` projects to queries, keys, values and a gate; ``lepe`` is a 5x5 depthwise conv on the
    values; ``s1`` / ``s2`` are the per-channel spikiness logits of the same-sign and opposite-sign
    flows. ``forward(x, sin, cos)``: x (B, C, H, W), tables (H*W, 2*head_dim) -> (B, C, H, W).
    """

    def __init__(self, dim, num_heads, attn_impl='auto', fp32_attn=True):
        super().__init__()
        if dim % num_heads or (dim // num_heads) % 2:
            raise ValueError(f'PaCSAttention needs an even head dim: channels {dim} / heads {num_heads}')
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkvg = nn.Linear(dim, dim * 4)
        self.lepe = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj = nn.Linear(dim, dim)
        self.s1 = nn.Parameter(torch.zeros(1, num_heads, 1, 2 * self.head_dim))
        self.s2 = nn.Parameter(torch.zeros(1, num_heads, 1, 2 * self.head_dim))
        self.attn_impl = check_attn_impl(attn_impl)
        self.fp32_attn = fp32_attn

    def forward(self, x, sin, cos):
        B, C, H, W = x.shape
        N = H * W
        q, k, v, g = self.qkvg(x.reshape(B, C, N).transpose(1, 2)).reshape(B, N, 4, C).permute(2, 0, 1, 3).unbind(0)
        lepe = self.lepe(v.reshape(B, H, W, C).permute(0, 3, 1, 2))
        q, k, v = (t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        x = pacs_attention(q, k, v, self.s1, self.s2, sin, cos, fp32=self.fp32_attn, impl=self.attn_impl)
        x = x.transpose(1, 2).reshape(B, H, W, C).permute(0, 3, 1, 2) + lepe
        x = self.proj(x.reshape(B, C, N).transpose(1, 2) * g)
        return x.reshape(B, H, W, C).permute(0, 3, 1, 2)

    def extra_repr(self):
        return f'dim={self.dim}, num_heads={self.num_heads}, attn_impl={self.attn_impl!r}'


@register_notrace_module  # torch.fx leaf: run-time shapes
class RoPESoftmaxAttention(nn.Module):
    """Softmax attention with RoPE on queries and keys (the official last-stage block).

    ``qkvo`` projects to queries, keys, values and an output gate; ``lepe`` as in
    :class:`PaCSAttention`. ``attn_impl='reference'`` runs the official op order, ``'auto'`` uses
    ``F.scaled_dot_product_attention`` (same function, memory-efficient kernels).
    """

    def __init__(self, dim, num_heads, attn_impl='auto'):
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkvo = nn.Linear(dim, dim * 4)
        self.lepe = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_impl = check_attn_impl(attn_impl)

    def forward(self, x, sin, cos):
        B, C, H, W = x.shape
        N = H * W
        q, k, v, o = self.qkvo(x.reshape(B, C, N).transpose(1, 2)).reshape(B, N, 4, C).permute(2, 0, 1, 3).unbind(0)
        lepe = self.lepe(v.reshape(B, H, W, C).permute(0, 3, 1, 2))
        q, k, v = (t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        sin, cos = sin.to(q.dtype), cos.to(q.dtype)
        q = rope_rotate(q, sin, cos)
        k = rope_rotate(k, sin, cos)
        if self.attn_impl == 'reference':  # 'auto' and 'fast': SDPA
            x = torch.softmax(self.scale * q @ k.transpose(-1, -2), dim=-1) @ v
        else:
            x = F.scaled_dot_product_attention(q, k, v.contiguous(), scale=self.scale)
        x = x.transpose(1, 2).reshape(B, H, W, C).permute(0, 3, 1, 2) + lepe
        x = self.proj(x.reshape(B, C, N).transpose(1, 2) * o)
        return x.reshape(B, H, W, C).permute(0, 3, 1, 2)

    def extra_repr(self):
        return f'dim={self.dim}, num_heads={self.num_heads}, attn_impl={self.attn_impl!r}'


def _build_pacs(layout, dim, num_heads, *, attn_impl, fp32_attn, **unused):
    return PaCSAttention(dim, num_heads, attn_impl=attn_impl, fp32_attn=fp32_attn)


def _build_rope_softmax(layout, dim, num_heads, *, attn_impl, **unused):
    return RoPESoftmaxAttention(dim, num_heads, attn_impl=attn_impl)


# PolaFormer++'s two kinds, in its own layout 'polapp': the modules take NCHW maps and the RoPE tables of
# the map, ``attn(x, sin, cos)`` (x: (B, C, H, W)); the common builder arguments of the pvt / swin layouts
# (spatial reduction, windows, qkv_bias ...) do not apply and are ignored.
register_attention_kind(AttentionKind('pacs', 'L', 'PaCS', _build_pacs, layouts=('polapp',)))
register_attention_kind(AttentionKind('rope_softmax', 'S', 'RoPE softmax', _build_rope_softmax, layouts=('polapp',)))


class FeedForwardNetwork(nn.Module):
    """fc1 -> GELU -> (3x3 depthwise conv + identity) -> fc2 on NCHW maps (the official ``ffn``)."""

    def __init__(self, dim, hidden_dim, drop=0.):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.dwconv = nn.Conv2d(hidden_dim, hidden_dim, 3, 1, 1, groups=hidden_dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        x = self.drop(F.gelu(self.fc1(x.permute(0, 2, 3, 1)))).permute(0, 3, 1, 2)  # channels last for fc1
        x = self.dwconv(x) + x
        return self.drop(self.fc2(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)


class PolaPPBlock(nn.Module):
    """x + pos(x), then x + DropPath(gamma_1 * Attn(LN(x))), x + DropPath(gamma_2 * FFN(LN(x))).

    ``attn``: the attention module, :class:`PaCSAttention` (``attn_type='L'``, RoPE tables of the 2x wide
    feature maps) or :class:`RoPESoftmaxAttention` (``'S'``, tables of the head dim), built from the
    attention-kind table. ``layer_scale_init``: initial value of ``gamma_1`` / ``gamma_2``, None for no
    layer scale.
    """

    def __init__(self, dim, attn, mlp_ratio, attn_type='L', drop_path=0., layer_scale_init=1.0, drop=0.):
        super().__init__()
        self.attn_type = attn_type
        self.pos = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.norm1 = LayerNorm2d(dim)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = LayerNorm2d(dim)
        self.ffn = FeedForwardNetwork(dim, int(mlp_ratio * dim), drop=drop)
        self.layer_scale = layer_scale_init is not None
        if self.layer_scale:
            self.gamma_1 = nn.Parameter(torch.full((1, dim, 1, 1), float(layer_scale_init)))
            self.gamma_2 = nn.Parameter(torch.full((1, dim, 1, 1), float(layer_scale_init)))

    def forward(self, x, tables):
        """x (B, C, H, W); tables: {'L': sin and cos of the feature maps, 'S': of a head}, each (2, H*W, c)."""
        x = x + self.pos(x)
        table = tables[self.attn_type]
        attn = self.attn(self.norm1(x), table[0], table[1])
        x = x + self.drop_path(self.gamma_1 * attn if self.layer_scale else attn)
        ffn = self.ffn(self.norm2(x))
        return x + self.drop_path(self.gamma_2 * ffn if self.layer_scale else ffn)


class PatchMerging(nn.Module):
    """3x3 stride-2 conv + BatchNorm (``reduction``, ``norm``): (B, C, H, W) -> (B, C', ceil(H/2), ceil(W/2))."""

    def __init__(self, dim, out_dim):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = nn.BatchNorm2d(out_dim)

    def forward(self, x):
        return self.norm(self.reduction(x))


class PolaPPStage(nn.Module):
    """Blocks of one stage (``blocks``), its RoPE angles (``RoPE`` for softmax attention,
    ``RoPE_linear`` for the PaCS maps) and the patch merging after it (``downsample``)."""

    def __init__(self, dim, out_dim, num_heads, blocks):
        super().__init__()
        self.RoPE = RotaryEmbedding(dim, num_heads)
        self.RoPE_linear = RotaryEmbedding(2 * dim, num_heads)
        self.blocks = nn.ModuleList(blocks)
        self.downsample = PatchMerging(dim, out_dim) if out_dim is not None else None

    def rope_tables(self, hw):
        """The blocks' second argument for an H x W map: {'S': tables of a head, 'L': of the PaCS maps}."""
        return {'S': self.RoPE(hw), 'L': self.RoPE_linear(hw)}


def conv_stem(in_channels, dim):
    """The official stem (``patch_embed.proj``): four 3x3 convs (strides 2, 1, 1, 2) with BatchNorm,
    GELU between them; (B, C_in, H, W) -> (B, dim, ceil(ceil(H/2)/2), ...)."""
    half = dim // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, half, 3, 2, 1), nn.BatchNorm2d(half), nn.GELU(),
        nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
        nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
        nn.Conv2d(half, dim, 3, 2, 1), nn.BatchNorm2d(dim))


class PatchEmbed(nn.Module):
    def __init__(self, in_channels, dim):
        super().__init__()
        self.proj = conv_stem(in_channels, dim)

    def forward(self, x):
        return self.proj(x)


def init_polapp_weights(module):
    """The official ``_init_weights``: Conv2d trunc_normal(.02) with zero bias, LayerNorm (1, 0);
    Linear layers keep PyTorch's default init, as in the official code."""
    if isinstance(module, nn.Conv2d):
        trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.constant_(module.bias, 0)
    elif isinstance(module, nn.LayerNorm):
        nn.init.constant_(module.bias, 0)
        nn.init.constant_(module.weight, 1.0)


@MODELS.register_module()
class PolaPP(DenseBackbone):
    """PolaFormer++ backbone for mmdet / mmseg (registered in mmengine's root ``MODELS``).

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
        attn_type: one char per stage, ``'L'`` PaCS linear attention or ``'S'`` softmax attention
            (released: ``'LLSS'``).
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
        with_cp: gradient checkpointing of every block.
        attn_impl: ``'auto'`` / ``'fast'`` (fast PaCS core, SDPA softmax) or ``'reference'`` (official
            op order).
        fp32_attn: run the PaCS core in float32 under autocast.
        pretrained: deprecated alias of ``init_cfg=dict(type='Pretrained', checkpoint=...)``.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL, prefix=None, use_ema=True)``
            loads official classification (``state_dict_ema`` when present and ``use_ema``) or
            dense files, mmengine checkpoints of our runs and bare state dicts through
            :func:`mmpola.checkpoint.load_pola_checkpoint`; the classification projection, its
            BatchNorm and the head are dropped; other init configs go to mmengine.

    Stages after ``max(out_indices)`` are built (checkpoints load unchanged) but not run. Arguments,
    loading, freezing, the drop-path schedule and the checkpointed block loop are the shared
    :class:`~mmpola.models.base.DenseBackbone`'s; the attention modules come from the attention-kind
    table (kinds ``'pacs'`` and ``'rope_softmax'``, layout ``'polapp'``).
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
    arch_keys = _STRUCTURE_KEYS
    default_out_norm = True
    # for the checkpoint loader: keys every PolaFormer++ checkpoint has, and the official
    # classification-only modules (projection, its BatchNorm, head) it drops
    official_name = 'PolaFormer++'
    official_key_pattern = 'layers.0.blocks.0.norm1.norm.weight'
    family_key_suffixes = ('.norm1.norm.weight', '.ffn.dwconv.weight')
    classification_only_modules = ('proj', 'norm', 'head')

    def __init__(self, arch='b2', in_channels=3, out_indices=(0, 1, 2, 3), attn_type='LLSS', drop_rate=0.,
                 drop_path_rate=0.1, out_norm=True, frozen_stages=-1, norm_eval=False, with_cp=False,
                 attn_impl='auto', fp32_attn=True, pretrained=None, init_cfg=None):
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=out_norm,
                         frozen_stages=frozen_stages, norm_eval=norm_eval, with_cp=with_cp, pretrained=pretrained,
                         init_cfg=init_cfg)
        settings = self.arch
        for key in self.arch_keys:
            if len(settings[key]) != self.num_stages:
                raise PolaConfigError(f'arch {key} must have {self.num_stages} entries, got {settings[key]!r}')
        self.embed_dims = list(settings['embed_dims'])
        self.depths = list(settings['depths'])
        self.num_heads = list(settings['num_heads'])
        self.mlp_ratios = list(settings['mlp_ratios'])
        self.layer_scale_init_values = list(settings['layer_scale_init_values'])
        letters = self.attention_letters()
        self.attn_type = check_stage_string(attn_type, ''.join(letters), self.num_stages, 'attn_type')
        check_attn_impl(attn_impl)

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims[0])
        dpr = drop_path_rates(drop_path_rate, self.depths)
        self.layers = nn.ModuleList()
        for i, dim in enumerate(self.embed_dims):
            letter = self.attn_type[i]
            blocks = [PolaPPBlock(dim, build_attention(letters[letter], 'polapp', dim, self.num_heads[i],
                                                       attn_impl=attn_impl, fp32_attn=fp32_attn),
                                  self.mlp_ratios[i], attn_type=letter, drop_path=dpr[i][j],
                                  layer_scale_init=self.layer_scale_init_values[i], drop=drop_rate)
                      for j in range(self.depths[i])]
            out_dim = self.embed_dims[i + 1] if i < self.num_stages - 1 else None
            self.layers.append(PolaPPStage(dim, out_dim, self.num_heads[i], blocks))
        if self.out_norm:
            # keyed by stage index, so the names are the official 'extra_norms.{i}' whichever stages
            # are returned (a norm for a stage that is not returned would never get a gradient)
            self.extra_norms = nn.ModuleDict({str(i): LayerNorm2d(self.embed_dims[i]) for i in self.out_indices})
        self.apply(init_polapp_weights)
        self._freeze_stages()

    @classmethod
    def attention_letters(cls):
        """``{'L': 'pacs', 'S': 'rope_softmax'}``: the kinds of the official per-stage letters."""
        return {'L': 'pacs', 'S': 'rope_softmax'}

    # ---------------------------------------------------------------------------------------------
    # DenseBackbone hooks: the stem gives an NCHW map, each stage patch-merges the previous output
    # and hands its blocks the RoPE tables of the real map size (``run_blocks`` passes them on)

    def _stem(self, x):
        return self.patch_embed(x), None

    def _enter_stage(self, i, x, hw):
        if i > 0:
            x = self.layers[i - 1].downsample(x)
        return x, self.layers[i].rope_tables(x.shape[-2:])

    def _stage_blocks(self, i):
        return self.layers[i].blocks

    def _stem_parts(self):
        return [self.patch_embed], []

    def _stage_parts(self, i):
        modules = [self.layers[i]]
        if self.out_norm and str(i) in self.extra_norms:
            modules.append(self.extra_norms[str(i)])
        return modules, []

    def train(self, mode=True):
        """Set train/eval mode, keeping frozen stages frozen and, with ``norm_eval``, BatchNorms in eval."""
        super().train(mode)
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def forward_stages(self, x, last_stage=None):
        """Run the stem and stages 0..last_stage.

        Args:
            x: (B, in_channels, H, W) images.
            last_stage: last 0-based stage to run (default: the last one).

        Returns:
            list of (B, C_i, H_i, W_i): every stage's last block output, before patch merging and
            before any norm.
        """
        return [out for out, _ in super().forward_stages(x, last_stage)]

    def forward(self, x):
        """(B, C_in, H, W) -> tuple of (B, C_i, H_i, W_i) for i in ``out_indices``."""
        stages = self.forward_stages(x, max(self.out_indices))
        return tuple(self.extra_norms[str(i)](stages[i]) if self.out_norm else stages[i] for i in self.out_indices)


# --------------------------------------------------------------------------------------------------
# ImageNet classifier (official head: 1x1 projection, BatchNorm, swish, average pool, 1x1 conv head)
# --------------------------------------------------------------------------------------------------

# width of the classification projection of the released sizes
PROJECTION = {'b0': 2048, 'b1': 2048, 'b2': 2048, 'b3': 2048, 'b4': 2048, 'b5': 2560}
# stochastic depth of the official ImageNet recipes
DROP_PATH_RATE = {'b0': 0.1, 'b1': 0.1, 'b2': 0.1, 'b3': 0.15, 'b4': 0.4, 'b5': 0.55}


@MODELS.register_module()
class PolaPPClassifier(TimmClassifierMixin, BaseModule):
    """PolaFormer++ image classifier with the official forward, and timm's model API.

    State dict: ``backbone.*`` (official names below it), ``proj.*``, ``norm.*`` (BatchNorm2d),
    ``head.*`` (1x1 conv); :func:`mmpola.models.classifier.checkpoint_filter_fn` maps official files
    to it.

    timm's conventions come from :class:`~mmpola.models.timm_conventions.TimmClassifierMixin`, as for
    the ``pola_*`` entries: ``forward_features`` -> the final map (B, h, w, projection) in NHWC, after
    the projection, BatchNorm and swish; ``num_features`` / ``head_hidden_size`` (= ``projection``);
    the official head is a 1x1 convolution after the average pool.

    Args:
        arch: ``'b0'`` ... ``'b5'`` or a custom arch dict (see :class:`PolaPP`).
        num_classes: classes of ``head`` (0: no head, ``forward`` returns pooled features).
        global_pool: ``'avg'`` (official) or ``''`` (no pooling: ``forward`` returns the NHWC map).
        projection: channels of the 1x1 projection before pooling (default: the released value of
            the preset, ``PROJECTION``; required for a custom arch).
        drop_rate, drop_path_rate: FFN dropout, stochastic depth (official: ``DROP_PATH_RATE``).
        attn_impl, fp32_attn, with_cp, attn_type, in_channels: passed to :class:`PolaPP`.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH, strict=True)`` loads with
            :meth:`load_checkpoint` (official, mmengine or this class' own files; EMA weights first).

    Shapes: images (B, C, H, W) -> logits (B, num_classes).
    """

    family = 'polapp'
    classification_modules = ('proj', 'norm', 'head')
    not_scriptable_reason = ('the PaCS attention core is a custom autograd Function and the stages build '
                             'their rotary tables from the run-time map size, which TorchScript does not support')

    def __init__(self, arch='b2', num_classes=1000, global_pool='avg', projection=None, drop_rate=0.,
                 drop_path_rate=0.1, attn_impl='auto', fp32_attn=True, with_cp=False, init_cfg=None,
                 **backbone_kwargs):
        super().__init__(init_cfg=init_cfg)
        for key in ('out_indices', 'out_norm', 'frozen_stages', 'init_cfg', 'pretrained'):
            if key in backbone_kwargs:
                raise ValueError(f'{key} is fixed by PolaPPClassifier (the official classification forward); '
                                 'build the PolaPP backbone directly to change it')
        if projection is None:
            if not isinstance(arch, str) or arch.lower() not in PROJECTION:
                raise ValueError('a custom PolaPP arch needs projection= (channels of the classification '
                                 f'projection; released sizes use {sorted(set(PROJECTION.values()))})')
            projection = PROJECTION[arch.lower()]
        self.num_classes = num_classes
        self.global_pool = check_global_pool(global_pool)
        self.backbone = PolaPP(arch=arch, out_indices=(0, 1, 2, 3), out_norm=False, drop_rate=drop_rate,
                               drop_path_rate=drop_path_rate, attn_impl=attn_impl, fp32_attn=fp32_attn,
                               with_cp=with_cp, **backbone_kwargs)
        self.num_features = projection
        # timm's description of the stage maps; ``module``: the stage's blocks
        self.feature_info = [dict(num_chs=c, reduction=4 * 2 ** i, module=f'backbone.layers.{i}.blocks')
                             for i, c in enumerate(self.backbone.embed_dims)]
        self.proj = nn.Conv2d(self.backbone.embed_dims[-1], projection, 1)
        self.norm = nn.BatchNorm2d(projection)
        self.head = self._make_head(num_classes)
        init_polapp_weights(self.proj)

    def _make_head(self, num_classes):
        """The official head: a 1x1 convolution (applied to the pooled (B, P, 1, 1) map)."""
        if num_classes <= 0:
            return nn.Identity()
        head = nn.Conv2d(self.num_features, num_classes, 1)
        init_polapp_weights(head)
        return head

    @classmethod
    def from_official_kwargs(cls, kwargs, **overrides):
        """Build from the keyword arguments of the official ``POLA`` class (``embed_dims``, ``depths``,
        ``num_heads``, ``mlp_ratios``, ``drop_path_rate``, ``projection``, ``layerscales``,
        ``layer_init_values``, ``num_classes``)."""
        kwargs = dict(kwargs)
        layerscales = kwargs.pop('layerscales', [False] * 4)
        init_values = kwargs.pop('layer_init_values', [1e-6] * 4)
        arch = dict(embed_dims=list(kwargs.pop('embed_dims')), depths=list(kwargs.pop('depths')),
                    num_heads=list(kwargs.pop('num_heads')), mlp_ratios=list(kwargs.pop('mlp_ratios')),
                    layer_scale_init_values=[v if on else None for on, v in zip(layerscales, init_values)])
        out = dict(arch=arch, num_classes=kwargs.pop('num_classes', 1000),
                   projection=kwargs.pop('projection', 1024), drop_path_rate=kwargs.pop('drop_path_rate', 0.1))
        if 'in_chans' in kwargs:
            out['in_channels'] = kwargs.pop('in_chans')
        if 'flagss' in kwargs:
            flags = kwargs.pop('flagss')
            kinds = [set(f[:d]) for f, d in zip(flags, arch['depths'])]
            if any(len(k) != 1 for k in kinds):
                raise ValueError('per-block attention flags that differ within a stage are not supported')
            out['attn_type'] = ''.join('L' if k == {'l'} else 'S' for k in kinds)
        if kwargs:
            raise ValueError(f'unsupported official POLA arguments: {sorted(kwargs)}')
        out.update(overrides)
        return cls(**out)

    def set_attn_impl(self, impl):
        """Switch every attention between ``'auto'`` and ``'reference'`` (official op order)."""
        self.backbone.set_attn_impl(impl)

    def init_weights(self):
        if is_pretrained_cfg(self.init_cfg):
            self.load_checkpoint(self.init_cfg['checkpoint'], strict=self.init_cfg.get('strict', True),
                                 use_ema=self.init_cfg.get('use_ema', True))
            self._is_init = True
        else:
            super().init_weights()

    def load_checkpoint(self, checkpoint, strict=True, use_ema=True, map_location='cpu'):
        """Load an official, mmengine or PolaPPClassifier checkpoint (path, URL or dict); returns the
        ``load_state_dict`` result."""
        from mmpola.checkpoint import check_checkpoint_family, extract_state_dict, read_checkpoint

        from .classifier import checkpoint_filter_fn
        state_dict, _ = extract_state_dict(read_checkpoint(checkpoint, map_location), use_ema)
        state_dict = checkpoint_filter_fn(state_dict, self)
        source = checkpoint if isinstance(checkpoint, (str, os.PathLike)) else 'the given state dict'
        check_checkpoint_family(state_dict, self.backbone, source)
        return self.load_state_dict(state_dict, strict=strict)

    @property
    def grad_checkpointing(self):
        return self.backbone.with_cp

    @grad_checkpointing.setter
    def grad_checkpointing(self, enable):
        self.backbone.with_cp = bool(enable)

    def _prune_norm(self):
        """``prune_intermediate_layers(prune_norm=True)``: the projection and its BatchNorm."""
        self.proj, self.norm = nn.Identity(), nn.Identity()

    def _final_features(self, x):
        """Last stage map (B, C, h, w) -> (B, h, w, projection): projection, BatchNorm, swish (NHWC view)."""
        return F.silu(self.norm(self.proj(x))).permute(0, 2, 3, 1)

    def forward_features(self, x):
        """(B, C, H, W) -> the final map (B, H/32, W/32, projection), NHWC, unpooled."""
        return self._final_features(self.backbone.forward_stages(x)[-1])

    def forward_head(self, x, pre_logits=False):
        """Final map (B, h, w, P) -> logits (B, num_classes), or the pooled (B, P) with ``pre_logits``
        (with ``global_pool=''`` no pooling: (B, h, w, P) / (B, h, w, num_classes))."""
        if self.global_pool == 'avg':
            x = x.mean(dim=(1, 2), keepdim=True)  # the official average pool, (B, 1, 1, P)
        if not pre_logits:
            x = self.head(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # the official 1x1 conv head
        return x.flatten(1) if self.global_pool == 'avg' else x

    def forward_intermediates(self, x, indices=None, norm=False, stop_early=False, output_fmt='NCHW',
                              intermediates_only=False):
        """Stage maps and final features in one pass (timm's ``forward_intermediates`` API).

        Args:
            x: (B, C, H, W) images.
            indices: stages to return: None (all four), an int n (the last n) or 0-based indices
                (negative ones count from the end).
            norm: accepted for API compatibility (the official classifier has no per-stage norm).
            stop_early: do not run the stages after the last requested one (only with
                ``intermediates_only``).
            output_fmt: only ``'NCHW'``.
            intermediates_only: return only the list of maps.

        Returns:
            ``(forward_features output, [maps])`` or ``[maps]``; each map (B, C_i, H_i, W_i) is the
            raw stage output before patch merging.
        """
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        num_stages = self.backbone.num_stages
        take = self._stage_indices(indices, num_stages)
        last = max(take) if stop_early else num_stages - 1
        if last != num_stages - 1 and not intermediates_only:
            raise ValueError('stop_early needs intermediates_only=True (the final features come from the '
                             'last stage)')
        stages = self.backbone.forward_stages(x, last)
        maps = [stages[i] for i in take]
        if intermediates_only:
            return maps
        return self._final_features(stages[-1]), maps


