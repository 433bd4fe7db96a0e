"""Pola-PVT: PVT-v1 with polarity-aware linear attention, as a dense-prediction backbone.

Spec: /work/shared/design/pola_spec.md (§1.3 attention, §1.9 model, §3.2 dense forward).
The module tree is the official one (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}.{j}.attn.qg``
...), so official ImageNet checkpoints load by filtering keys (``mmpola.checkpoint``).
"""
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from timm.layers import trunc_normal_

from .layers import (DropPath, Mlp, PatchEmbed, PolaAttention, PVTAttention, _ResizedEmbeddingCache,
                     init_official_weights, to_2tuple_int)
from .utils import (check_frozen_stages, check_input, check_out_indices, check_stage_string,
                    is_pretrained_cfg, pretrained_alias, resolve_arch)

__all__ = ['PolaPVT', 'PolaPVTBlock']

_STRUCTURE_KEYS = ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')


class PolaPVTBlock(nn.Module):
    """Pre-norm PVT block: x + DropPath(Attn(LN(x))), then x + DropPath(MLP(LN(x))); LN eps 1e-6.

    ``attn_type='L'``: :class:`PolaAttention` (``qg`` + ``kv`` layout); ``'S'``: softmax
    :class:`PVTAttention`. Shapes: ``forward(x, hw)``: (B, H*W, C), (H, W) -> (B, H*W, C).
    """

    def __init__(self, dim, num_heads, mlp_ratio, attn_type='L', pe_grid=(7, 7), sr_ratio=1,
                 qkv_bias=True, qk_scale=None, drop=0., attn_drop=0., drop_path=0., alpha=4.0,
                 kernel_size=5, v_upsample='linear1d', attn_impl='auto', fp32_attn=True):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        if attn_type == 'L':
            self.attn = PolaAttention(dim, num_heads, pe_grid, qkv_layout='qg_kv', qkv_bias=qkv_bias,
                                      sr_ratio=sr_ratio, alpha=alpha, kernel_size=kernel_size,
                                      proj_drop=drop, v_upsample=v_upsample, attn_impl=attn_impl,
                                      fp32_attn=fp32_attn)
        elif attn_type == 'S':
            self.attn = PVTAttention(dim, num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                     attn_drop=attn_drop, proj_drop=drop, sr_ratio=sr_ratio)
        else:
            raise ValueError(f"attn_type must be 'L' (Pola) or 'S' (softmax), got {attn_type!r}")
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x, hw):
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


@MODELS.register_module()
class PolaPVT(BaseModule):
    """Pola-PVT backbone (PolaFormer, ICLR 2025) for mmdet / mmseg.

    Registered in mmengine's root ``MODELS`` registry, so ``dict(type='PolaPVT', ...)`` builds
    from mmdet's, mmseg's and any other OpenMMLab library's registry.

    Input (B, in_channels, H, W) with H, W >= 32 (any, odd and non-square included). Output: a
    tuple of NCHW maps, one per ``out_indices`` entry, with channels ``embed_dims[i]`` and sizes
    H_1 = floor(H / 4), H_{i+1} = floor(H_i / 2) (strides 4, 8, 16, 32; conv patch embeddings
    without padding, as the official model and mmdet's PVT). Stage outputs are the raw block
    outputs (no norm), unless ``norm_after_stage``.

    Positional encodings (``pos_embed{i}`` and every block's ``attn.positional_encoding``) are
    stored on the pretraining grid and bilinearly resized to the real stage grid at run time
    (skipped when equal, so a 224 input reproduces the official network bit for bit).

    Args:
        arch: ``'tiny'``, ``'small'``, ``'medium'``, ``'large'`` (see ``arch_settings``) or a dict
            with ``embed_dims``, ``num_heads``, ``mlp_ratios``, ``depths`` (four entries each).
        pretrain_img_size: image size of the pretraining (sets the stored grid of the positional
            encodings: 224 -> 56, 28, 14, 7).
        in_channels: input image channels.
        out_indices: stages (0-based) to return.
        attn_type: one char per stage, ``'L'`` Pola or ``'S'`` softmax (released: ``'LLLL'``).
        la_sr_ratios: spatial reduction of the Pola blocks per stage, as a 4-digit string or a
            sequence (released: ``'1111'``; the official class default '8421' was *not* used).
        sr_ratios: spatial reduction of softmax ('S') blocks per stage.
        alpha: Pola exponent range, p in (1, 1 + alpha).
        kernel_size: kernel of the depthwise conv on v.
        qkv_bias, qk_scale: projections' bias; softmax scale override ('S' blocks only).
        drop_rate, attn_drop_rate, drop_path_rate: dropout after projections and embeddings,
            attention dropout ('S' only), stochastic depth (linear over all blocks).
        norm_after_stage: add a LayerNorm (eps 1e-6) ``norm{i}`` to every returned stage
            (new, dense-only parameters; off like mmdet's PVTv1).
        frozen_stages: -1 none; 0 freezes ``patch_embed1`` and ``pos_embed1``; k >= 1 freezes
            stages 1..k entirely (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}`` and its
            ``norm{i-1}``). Frozen parts stay in eval mode and without gradients through
            ``train()``.
        norm_eval: accepted for API compatibility; a no-op, as the model holds only LayerNorms
            (no running statistics to freeze).
        with_cp: gradient checkpointing of every block (torch.utils.checkpoint).
        v_upsample: how v is upsampled to the query grid when ``la_sr_ratios`` > 1
            (``'linear1d'`` official, ``'bilinear2d'`` deviation; see :class:`PolaAttention`).
        attn_impl, fp32_attn: passed to every :class:`PolaAttention` (``'reference'`` forces the
            official op order).
        pretrained: deprecated alias of ``init_cfg=dict(type='Pretrained', checkpoint=...)``.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL, prefix=None, use_ema=True)``
            loads through :func:`mmpola.checkpoint.load_pola_checkpoint` (official
            ``{'model': ...}`` files, mmengine ``{'state_dict': ...}`` files, bare or prefixed
            state dicts); other init configs go to mmengine.

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
    num_stages = 4
    min_input_size = 32
    # for the loader's messages
    official_name = 'Pola-PVT'
    official_key_pattern = 'block1.*'

    def __init__(self, arch='tiny', pretrain_img_size=224, in_channels=3, out_indices=(0, 1, 2, 3),
                 attn_type='LLLL', la_sr_ratios='1111', sr_ratios=(8, 4, 2, 1), alpha=4.0,
                 kernel_size=5, qkv_bias=True, qk_scale=None, drop_rate=0., attn_drop_rate=0.,
                 drop_path_rate=0.1, norm_after_stage=False, frozen_stages=-1, norm_eval=False,
                 with_cp=False, v_upsample='linear1d', attn_impl='auto', fp32_attn=True,
                 pretrained=None, init_cfg=None):
        init_cfg = pretrained_alias(pretrained, init_cfg)
        super().__init__(init_cfg=init_cfg)
        settings = resolve_arch(arch, self.arch_settings, _STRUCTURE_KEYS, type(self).__name__)
        self.embed_dims = list(settings['embed_dims'])
        self.depths = list(settings['depths'])
        self.num_heads = list(settings['num_heads'])
        self.mlp_ratios = list(settings['mlp_ratios'])
        for key in _STRUCTURE_KEYS:
            if len(settings[key]) != self.num_stages:
                raise ValueError(f'arch {key} must have {self.num_stages} entries, got {settings[key]!r}')
        self.out_indices = check_out_indices(out_indices, self.num_stages, type(self).__name__)
        self.frozen_stages = check_frozen_stages(frozen_stages, self.num_stages, type(self).__name__)
        self.attn_type = check_stage_string(attn_type, 'LS', self.num_stages, 'attn_type')
        self.la_sr_ratios = [int(c) for c in check_stage_string(
            ''.join(str(int(r)) for r in la_sr_ratios) if not isinstance(la_sr_ratios, str)
            else la_sr_ratios, '123456789', self.num_stages, 'la_sr_ratios')]
        self.sr_ratios = list(sr_ratios)
        self.norm_eval = norm_eval  # no-op: LayerNorm only
        self.with_cp = with_cp
        self.norm_after_stage = norm_after_stage
        self.in_channels = in_channels
        self.pretrain_img_size = to_2tuple_int(pretrain_img_size, 'pretrain_img_size')
        if self.pretrain_img_size[0] != self.pretrain_img_size[1]:
            raise ValueError('pretrain_img_size must be square (official models are), got '
                             f'{self.pretrain_img_size}')

        # official grids: stage 1 img // 4, stage i > 1 (img // 2 ** i) // 2
        img = self.pretrain_img_size[0]
        grids = [img // 4] + [(img // 2 ** (i + 1)) // 2 for i in range(1, self.num_stages)]
        self.pos_embed_grids = [(g, g) for g in grids]

        total = sum(self.depths)
        dpr = torch.linspace(0, drop_path_rate, total, device='cpu').tolist() if total > 1 else [0.0] * total
        cur = 0
        for i in range(self.num_stages):
            dim = self.embed_dims[i]
            patch_embed = PatchEmbed(in_channels if i == 0 else self.embed_dims[i - 1], dim,
                                     patch_size=4 if i == 0 else 2, pad=False)
            pos_embed = nn.Parameter(torch.zeros(1, grids[i] * grids[i], dim))
            stage_type = self.attn_type[i]
            sr = self.sr_ratios[i] if stage_type == 'S' else self.la_sr_ratios[i]
            pe_side = grids[i] // sr
            blocks = nn.ModuleList([
                PolaPVTBlock(dim, self.num_heads[i], self.mlp_ratios[i], attn_type=stage_type,
                             pe_grid=(pe_side, pe_side), sr_ratio=sr, qkv_bias=qkv_bias,
                             qk_scale=qk_scale, drop=drop_rate, attn_drop=attn_drop_rate,
                             drop_path=dpr[cur + j], alpha=alpha, kernel_size=kernel_size,
                             v_upsample=v_upsample, attn_impl=attn_impl, fp32_attn=fp32_attn)
                for j in range(self.depths[i])])
            cur += self.depths[i]
            setattr(self, f'patch_embed{i + 1}', patch_embed)
            setattr(self, f'pos_embed{i + 1}', pos_embed)
            setattr(self, f'pos_drop{i + 1}', nn.Dropout(p=drop_rate))
            setattr(self, f'block{i + 1}', blocks)
            setattr(self, f'_pos_embed_cache{i + 1}', _ResizedEmbeddingCache())
        if norm_after_stage:
            for i in self.out_indices:
                setattr(self, f'norm{i}', nn.LayerNorm(self.embed_dims[i], eps=1e-6))

        for i in range(self.num_stages):
            trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=.02)
        self.apply(init_official_weights)
        self._freeze_stages()

    @property
    def out_channels(self):
        """Channels of the returned maps, in ``out_indices`` order (for necks' in_channels)."""
        return [self.embed_dims[i] for i in self.out_indices]

    def init_weights(self):
        """Load ``init_cfg`` type 'Pretrained' with mmpola's loader; other configs go to mmengine."""
        if is_pretrained_cfg(self.init_cfg):
            from mmpola.checkpoint import load_pola_checkpoint
            cfg = dict(self.init_cfg)
            load_pola_checkpoint(self, cfg['checkpoint'], prefix=cfg.get('prefix'),
                                 use_ema=cfg.get('use_ema', True),
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

    def _stage_modules(self, i):
        """Modules and parameters of 0-based stage i, for freezing."""
        modules = [getattr(self, f'patch_embed{i + 1}'), getattr(self, f'block{i + 1}')]
        if hasattr(self, f'norm{i}'):
            modules.append(getattr(self, f'norm{i}'))
        return modules, [getattr(self, f'pos_embed{i + 1}')]

    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        modules, params = [self.patch_embed1], [self.pos_embed1]
        for i in range(self.frozen_stages):
            m, p = self._stage_modules(i)
            modules += m
            params += p
        for module in modules:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False
        for param in params:
            param.requires_grad = False

    def train(self, mode=True):
        """Set train/eval mode, keeping frozen stages frozen (``norm_eval`` has nothing to do)."""
        super().train(mode)
        self._freeze_stages()
        return self

    def _pos_embed(self, i, hw):
        cache = getattr(self, f'_pos_embed_cache{i + 1}')
        return cache.get(getattr(self, f'pos_embed{i + 1}'), self.pos_embed_grids[i], hw, 'bilinear',
                         enabled=not self.training)

    def forward_stages(self, x, last_stage=None):
        """Run the stages 0..last_stage.

        Args:
            x: (B, in_channels, H, W) images.
            last_stage: last 0-based stage to run (default: the last one).

        Returns:
            list of (tokens (B, H_i*W_i, C_i), (H_i, W_i)), the raw block outputs of every stage.
        """
        check_input(x, self.in_channels, self.min_input_size, type(self).__name__)
        last_stage = self.num_stages - 1 if last_stage is None else last_stage
        B = x.shape[0]
        outs = []
        for i in range(last_stage + 1):
            x, hw = getattr(self, f'patch_embed{i + 1}')(x)
            x = getattr(self, f'pos_drop{i + 1}')(x + self._pos_embed(i, hw))
            for block in getattr(self, f'block{i + 1}'):
                if self.with_cp and torch.is_grad_enabled() and x.requires_grad:
                    x = cp.checkpoint(block, x, hw, use_reentrant=False)
                else:
                    x = block(x, hw)
            outs.append((x, hw))
            if i < last_stage:
                x = x.reshape(B, hw[0], hw[1], -1).permute(0, 3, 1, 2).contiguous()
        return outs

    def forward(self, x):
        """(B, C_in, H, W) -> tuple of (B, C_i, H_i, W_i) for i in ``out_indices``."""
        stages = self.forward_stages(x, max(self.out_indices))
        outs = []
        for i in self.out_indices:
            tokens, (H, W) = stages[i]
            if self.norm_after_stage:
                tokens = getattr(self, f'norm{i}')(tokens)
            outs.append(tokens.reshape(tokens.shape[0], H, W, -1).permute(0, 3, 1, 2).contiguous())
        return tuple(outs)
