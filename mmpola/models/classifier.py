"""ImageNet classifiers: a Pola backbone plus the official classification head (spec §1.9).

``PolaClassifier`` reproduces the official forward exactly and loads official checkpoints
strictly (head and Pola-Swin's final norm included):

* Pola-PVT: mean of the stage-4 tokens **without** a final norm, then ``head``. The official
  model also owns a ``norm`` that its forward never uses (so it never trains); this class has
  none (``norm`` is an ``nn.Identity``) and :func:`checkpoint_filter_fn` drops the official
  ``norm.*`` tensors, so every parameter gets a gradient.
* Pola-Swin: final ``norm`` (LN eps 1e-5), average pool over tokens, ``head``. Softmax blocks use
  the classification shift rule (no shift when the map fits in one window, ``clamp_shift``).

The state dict is ``backbone.*`` (official names below it), ``norm.*`` (Pola-Swin), ``head.*``;
:func:`checkpoint_filter_fn` maps official files to it (timm style). timm's model API comes from
:class:`~mmpola.models.timm_conventions.TimmClassifierMixin`.
"""
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmengine.registry import MODELS

from .pola_pvt import PolaPVT
from .pola_swin import PolaSwin
from .timm_conventions import TimmClassifierMixin, check_global_pool
from .utils import is_pretrained_cfg

__all__ = ['PolaClassifier', 'checkpoint_filter_fn', 'official_kwargs_to_classifier_kwargs']

_FAMILIES = {'pvt': PolaPVT, 'swin': PolaSwin}
_RUNTIME_BUFFERS = ('attn_mask', 'relative_position_index')


@MODELS.register_module()
class PolaClassifier(TimmClassifierMixin, BaseModule):
    """Pola-PVT / Pola-Swin image classifier with the official forward.

    Args:
        family: ``'pvt'`` or ``'swin'``.
        arch: preset name of the backbone (``'tiny'`` ...) or a custom arch dict (see
            :class:`PolaPVT` / :class:`PolaSwin`).
        num_classes: classes of ``head`` (0: no head, ``forward`` returns pooled features).
        global_pool: ``'avg'`` (official) or ``''`` (no pooling: ``forward`` returns the final
            NHWC map, timm's convention).
        drop_rate: dropout inside the backbone (the official models have none before the head).
        drop_path_rate: stochastic depth (official: PVT T/S 0.1, M/L 0.3; Swin T 0.2, S 0.3,
            B 0.5).
        attn_impl: ``'auto'`` or ``'reference'`` (official op order; for bit-exact checks).
        fp32_attn: Pola core in fp32 under autocast.
        with_cp: gradient checkpointing of every block.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH, strict=True)`` loads with
            :meth:`load_checkpoint` (official, mmengine or this class' own files).
        **backbone_kwargs: any other backbone argument (``pretrain_img_size``, ``window_size``,
            ``attn_type``, ``la_sr_ratios``, ``alpha``, ``kernel_size`` ...).

    Shapes: images (B, C, H, W) -> logits (B, num_classes); ``forward_features``: the final
    map (B, H/32, W/32, C) in NHWC (``output_fmt``), as timm's Swin.
    """

    not_scriptable_reason = ('the Pola attention core is a custom autograd Function (optionally '
                             'torch.compile-d), and the stages pass Python (H, W) tuples and build '
                             'module names at run time, which TorchScript does not support')

    def __init__(self, family='pvt', arch='tiny', num_classes=1000, global_pool='avg', drop_rate=0.,
                 drop_path_rate=0.1, attn_impl='auto', fp32_attn=True, with_cp=False, init_cfg=None,
                 **backbone_kwargs):
        super().__init__(init_cfg=init_cfg)
        if family not in _FAMILIES:
            raise ValueError(f'unknown family {family!r}; valid: {", ".join(_FAMILIES)}')
        for key in ('out_indices', 'out_norm', 'norm_after_stage', 'clamp_shift', 'init_cfg',
                    'pretrained'):
            if key in backbone_kwargs:
                raise ValueError(f'{key} is fixed by PolaClassifier (the official classification '
                                 'forward); build the backbone directly to change it')
        self.family = family
        self.num_classes = num_classes
        self.global_pool = check_global_pool(global_pool)
        extra = dict(out_norm=False, clamp_shift=True) if family == 'swin' else {}
        self.backbone = _FAMILIES[family](
            arch=arch, out_indices=(0, 1, 2, 3), drop_rate=drop_rate, drop_path_rate=drop_path_rate,
            attn_impl=attn_impl, fp32_attn=fp32_attn, with_cp=with_cp, **extra, **backbone_kwargs)
        self.num_features = self.backbone.embed_dims[-1]
        # timm's description of the stage maps; ``module``: the stage's blocks (in an fx graph, the
        # node of that name gives the stage's (B, H*W, C) tokens)
        stage_blocks = 'backbone.block{}' if family == 'pvt' else 'backbone.layers.{}.blocks'
        first = 1 if family == 'pvt' else 0
        self.feature_info = [dict(num_chs=c, reduction=4 * 2 ** i, module=stage_blocks.format(first + i))
                             for i, c in enumerate(self.backbone.embed_dims)]
        # the official Pola-PVT's final norm is unused by its forward: not built (see the module doc)
        self.norm = nn.LayerNorm(self.num_features) if family == 'swin' else nn.Identity()
        self.head = self._make_head(num_classes)

    @property
    def grad_checkpointing(self):
        return self.backbone.with_cp

    @grad_checkpointing.setter
    def grad_checkpointing(self, enable):
        self.backbone.with_cp = bool(enable)

    def _prune_norm(self):
        self.norm = nn.Identity()

    @classmethod
    def from_official_kwargs(cls, kwargs, **overrides):
        """Build from the keyword arguments of the official model classes (see
        :func:`official_kwargs_to_classifier_kwargs`)."""
        return cls(**official_kwargs_to_classifier_kwargs(kwargs), **overrides)

    def set_attn_impl(self, impl):
        """Switch every Pola attention between ``'auto'`` and ``'reference'``."""
        self.backbone.set_attn_impl(impl)

    def init_weights(self):
        if is_pretrained_cfg(self.init_cfg):
            self.load_checkpoint(self.init_cfg['checkpoint'], strict=self.init_cfg.get('strict', True))
            self._is_init = True
        else:
            super().init_weights()

    def load_checkpoint(self, checkpoint, strict=True, use_ema=True, map_location='cpu'):
        """Load an official, mmengine or PolaClassifier checkpoint (path, URL or dict).

        Run-time buffers are dropped, positional encodings / bias tables of another pretraining
        grid are resized; with ``strict`` anything else that does not match is an error.
        Returns the ``load_state_dict`` result.
        """
        from mmpola.checkpoint import extract_state_dict, read_checkpoint
        state_dict, _ = extract_state_dict(read_checkpoint(checkpoint, map_location), use_ema)
        state_dict = checkpoint_filter_fn(state_dict, self)
        return self.load_state_dict(state_dict, strict=strict)

    def forward_intermediates(self, x, indices=None, norm=False, stop_early=False,
                              output_fmt='NCHW', intermediates_only=False):
        """Stage maps and final features in one pass (timm's ``forward_intermediates`` API).

        Args:
            x: (B, C, H, W) images.
            indices: stages to return: None (all four), an int n (the last n) or 0-based indices
                (negative ones count from the end).
            norm: pass the stage-4 map through the final ``norm`` (Pola-Swin only; Pola-PVT has
                no final norm).
            stop_early: do not run the stages after the last requested one (only with
                ``intermediates_only``: the final features are then not computed).
            output_fmt: only ``'NCHW'``.
            intermediates_only: return only the list of maps.

        Returns:
            ``(final features (B, h, w, C) as from forward_features, [maps])`` or ``[maps]``; each
            map (B, C_i, H_i, W_i) is the raw stage output before patch merging and before any norm.
        """
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        num_stages = len(self.backbone.embed_dims)
        take = self._stage_indices(indices, num_stages)
        last = max(take) if stop_early else num_stages - 1
        if last != num_stages - 1 and not intermediates_only:
            raise ValueError('stop_early needs intermediates_only=True (the final features come '
                             'from the last stage)')
        stages = self.backbone.forward_stages(x, last)
        maps = []
        for i in take:
            tokens, hw = stages[i]
            if norm and i == num_stages - 1:
                tokens = self.norm(tokens)
            maps.append(_nhwc(tokens, hw).permute(0, 3, 1, 2).contiguous())
        if intermediates_only:
            return maps
        return self._final_features(*stages[-1]), maps

    def _final_features(self, tokens, hw):
        return _nhwc(self.norm(tokens), hw)

    def forward_features(self, x):
        """(B, C, H, W) -> final map (B, h, w, C) (NHWC), through ``norm`` for Pola-Swin."""
        return self._final_features(*self.backbone.forward_stages(x)[-1])

    def _pool(self, x):
        """The official pooling of each family (same op order as the official code)."""
        x = x.flatten(1, 2)
        if self.family == 'pvt':
            return x.mean(dim=1)
        return torch.flatten(F.adaptive_avg_pool1d(x.transpose(1, 2), 1), 1)


def _nhwc(tokens, hw):
    """(B, H*W, C) tokens of an H x W map -> (B, H, W, C), a view."""
    return tokens.reshape(tokens.shape[0], hw[0], hw[1], tokens.shape[-1])


def official_kwargs_to_classifier_kwargs(kwargs):
    """Keyword arguments of the official ``PyramidVisionTransformer`` / ``PolaSwinTransformer``
    -> ``PolaClassifier`` keyword arguments (a custom arch dict).

    Raises for settings the official release never used and this port does not support
    (``ape=True``, ``patch_norm=False``, patch size other than 4).
    """
    kwargs = dict(kwargs)
    if kwargs.pop('patch_size', 4) != 4:
        raise ValueError('only patch_size=4 (every released Pola model) is supported')
    out = dict(num_classes=kwargs.pop('num_classes', 1000),
               drop_rate=kwargs.pop('drop_rate', 0.),
               drop_path_rate=kwargs.pop('drop_path_rate', 0.),
               pretrain_img_size=kwargs.pop('img_size', 224))
    for key in ('qkv_bias', 'qk_scale', 'attn_type', 'alpha', 'kernel_size'):
        if key in kwargs:
            out[key] = kwargs.pop(key)
    if 'attn_drop_rate' in kwargs:
        out['attn_drop_rate'] = kwargs.pop('attn_drop_rate')
    if 'embed_dims' in kwargs:  # Pola-PVT
        out['family'] = 'pvt'
        out['arch'] = dict(embed_dims=list(kwargs.pop('embed_dims')),
                           num_heads=list(kwargs.pop('num_heads')),
                           mlp_ratios=list(kwargs.pop('mlp_ratios')),
                           depths=list(kwargs.pop('depths')))
        for key in ('sr_ratios', 'la_sr_ratios'):
            if key in kwargs:
                out[key] = kwargs.pop(key)
        kwargs.pop('num_stages', None)
    elif 'embed_dim' in kwargs:  # Pola-Swin
        out['family'] = 'swin'
        if kwargs.pop('ape', False):
            raise ValueError('ape=True (absolute position embedding) is not supported; no released '
                             'Pola-Swin uses it')
        if not kwargs.pop('patch_norm', True):
            raise ValueError('patch_norm=False is not supported; every released Pola-Swin uses it')
        out['arch'] = dict(embed_dims=kwargs.pop('embed_dim'), depths=list(kwargs.pop('depths')),
                           num_heads=list(kwargs.pop('num_heads')))
        for key in ('window_size', 'mlp_ratio'):
            if key in kwargs:
                out[key] = kwargs.pop(key)
        kwargs.pop('use_checkpoint', None)
    else:
        raise ValueError('official kwargs need embed_dims (Pola-PVT) or embed_dim (Pola-Swin)')
    kwargs.pop('in_chans', None)
    if kwargs:
        raise ValueError(f'unsupported official arguments: {sorted(kwargs)}')
    return out


def checkpoint_filter_fn(state_dict, model):
    """Official / mmengine / own checkpoint state dict -> ``PolaClassifier`` state dict (timm style).

    Official keys get the ``backbone.`` prefix except ``head.*`` and ``norm.*``; ``module.`` is
    stripped; run-time buffers are dropped, and so is a final ``norm.*`` the model does not have
    (the official Pola-PVT's, which its forward never uses); grids are resized to the model.
    """
    from mmpola.checkpoint import find_key_prefix, resize_state_dict
    model_state = model.state_dict()
    own_prefix, own = find_key_prefix(state_dict, model_state)
    official = OrderedDict()
    for key, value in state_dict.items():
        key = key[len('module.'):] if key.startswith('module.') else key
        top = key.split('.', 1)[0]
        official[key if top in ('head', 'norm') else 'backbone.' + key] = value
    _, n_official = find_key_prefix(official, model_state)
    if own >= n_official:
        state_dict = OrderedDict((k[len(own_prefix):], v) for k, v in state_dict.items()
                                 if k.startswith(own_prefix))
    else:
        state_dict = official
    has_norm = any(k.startswith('norm.') for k in model_state)
    state_dict = OrderedDict((k, v) for k, v in state_dict.items()
                             if not (k.rsplit('.', 1)[-1] in _RUNTIME_BUFFERS and k not in model_state)
                             and not (k.startswith('norm.') and not has_norm))
    state_dict, _ = resize_state_dict(state_dict, model_state)
    return state_dict
