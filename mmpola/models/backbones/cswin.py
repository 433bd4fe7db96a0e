"""CSWin as a dense-prediction backbone with any registered attention kind that runs on projected
operands: :class:`CSWinBackbone` (registered as ``CSWinBackbone``, family ``'cswin'``; presets
``FLattenCSWin`` and ``InLineCSWin`` in :mod:`.presets`).

The module tree is the official one (microsoft/CSWin-Transformer ``models/cswin.py``, as the FLatten
and InLine releases modify it)::

    stage1_conv_embed.0 / .2   Conv2d(C_in, C, 7, stride 4, padding 2), (index 1: the token flatten), LayerNorm
    stage{i}.{j}.norm1 / .norm2 / .mlp.fc1 / .mlp.fc2
    stage{i}.{j}.qkv           Linear(C, P*C): the block's projections, shared by its branches
    stage{i}.{j}.attns.{b}.*   the branches: the attention kind's module (+ ``get_v``, CSWin's LePE)
    stage{i}.{j}.proj          Linear(C, C) on the concatenated branch outputs
    merge{i}.conv / .norm      Conv2d(C, 2C, 3, stride 2, padding 1) + LayerNorm between the stages
    norm{i}                    the dense output norms (1-based, as the official dense backbone)

so official files load by filtering (the classification ``norm`` and ``head`` dropped) and official
CSWin dense files (microsoft/CSWin-Transformer ``segmentation/``) load their output norms.

**The block owns the projections** (docs/design.md, "CSWin: the block owns the projections"): it
projects the normed tokens once with ``qkv`` into P operands (q, k, v; Pola: q, k, v, g), and calls
each branch module ``attns.{b}`` with its channels of them, ``attn(qkv (B, N, P, c), hw, x_mean=...)``
(``qkv_layout='projected'``; ``x_mean``: the mean over tokens of the block input, the branch's
channels, from which InLine predicts its residual kernels), then projects the concatenated outputs
with ``proj``. A softmax block ('S', kind ``'stripe_softmax'``) has two branches over the two channel
halves, vertical and horizontal stripes of ``split_size`` (one branch over the whole map where the
stripe is the whole stage map: always in the last stage). A block of another kind has one branch
over the whole stage map with all channels and heads, as every released FLatten / InLine model
(``la_split_size`` = the stage resolution), to which the block adds CSWin's LePE: ``get_v(v)``, a 3x3
depthwise conv of the branch's values, stored in the branch module under the official name
``attns.0.get_v`` (the stripe softmax computes its LePE per stripe itself).
"""
import torch
import torch.nn as nn

from ..attention import attention_class
from ..checks import PolaConfigError, square_pretrain_size
from ..classification_head import FinalNormHead, register_classification_head
from ..layers import DepthwiseConv2d, DropPath, Mlp, norm_linear, residual_mlp, tokens_as_map
from .base import DenseBackbone, drop_path_rates, register_architecture, tokens_to_nchw

__all__ = ['CSWinBackbone', 'CSWinHead', 'CSWinBlock', 'MergeBlock']


class MapToTokens(nn.Module):
    """(B, C, H, W) -> (B, H*W, C): index 1 of ``stage1_conv_embed`` (the official Rearrange, no weights)."""

    def forward(self, x):
        return x.flatten(2).transpose(1, 2)


class CSWinBlock(nn.Module):
    """Pre-norm CSWin block: the block's ``qkv`` projections, one or two branch modules ``attns``,
    ``proj``, then the MLP; LayerNorms eps 1e-5.

    Args:
        dim: channels C.
        attns: the branch modules (``qkv_layout='projected'``): one over all C channels, or two over the
            halves.
        projections: P, the operands the branches need (3, Pola 4): ``qkv`` is Linear(C, P*C).
        mlp_ratio, qkv_bias, drop, drop_path: as in CSWin (the official block builds a dropout after
            ``proj`` and never applies it; so does this one not).

    Shapes: ``forward(x, hw, **context)``: (B, H*W, C), (H, W) -> (B, H*W, C).
    """

    def __init__(self, dim, attns, projections=3, mlp_ratio=4., qkv_bias=True, drop=0., drop_path=0.):
        super().__init__()
        self.dim = dim
        self.projections = projections
        self.qkv = nn.Linear(dim, dim * projections, bias=qkv_bias)
        self.norm1 = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.attns = nn.ModuleList(attns)
        # CSWin's LePE of a branch that does not apply it itself: get_v(v), stored in the branch module
        self.block_lepe = [not getattr(attn, 'applies_lepe', False) for attn in attns]
        channels = dim // len(attns)
        for attn, lepe in zip(self.attns, self.block_lepe):
            if lepe:
                attn.get_v = DepthwiseConv2d(channels, 3)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.norm2 = nn.LayerNorm(dim)

    def _branch(self, b, qkv, hw, x_mean, context):
        attn = self.attns[b]
        if not self.block_lepe[b]:
            return attn(qkv, hw, x_mean=x_mean, **context)
        # the operands taken apart once, for the attention and the LePE: the LePE's v is the attention's, so
        # its gradient adds to the attention's before unbind's one backward (a second selection of v would
        # give a zero-filled gradient of the whole projection, added to the other)
        operands = qkv.unbind(2)
        out = attn(operands, hw, x_mean=x_mean, **context)
        return out + attn.get_v(tokens_to_nchw(operands[2], hw)).flatten(2).transpose(1, 2)

    def forward(self, x, hw, **context):
        qkv = norm_linear(self.norm1, self.qkv, x).unflatten(-1, (self.projections, self.dim))
        x_mean = x.mean(dim=1)
        if len(self.attns) == 2:
            # the branches' halves of the channels as views of one split, whose backward is one stack of their
            # gradients (two slices would each fill a zero tensor of the whole projection, then add the two)
            half = self.dim // 2
            halves, means = qkv.unflatten(-1, (2, half)).unbind(-2), x_mean.unflatten(-1, (2, half)).unbind(-2)
            out = torch.cat([self._branch(b, halves[b], hw, means[b], context) for b in range(2)], dim=2)
        else:
            out = self._branch(0, qkv, hw, x_mean, context)
        x, mlp = residual_mlp(self.mlp, x, self.proj(out), self.drop_path, self.norm2)
        return x + self.drop_path(mlp)


class MergeBlock(nn.Module):
    """``merge{i}``: Conv2d(C, C_out, 3, stride 2, padding 1) + LayerNorm on the token map.

    Shapes: ``forward(x, hw)``: (B, H*W, C), (H, W) -> (B, H'*W', C_out), (H', W') = ceil((H, W) / 2).
    """

    def __init__(self, dim, dim_out):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, 3, 2, 1)
        self.norm = nn.LayerNorm(dim_out)

    def forward(self, x, hw):
        x = self.conv(tokens_as_map(x, hw))  # channels-last in and out: its tokens are a contiguous view
        out_hw = (x.shape[-2], x.shape[-1])
        return self.norm(x.flatten(2).transpose(1, 2)), out_hw


@register_architecture('cswin', title='CSWin')
class CSWinBackbone(DenseBackbone):
    """CSWin backbone with the attention of ``attn`` / ``attn_type``.

    Input (B, in_channels, H, W) with H, W >= 32 (any, odd and non-square included). Output: a
    tuple of NCHW maps for ``out_indices``, channels ``embed_dims * 2**i``, sizes
    H_1 = floor((H - 3) / 4) + 1 (the official 7x7 / stride 4 / padding 2 stem: 56 at 224),
    H_{i+1} = ceil(H_i / 2) (strides 4, 8, 16, 32), each the stage's last block output through the
    output norm ``norm{i+1}`` (as the official dense backbone).

    Softmax stripes at any size: the q, k, v maps are zero-padded symmetrically to whole stripes, as
    the official dense backbone (:class:`~mmpola.models.attention.StripeAttention`). Linear branches
    attend over the whole stage map with their positional encodings (where the kind has one)
    stored on the pretraining grid and resized bilinearly to the real map.

    Args:
        arch: ``'tiny'``, ``'small'``, ``'base'``, ``'base_384'`` (the FLatten release's sizes, see
            ``arch_settings``; the InLine release's small is deeper, its preset's) or a dict with
            ``embed_dims`` (int, stage-1 width), ``depths``, ``num_heads``, ``split_size`` (four
            entries each: the stripe width of the softmax stages).
        pretrain_img_size: the pretraining image size (sets the stored grids of positional
            encodings: stage i map img / 4 / 2**i). None: 384 for ``'base_384'``, else 224.
        in_channels: input image channels.
        out_indices: stages (0-based) to return.
        attn: the attention kind and its options (any kind that runs on projected operands:
            ``qkv_layout='projected'``); see :class:`~mmpola.models.backbones.DenseBackbone`.
        attn_type: one char per stage: the letter of ``attn``, ``'S'`` (stripe softmax), ``'M'``
            mixed (the first k blocks the kind, k after the stage chars). None: the preset's.
        la_split_size: the linear stages' window as the official ``'56-28-14-7'`` string; must be
            the stage maps at pretraining (every release: one branch over the whole map). None: those.
        mlp_ratio, qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path_rate: as in CSWin.
        out_norm: add the output LayerNorms ``norm{i+1}`` of the returned stages (default True, as
            the official dense backbone; the classifier builds without them).
        frozen_stages: -1 none; 0 freezes ``stage1_conv_embed``; k >= 1 also stages 1..k (their
            blocks, the merge before them and their output norm).
        norm_eval, with_cp, recompute, attn_impl, fp32_attn: see
            :class:`~mmpola.models.backbones.DenseBackbone`.
        init_cfg: see :class:`~mmpola.models.backbones.DenseBackbone`; ``map_final_norm=True`` copies
            the trained classification ``norm`` into ``norm4``.
        **unexpected: an error naming the attention options, which go in ``attn``.

    Attention context: ``qkv_layout='projected'``; linear branches ``pe_grid`` = the stage map at
    pretraining; stripe branches ``split_size`` and ``orientation`` (``'vertical'``, ``'horizontal'``,
    ``'whole'``). Every call: ``x_mean``.

    Stages after ``max(out_indices)`` are built (so checkpoints load unchanged) but not run.
    """

    arch_settings = {
        'tiny': dict(embed_dims=64, depths=[2, 4, 18, 1], num_heads=[2, 4, 8, 16], split_size=[1, 2, 7, 7]),
        'small': dict(embed_dims=64, depths=[2, 4, 32, 2], num_heads=[2, 4, 8, 16], split_size=[1, 2, 7, 7]),
        'base': dict(embed_dims=96, depths=[3, 6, 29, 2], num_heads=[4, 8, 16, 32], split_size=[1, 2, 7, 7]),
        'base_384': dict(embed_dims=96, depths=[3, 6, 29, 2], num_heads=[4, 8, 16, 32], split_size=[1, 2, 12, 12]),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads', 'split_size')
    out_norm_eps = 1e-5
    default_out_norm = True
    softmax_attn = 'stripe_softmax'
    softmax_name = 'softmax CSWin (microsoft/CSWin-Transformer)'
    attention_context = ('qkv_layout', 'split_size', 'orientation')
    qkv_layout = 'projected'
    official_key_pattern = 'stage1.0.attns.0.*'
    first_conv = 'stage1_conv_embed.0'

    def __init__(self, arch='tiny', pretrain_img_size=None, in_channels=3, out_indices=(0, 1, 2, 3), attn_type=None,
                 la_split_size=None, mlp_ratio=4., qkv_bias=True, qk_scale=None, drop_rate=0., attn_drop_rate=0.,
                 drop_path_rate=0.1, out_norm=None, frozen_stages=-1, norm_eval=False, with_cp=False, recompute=None,
                 attn=None, attn_impl='auto', fp32_attn=True, init_cfg=None, **unexpected):
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=out_norm,
                         frozen_stages=frozen_stages, norm_eval=norm_eval, with_cp=with_cp, recompute=recompute,
                         attn=attn, attn_type=attn_type, attn_impl=attn_impl, fp32_attn=fp32_attn,
                         unexpected=unexpected, init_cfg=init_cfg)
        name = type(self).__name__
        settings = self.arch
        embed_dims = settings['embed_dims']
        self.embed_dims = self.doubling_widths()
        self.init_stages(('depths', 'num_heads', 'split_size'))
        if pretrain_img_size is None:
            pretrain_img_size = 384 if (self.arch_name or '').endswith('_384') else 224
        self.pretrain_img_size = square_pretrain_size(pretrain_img_size, name)
        self.resolutions = [self.pretrain_img_size[0] // 4 // 2 ** i for i in range(self.num_stages)]
        self._check_la_split_size(la_split_size)

        self.stage1_conv_embed = nn.Sequential(nn.Conv2d(in_channels, embed_dims, 7, 4, 2), MapToTokens(),
                                               nn.LayerNorm(embed_dims))
        dpr = drop_path_rates(drop_path_rate, self.depths)
        for i in range(self.num_stages):
            dim, heads, reso = self.embed_dims[i], self.num_heads[i], self.resolutions[i]
            blocks = []
            for j in range(self.depths[i]):
                kind = self.block_kinds[i][j]
                common = dict(qkv_layout='projected', qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop_rate)
                if kind != self.softmax_attn:  # one branch over the whole stage map
                    attns = [self.build_attention(i, j, dim, heads, pe_grid=(reso, reso), orientation='whole',
                                                  **common)]
                elif i == self.num_stages - 1 or self.split_size[i] >= reso:
                    attns = [self.build_attention(i, j, dim, heads, split_size=self.split_size[i],
                                                  orientation='whole', pe_grid=(reso, reso), **common)]
                else:  # stripes over the two channel halves
                    self._check_stripe_heads(i, heads)
                    attns = [self.build_attention(i, j, dim // 2, heads // 2, split_size=self.split_size[i],
                                                  orientation=o, pe_grid=(reso, reso), **common)
                             for o in ('vertical', 'horizontal')]
                projections = getattr(attention_class(kind), 'projections', 3)
                blocks.append(CSWinBlock(dim, attns, projections, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                         drop=drop_rate, drop_path=dpr[i][j]))
            setattr(self, f'stage{i + 1}', nn.ModuleList(blocks))
            if i < self.num_stages - 1:
                setattr(self, f'merge{i + 1}', MergeBlock(dim, self.embed_dims[i + 1]))
        self._finish_init()


    def _check_stripe_heads(self, stage, heads):
        """Stripe softmax blocks split the stage's heads between their vertical and horizontal stripes."""
        if heads % 2:
            raise PolaConfigError(
                f"{type(self).__name__}: stage {stage + 1} has stripe softmax blocks ('S'), which split the heads "
                f'between vertical and horizontal stripes, so its head count must be even; got num_heads[{stage}] = '
                f'{heads}. Use an even count there, or another attention letter for that stage in attn_type.')

    def _check_la_split_size(self, la_split_size):
        if la_split_size is None:
            return
        sizes = [int(s) for s in str(la_split_size).split('-')] if not isinstance(la_split_size, (list, tuple)) \
            else [int(s) for s in la_split_size]
        if sizes != self.resolutions:
            raise PolaConfigError(
                f'{type(self).__name__}: la_split_size {la_split_size!r}: the linear CSWin stages attend over the '
                f'whole stage map, as every release (linear attention in stripes is not supported); pass '
                f"la_split_size='{'-'.join(map(str, self.resolutions))}' (or None) for pretrain_img_size="
                f'{self.pretrain_img_size[0]}')

    # ---------------------------------------------------------------------------------------------
    # DenseBackbone hooks

    def output_norm_name(self, i):
        return f'norm{i + 1}'  # the official dense backbone's names (its files load their output norms)

    def _stem(self, x):
        x = self.stage1_conv_embed[0](x)
        hw = (x.shape[-2], x.shape[-1])
        return self.stage1_conv_embed[2](self.stage1_conv_embed[1](x)), hw

    def _enter_stage(self, i, x, hw):
        return getattr(self, f'merge{i}')(x, hw) if i > 0 else (x, hw)

    def _stage_blocks(self, i):
        return getattr(self, f'stage{i + 1}')

    def _stem_parts(self):
        return [self.stage1_conv_embed], []

    def _stage_parts(self, i):
        return [getattr(self, f'stage{i + 1}')] + ([getattr(self, f'merge{i}')] if i > 0 else []), []

    def stage_module(self, i):
        return f'stage{i + 1}'


@register_classification_head('cswin')
class CSWinHead(FinalNormHead):
    """The official CSWin classifier: final LayerNorm ``norm``, mean over the tokens, linear ``head``."""

    backbone_kwargs = dict(out_norm=False)

    @classmethod
    def official_kwargs(cls, architecture, kwargs):
        """The official ``CSWinTransformer`` arguments of the FLatten / InLine releases (``embed_dim``,
        ``depth``, ``split_size`` ...)."""
        if 'split_size' not in kwargs or 'embed_dim' not in kwargs:
            return None
        kwargs = dict(kwargs)
        if kwargs.pop('patch_size', 4) != 4:
            raise ValueError('only patch_size=4 (every released model) is supported')
        if kwargs.pop('hybrid_backbone', None) is not None:
            raise ValueError('hybrid_backbone is not supported; no released model uses it')
        split = kwargs.pop('split_size')
        out = dict(family=architecture.family, num_classes=kwargs.pop('num_classes', 1000),
                   drop_rate=kwargs.pop('drop_rate', 0.), drop_path_rate=kwargs.pop('drop_path_rate', 0.),
                   pretrain_img_size=kwargs.pop('img_size', 224),
                   arch=dict(embed_dims=kwargs.pop('embed_dim'), depths=list(kwargs.pop('depth')),
                             num_heads=list(kwargs.pop('num_heads')),
                             split_size=list(split) if isinstance(split, (list, tuple)) else [split] * 4))
        for key in ('qkv_bias', 'qk_scale', 'attn_drop_rate', 'mlp_ratio', 'la_split_size'):
            if key in kwargs:
                out[key] = kwargs.pop(key)
        for key in ('use_chk', 'in_chans', 'norm_layer'):
            kwargs.pop(key, None)
        attn_type = kwargs.pop('attn_type', None)
        return out, kwargs, attn_type
