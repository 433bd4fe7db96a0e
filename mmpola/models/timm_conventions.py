"""timm's model conventions for mmpola's image classifiers, in one place.

:class:`TimmClassifierMixin` gives a classifier what timm's own model test-suite checks of every
registered model: ``num_features`` / ``head_hidden_size``, ``forward_features`` (unpooled, NHWC)
and ``forward_head(pre_logits=...)``, ``global_pool`` ('avg', the ViT's 'token', or '' for unpooled outputs),
``get_classifier`` / ``reset_classifier``, ``set_grad_checkpointing``, ``forward_intermediates``
index handling and ``prune_intermediate_layers`` (for timm's ``features_only`` wrapper), and an
explicit refusal of TorchScript with the reason.

:func:`timm_pretrained_cfg` builds the entries' ``pretrained_cfg`` dicts and
:func:`refuse_scriptable` is what an entry's builder calls first (timm builds models for
``torch.jit.script`` inside ``timm.layers.set_scriptable(True)``).
"""
import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import is_scriptable, trunc_normal_

from mmpola.errors import MMPolaUserError

from .checks import PolaConfigError

__all__ = ['TimmClassifierMixin', 'NotScriptableError', 'refuse_scriptable', 'timm_pretrained_cfg',
           'check_global_pool', 'GLOBAL_POOL_TYPES']

GLOBAL_POOL_TYPES = ('avg', '')


class NotScriptableError(MMPolaUserError, RuntimeError):
    """``torch.jit.script`` (or ``timm.create_model(..., scriptable=True)``) of a model that cannot be
    scripted; the message gives the reason and what to use instead."""


def refuse_scriptable(model_cls):
    """Raise :class:`NotScriptableError` when timm builds in scriptable mode for a class that is not."""
    if is_scriptable() and not getattr(model_cls, 'scriptable', True):
        raise NotScriptableError(_not_scriptable_message(model_cls))


def _not_scriptable_message(model_cls):
    return (f'{model_cls.__name__} cannot be compiled with torch.jit.script: {model_cls.not_scriptable_reason}. '
            'Use eager mode, torch.compile, torch.export or torch.fx (timm.models.create_feature_extractor) '
            'instead')


def check_global_pool(global_pool, allowed=GLOBAL_POOL_TYPES):
    if global_pool not in allowed:
        meanings = {'avg': "'avg' (average over the final map)", 'token': "'token' (the class token)",
                    '': "'' (no pooling: forward returns the unpooled features)"}
        raise PolaConfigError(f'global_pool={global_pool!r} is not supported; use '
                              + ' or '.join(meanings.get(p, repr(p)) for p in allowed))
    return global_pool


def timm_pretrained_cfg(first_conv, classifier='head', **kwargs):
    """An entry's ``pretrained_cfg``: ImageNet-1k at 224 with the official evaluation transform
    (square resize to 256, bicubic, centre crop 224, ImageNet mean/std) unless overridden.

    ``pool_size`` is the final map at ``input_size`` (stride 32; the ViT: its row of tokens);
    ``min_input_size`` the smallest input the backbones take (32 pixels: four stages down to stride 32).
    """
    cfg = {
        'url': '', 'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': (7, 7),
        'min_input_size': (3, 32, 32), 'crop_pct': 0.875, 'crop_mode': 'squash', 'interpolation': 'bicubic',
        'fixed_input_size': False, 'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD,
        'first_conv': first_conv, 'classifier': classifier,
    }
    cfg.update(kwargs)
    return cfg


class TimmClassifierMixin:
    """timm's classifier API on top of a backbone (put it first in the bases, before the
    ``nn.Module`` / mmengine base).

    A class using it must provide:

    * ``num_classes`` (int), ``num_features`` (int: channels of the final map), ``global_pool``
      (one of ``global_pool_types``, checked with ``check_global_pool``) and ``head`` (made with
      :meth:`_make_head`), set in ``__init__``;
    * ``forward_features(x)`` -> the final map (B, H, W, num_features), NHWC (a ViT: its final tokens as
      one row, (B, 1, L, num_features)), unpooled; every trainable parameter
      must take part in it or in ``head``;
    * ``forward_intermediates(x, indices=None, norm=False, stop_early=False, output_fmt='NCHW',
      intermediates_only=False)`` with timm's meaning (use :meth:`_stage_indices`), returning NCHW
      maps and, unless ``intermediates_only``, the ``forward_features`` map;
    * ``feature_info``: one ``dict(num_chs, reduction, module)`` per stage;
    * ``grad_checkpointing``: a settable bool attribute or property;
    * ``not_scriptable_reason`` (str) if ``torch.jit.script`` cannot compile it (``scriptable =
      False``, the default here); a scriptable class sets ``scriptable = True``;
    * optionally ``_pool(x)``: NHWC map -> (B, num_features) (default: mean over H and W), and
      ``_prune_norm()`` for ``prune_intermediate_layers(prune_norm=True)``.

    Modules that torch.fx cannot trace through (data-dependent padding, shifts, caches) are
    registered with timm's ``register_notrace_module``, functions called with traced values with
    ``torch.fx.wrap``; input checks skip ``torch.fx.Proxy`` inputs.

    Its timm entry (see :mod:`mmpola.models.timm_models`) gives ``pretrained_cfg``
    (:func:`timm_pretrained_cfg`, ``first_conv`` naming the stem conv, ``classifier='head'``),
    calls :func:`refuse_scriptable` and builds through timm's ``build_model_with_cfg`` with
    ``feature_cfg=dict(feature_cls='getter')``.
    """

    output_fmt = 'NHWC'
    global_pool_types = GLOBAL_POOL_TYPES
    scriptable = False
    not_scriptable_reason = 'not declared scriptable'

    @property
    def head_hidden_size(self):
        """Width of ``forward_head(x, pre_logits=True)`` (no hidden layer before the classifier)."""
        return self.num_features

    def _make_head(self, num_classes):
        """``nn.Linear(num_features, num_classes)`` (trunc-normal .02, zero bias), or ``nn.Identity``."""
        if num_classes <= 0:
            return nn.Identity()
        head = nn.Linear(self.num_features, num_classes)
        trunc_normal_(head.weight, std=.02)
        nn.init.constant_(head.bias, 0)
        return head

    def get_classifier(self):
        return self.head

    def reset_classifier(self, num_classes, global_pool=None):
        """New classifier for ``num_classes`` (0: none, ``forward`` returns pooled features); with
        ``global_pool=''`` ``forward`` returns the unpooled NHWC map."""
        if global_pool is not None:
            self.global_pool = check_global_pool(global_pool, self.global_pool_types)
        self.num_classes = num_classes
        reference = next(self.parameters(), None)
        head = self._make_head(num_classes)
        self.head = head if reference is None else head.to(device=reference.device, dtype=reference.dtype)

    def set_grad_checkpointing(self, enable=True):
        """Gradient checkpointing of every block (same outputs, less memory in training)."""
        self.grad_checkpointing = enable

    def _pool(self, x):
        return x.mean(dim=(1, 2))

    def forward_head(self, x, pre_logits=False):
        """Final map (B, H, W, C) -> logits (B, num_classes), or the pooled (B, C) with ``pre_logits``
        (with ``global_pool=''`` no pooling: (B, H, W, C) / (B, H, W, num_classes))."""
        if self.global_pool:
            x = self._pool(x)
        return x if pre_logits else self.head(x)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))

    def _stage_indices(self, indices, num_stages):
        """timm's ``indices``: None (all stages), an int n (the last n) or a sequence of 0-based (or
        negative) stage indices -> sorted list of 0-based indices."""
        if indices is None:
            take = list(range(num_stages))
        elif isinstance(indices, int):
            take = list(range(num_stages - indices, num_stages))
        else:
            take = [i + num_stages if i < 0 else i for i in indices]
        if not take or any(not 0 <= i < num_stages for i in take):
            raise PolaConfigError(f'indices {indices!r} out of range for {num_stages} stages; pass None, '
                                  f'a count 1..{num_stages} or indices in -{num_stages}..{num_stages - 1}')
        return take

    def prune_intermediate_layers(self, indices=1, prune_norm=False, prune_head=True):
        """Drop what a feature extractor does not use (timm's ``features_only`` wrapper calls it):
        the classifier (``prune_head``) and the final norm (``prune_norm``). Stages stay (their
        weights are part of the checkpoints); ``forward_intermediates`` runs only the needed ones
        with ``stop_early``. Returns the 0-based stage indices."""
        take = self._stage_indices(indices, len(self.feature_info))
        if prune_head:
            self.reset_classifier(0, '')
        if prune_norm and hasattr(self, '_prune_norm'):
            self._prune_norm()
        return take

    def __prepare_scriptable__(self):
        """``torch.jit.script`` calls this first: refuse with the reason instead of a compiler trace."""
        if not self.scriptable:
            raise NotScriptableError(_not_scriptable_message(type(self)))
        return self
