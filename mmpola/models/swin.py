"""The Swin family: Swin-v1 macro architecture with a linear attention of the lineage, as a
dense-prediction backbone (:class:`SwinBackbone`), and its registered members (:class:`PolaSwin`).

The module tree is the official one (``patch_embed``, ``layers.{i}.blocks.{j}.attn.*``,
``layers.{i}.downsample.reduction`` ...), so official checkpoints load by filtering keys.

Linear-attention blocks run over the whole stage map (no windows, no shift): at the pretraining
resolution the official linear blocks (window 56 at 224) are one window covering the whole map,
unshifted, so this is the same computation, and at other sizes the positional encoding (where the
kind has one) is resized to the map. Softmax blocks use Swin's padded, shifted windows with a
run-time mask, as mmdet's Swin. What every dense backbone shares lives in
:class:`mmpola.models.base.DenseBackbone`.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS

from .attention_kinds import build_attention, get_attention_kind
from .base import DenseBackbone, drop_path_rates
from .layers import DropPath, Mlp, PatchEmbed, PatchMerging, to_2tuple_int
from .utils import PolaConfigError

__all__ = ['SwinBackbone', 'SwinBlock', 'SwinStage', 'PolaSwin', 'FLattenSwin', 'InLineSwin', 'parse_swin_attn_type']


def parse_swin_attn_type(attn_type, depths, linear='L'):
    """Per-block attention letters from the official ``attn_type`` string.

    One char per stage: ``linear`` (the backbone's linear attention: ``'L'`` Pola / FLatten,
    ``'I'`` InLine), ``'S'`` softmax, ``'M'`` mixed, where the integer after the stage chars gives
    the number of leading linear blocks of every 'M' stage ("LLMS3": stage 2 blocks 0-2 linear,
    the rest softmax).

    Returns:
        list (per stage) of lists (per block) of ``linear`` / 'S'.
    """
    num_stages = len(depths)
    allowed = linear + 'SM'
    if not isinstance(attn_type, str) or len(attn_type) < num_stages:
        raise PolaConfigError(f'attn_type must be a string of {num_stages} chars from "{allowed}" (plus the '
                              f'linear block count for "M" stages, e.g. "{linear * 2}MS3"), got {attn_type!r}')
    stages, suffix = attn_type[:num_stages], attn_type[num_stages:]
    if any(c not in allowed for c in stages):
        raise PolaConfigError(f'attn_type {attn_type!r}: stage chars must be {linear}, S or M')
    if 'M' in stages and not suffix.isdigit():
        raise PolaConfigError(f'attn_type {attn_type!r}: an "M" stage needs the number of linear blocks '
                              f'after the stage chars, e.g. "{linear * 2}MS3"')
    if suffix and 'M' not in stages:
        raise PolaConfigError(f'attn_type {attn_type!r}: trailing {suffix!r} without an "M" stage')
    kinds = []
    for c, depth in zip(stages, depths):
        if c == 'M':
            kinds.append([linear if j < int(suffix) else 'S' for j in range(depth)])
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


class SwinBlock(nn.Module):
    """Pre-norm Swin block with a whole-map attention or shifted-window softmax attention.

    Args:
        dim, mlp_ratio, drop, drop_path: as in Swin.
        attn: a module of :mod:`mmpola.models.attention_kinds`; called ``attn(x, hw)`` on the whole
            map, or per window ``attn(windows, mask)`` when ``windowed``.
        windowed: partition into (padded, shifted) windows of ``window_size``.
        window_size: softmax window.
        shift: shift the windows by ws // 2 (odd blocks).
        clamp_shift: the classification rule: no shift when the map fits in one window
            (min(H, W) <= ws), as the official model decides at build time. Dense default False:
            always shift odd blocks, as mmdet's Swin.

    Shapes: ``forward(x, hw)``: (B, H*W, C), (H, W) -> (B, H*W, C).
    """

    def __init__(self, dim, attn, windowed=False, window_size=7, shift=False, clamp_shift=False, mlp_ratio=4.,
                 drop=0., drop_path=0.):
        super().__init__()
        self.windowed = windowed
        self.window_size = window_size
        self.shift_size = window_size // 2 if shift else 0
        self.clamp_shift = clamp_shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
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
        if self.windowed:
            attn = self._window_attention(self.norm1(x), hw)
        else:
            attn = self.attn(self.norm1(x), hw)
        x = x + self.drop_path(attn)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class SwinStage(nn.Module):
    """``layers.{i}``: ``blocks`` then optional ``downsample`` (:class:`PatchMerging`)."""

    def __init__(self, blocks, downsample=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


class SwinBackbone(DenseBackbone):
    """Swin-family backbone; a registered member sets ``attn_kind`` (its linear attention).

    Input (B, in_channels, H, W) with H, W >= 32 (any, odd and non-square included). Output: a
    tuple of NCHW maps (channels ``embed_dims * 2**i``) for ``out_indices``, each the stage output
    before patch merging through the output norm ``norm{i}``. Sizes ceil: the image is zero-padded
    right/bottom to a multiple of 4, and merging pads odd maps, so H_1 = ceil(H / 4),
    H_{i+1} = ceil(H_i / 2) (mmdet Swin convention).

    Stages: linear blocks attend over the whole stage map with the positional encoding (where the
    kind has one) resized (bilinear) from its pretraining grid; softmax blocks pad to multiples of
    the window, shift odd blocks by ws // 2 and mask (run-time mask, as mmdet).

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
        softmax_window_size: window of softmax blocks (None: the official rule of the kind,
            :meth:`default_softmax_window_size`), clamped to the stage grid at pretraining as the
            official code does.
        mlp_ratio: MLP hidden ratio.
        attn_type: per-stage string of the letter of ``attn_kind`` / 'S' / 'M' (see
            :func:`parse_swin_attn_type`). None: the released string (``default_attn_type``).
        qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path_rate: as in Swin.
        out_indices: stages (0-based) to return.
        out_norm: add the output LayerNorms ``norm{i}`` (eps 1e-5) for ``out_indices`` (new,
            dense-only parameters, as mmdet; default True). ``False`` returns raw stage outputs
            (classifier). ``norm_after_stage``: its deprecated alias.
        clamp_shift: see :class:`SwinBlock` (``False`` for dense prediction).
        frozen_stages: -1 none; 0 freezes ``patch_embed``; k >= 1 also ``layers[0..k-1]`` (blocks
            and their downsample) and ``norm{i}`` for i < k (mmdet's rule).
        norm_eval, with_cp, pretrained: see :class:`DenseBackbone`.
        attn_impl, fp32_attn: passed to every linear attention.
        init_cfg: see :class:`DenseBackbone`; ``map_final_norm=True`` copies the trained
            classification ``norm`` into ``norm3``.
        **attn_options: the options of ``attn_kind`` (``ATTENTION_KINDS[kind].options``).

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
    default_attn_type = None  # set by the members ('LLSS' ...)
    official_key_pattern = 'layers.0.blocks.*'

    def __init__(self, arch='tiny', pretrain_img_size=224, in_channels=3, window_size=None,
                 softmax_window_size=None, mlp_ratio=4., attn_type=None, qkv_bias=True, qk_scale=None,
                 drop_rate=0., attn_drop_rate=0., drop_path_rate=0.2, out_indices=(0, 1, 2, 3), out_norm=None,
                 norm_after_stage=None, clamp_shift=False, frozen_stages=-1, norm_eval=False, with_cp=False,
                 attn_impl='auto', fp32_attn=True, pretrained=None, init_cfg=None, **attn_options):
        super().__init__(arch=arch, in_channels=in_channels, out_indices=out_indices, out_norm=out_norm,
                         norm_after_stage=norm_after_stage, frozen_stages=frozen_stages, norm_eval=norm_eval,
                         with_cp=with_cp, pretrained=pretrained, init_cfg=init_cfg)
        name = type(self).__name__
        self.check_attn_options(attn_options)
        settings = self.arch
        embed_dims = settings['embed_dims']
        if not isinstance(embed_dims, int):
            raise PolaConfigError(f'{name}: embed_dims must be the stage-1 width (int), got {embed_dims!r}')
        self.depths = list(settings['depths'])
        self.num_heads = list(settings['num_heads'])
        if len(self.depths) != self.num_stages or len(self.num_heads) != self.num_stages:
            raise PolaConfigError(f'{name}: depths and num_heads need {self.num_stages} entries each')
        self.embed_dims = [embed_dims * 2 ** i for i in range(self.num_stages)]
        letters = self.attention_letters()
        linear = get_attention_kind(self.attn_kind).letter
        self.attn_type = self.default_attn_type if attn_type is None else attn_type
        self.block_types = parse_swin_attn_type(self.attn_type, self.depths, linear)
        self.clamp_shift = clamp_shift
        self.pretrain_img_size = to_2tuple_int(pretrain_img_size, 'pretrain_img_size')
        if self.pretrain_img_size[0] != self.pretrain_img_size[1]:
            raise PolaConfigError(f'{name}: pretrain_img_size must be square (official models are), got '
                                  f'{self.pretrain_img_size}')
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
            for j, letter in enumerate(self.block_types[i]):
                kind = get_attention_kind(letters[letter])
                attn = build_attention(kind.name, 'swin', dim, self.num_heads[i], pe_grid=(pe_side, pe_side),
                                       window_size=ws, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                       attn_drop=attn_drop_rate, proj_drop=drop_rate, attn_impl=attn_impl,
                                       fp32_attn=fp32_attn, **({} if kind.name == 'softmax' else attn_options))
                blocks.append(SwinBlock(dim, attn, windowed=kind.windowed, window_size=ws, shift=(j % 2 == 1),
                                        clamp_shift=clamp_shift, mlp_ratio=mlp_ratio, drop=drop_rate,
                                        drop_path=dpr[i][j]))
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


@MODELS.register_module()
class PolaSwin(SwinBackbone):
    """Pola-Swin backbone (PolaFormer, ICLR 2025) for mmdet / mmseg: :class:`SwinBackbone` with
    polarity-aware linear attention (:class:`~mmpola.models.layers.PolaAttention`).

    Registered in mmengine's root ``MODELS`` registry, so ``dict(type='PolaSwin', ...)`` builds
    from mmdet's, mmseg's and any other OpenMMLab library's registry.

    Pola options: ``alpha=4.0``, ``kernel_size=5`` (``v_upsample`` has no effect: no spatial
    reduction in Swin). ``attn_type``: 'L' / 'S' / 'M' per stage (released ``'LLSS'``).
    """
    attn_kind = 'pola'
    default_attn_type = 'LLSS'
    official_name = 'Pola-Swin'


@MODELS.register_module()
class FLattenSwin(SwinBackbone):
    """FLatten-Swin backbone (FLatten Transformer, ICCV 2023) for mmdet / mmseg: :class:`SwinBackbone`
    with focused linear attention (:class:`~mmpola.models.layers.FocusedLinearAttention`).

    FLatten options: ``focusing_factor=3``, ``kernel_size=5``. ``attn_type``: 'L' / 'S' / 'M' per
    stage (released ``'LLSS'``, window 56).
    """
    attn_kind = 'flatten'
    default_attn_type = 'LLSS'
    official_name = 'FLatten-Swin'


@MODELS.register_module()
class InLineSwin(SwinBackbone):
    """InLine-Swin backbone (InLine attention, NeurIPS 2024) for mmdet / mmseg: :class:`SwinBackbone`
    with injective linear attention (:class:`~mmpola.models.layers.InLineAttention`).

    ``attn_type``: 'I' / 'S' / 'M' per stage (released ``'IIIS'``, window 56). No attention options.
    """
    attn_kind = 'inline'
    default_attn_type = 'IIIS'
    official_name = 'InLine-Swin'

    @staticmethod
    def default_softmax_window_size(window_size):
        """The official InLine rule: max(7, window_size // 8) (7 at 56, 12 at 96)."""
        return max(7, window_size // 8)
