"""The ImageNet classifier of every architecture: a dense backbone plus the official classification
head of its release, with timm's model API.

:class:`PolaClassifier` reproduces the official forward of every released model and loads official
checkpoints strictly. What differs between the releases (the modules after the last stage, the
pooling, the head) belongs to the architecture (``classification_*`` of
:class:`~mmpola.models.backbones.DenseBackbone`): PVT has no final norm and a linear head, Swin a
final LayerNorm, PolaFormer++ a 1x1 projection with BatchNorm and swish and a 1x1 conv head.

The state dict is ``backbone.*`` (official names below it) and the architecture's classification
modules (``norm.*`` / ``head.*``; PolaFormer++ ``proj.*`` / ``norm.*`` / ``head.*``);
:func:`checkpoint_filter_fn` maps official files to it (timm style). timm's model API comes from
:class:`~mmpola.models.timm_conventions.TimmClassifierMixin`.
"""
from collections import OrderedDict

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from mmpola.checkpoint import (
    check_finite,
    checkpoint_source,
    extract_state_dict,
    find_key_prefix,
    read_checkpoint,
    resize_state_dict,
)
from mmpola.registry import ARCHITECTURES, ATTENTIONS, MODELS

from .attention import attention_letter, attention_options
from .backbones import PRESETS, backbone_class
from .timm_conventions import TimmClassifierMixin, check_global_pool
from .utils import PolaConfigError, is_pretrained_cfg

__all__ = ['PolaClassifier', 'PolaPPClassifier', 'checkpoint_filter_fn', 'official_kwargs_to_classifier_kwargs',
           'accept_official_checkpoints', 'check_classifier_state_dict', 'PARTIAL_OPTION']

# how the classifier's loaders load a file of other blocks on purpose (their messages say it)
PARTIAL_OPTION = ("strict=False (model.load_checkpoint(..., strict=False), init_cfg=dict(type='Pretrained', "
                  'checkpoint=..., strict=False), model.load_state_dict(..., strict=False); timm: '
                  'create_model(..., pretrained_cfg_overlay=dict(file=...), pretrained_strict=False))')

# backbone arguments the official classification forward fixes (besides the architecture's own)
_FIXED = ('out_indices', 'out_norm', 'init_cfg')


@MODELS.register_module()
class PolaClassifier(TimmClassifierMixin, BaseModule):
    """Image classifier of any architecture and attention kind with the official forward.

    Args:
        family: the architecture, ``'pvt'``, ``'pvt_v2'``, ``'swin'``, ``'cswin'``, ``'vit'``, ``'polapp'``
            (mmpola.registry.ARCHITECTURES).
        arch: preset name of the backbone (``'tiny'`` ...) or a custom arch dict (see the
            architecture). None: the architecture's default.
        num_classes: classes of ``head`` (0: no head, ``forward`` returns pooled features).
        global_pool: ``'avg'`` (official; the ViT: ``'token'``, the class token, official, or
            ``'avg'``) or ``''`` (no pooling: ``forward`` returns the final NHWC map, the ViT its final
            tokens as one row of it, timm's convention). None: the official pooling.
        drop_rate: dropout inside the backbone (the official models have none before the head).
        drop_path_rate: stochastic depth (official: PVT T/S 0.1, M/L 0.3; Swin T 0.2, S 0.3,
            B 0.5; PolaFormer++ b0-b2 0.1, b3 0.15, b4 0.4, b5 0.55).
        attn_impl: ``'auto'``, ``'reference'`` (official op order; for bit-exact checks) or another
            registered implementation.
        fp32_attn: attention ops in fp32 under autocast.
        with_cp: gradient checkpointing of every block.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH, strict=True, use_ema=True)`` loads with
            :meth:`load_checkpoint` (official, mmengine or this class' own files).
        kind: the attention kind (``'pola'``, ``'flatten'``, ``'inline'``, ``'pacs'`` ...); the
            backbone is the released preset of this architecture and kind when there is one
            (``PolaSwin`` ...), else the architecture. None: the architecture's first preset.
        attn: the kind's options, ``dict(alpha=4.0)`` (or ``dict(type=..., ...)``, then ``kind``
            may be left out).
        **backbone_kwargs: any other backbone argument (``pretrain_img_size``, ``window_size``,
            ``attn_type``, ``la_sr_ratios`` ...) or argument of the architecture's head
            (PolaFormer++: ``projection``, the width of its classification projection).

    Shapes: images (B, C, H, W) -> logits (B, num_classes); ``forward_features``: the final
    map (B, H/32, W/32, num_features) in NHWC (``output_fmt``), as timm's Swin; the ViT's final
    tokens as one row, (B, 1, 1 + h*w, num_features), class token first (see
    :meth:`~mmpola.models.backbones.vit.ViTBackbone.classification_features`).
    """

    not_scriptable_reason = ('the attention cores are custom autograd Functions (optionally torch.compile-d) '
                             'and the stages build their positional encodings, windows and rotary tables from '
                             'the run-time map size, which TorchScript does not support')

    def __init__(self, family='pvt', arch=None, num_classes=1000, global_pool=None, drop_rate=0.,
                 drop_path_rate=0.1, attn_impl='auto', fp32_attn=True, with_cp=False, init_cfg=None, kind=None,
                 attn=None, **backbone_kwargs):
        super().__init__(init_cfg=init_cfg)
        architecture = ARCHITECTURES.get(family) if isinstance(family, str) else None
        if architecture is None:
            raise PolaConfigError(f'unknown family {family!r}; valid: {", ".join(ARCHITECTURES.module_dict)}')
        for key in _FIXED + tuple(architecture.classification_kwargs):
            if key in backbone_kwargs:
                raise PolaConfigError(f'{key} is fixed by {type(self).__name__} (the official classification '
                                      'forward); build the backbone directly to change it')
        head_args = {k: backbone_kwargs.pop(k) for k in architecture.classification_args if k in backbone_kwargs}
        attn = dict(attn or {})
        if kind is not None and attn.get('type', kind) != kind:
            raise PolaConfigError(f"kind={kind!r} and attn=dict(type={attn['type']!r}) disagree; pass one")
        kind = kind or attn.pop('type', None)
        cls = backbone_class(family, kind)
        if arch is not None:
            backbone_kwargs['arch'] = arch
        self.backbone = cls(out_indices=None, drop_rate=drop_rate, drop_path_rate=drop_path_rate,
                            attn_impl=attn_impl, fp32_attn=fp32_attn, with_cp=with_cp,
                            attn=dict(attn, type=kind) if kind else (attn or None),
                            **architecture.classification_kwargs, **backbone_kwargs)
        self.family = family
        self.kind = self.backbone.attn_kind
        self.num_classes = num_classes
        self.global_pool_types = architecture.classification_global_pools
        self.global_pool = check_global_pool(self.global_pool_types[0] if global_pool is None else global_pool,
                                             self.global_pool_types)
        neck, self.num_features = self.backbone.classification_neck(**head_args)
        self._neck_names = tuple(neck)
        for name, module in neck.items():
            self.add_module(name, module)
        # timm's description of the stage maps; ``module``: the stage's blocks (in an fx graph, the
        # node of that name gives the stage's tokens, or maps for architectures whose blocks work on maps)
        self.feature_info = self.backbone.feature_info(prefix='backbone.')
        self.head = self._make_head(num_classes)

    # ---------------------------------------------------------------------------------------------
    # timm's API (TimmClassifierMixin) over the architecture's head

    def _make_head(self, num_classes):
        return self.backbone.classification_head(self.num_features, num_classes)

    @property
    def grad_checkpointing(self):
        return self.backbone.with_cp

    @grad_checkpointing.setter
    def grad_checkpointing(self, enable):
        self.backbone.with_cp = bool(enable)

    def _prune_norm(self):
        """``prune_intermediate_layers(prune_norm=True)``: the modules between the last stage and the pool."""
        for name in self._neck_names:
            setattr(self, name, nn.Identity())

    def set_attn_impl(self, impl):
        """Switch every attention op between ``'auto'``, ``'fast'``, ``'reference'`` or another
        registered implementation."""
        self.backbone.set_attn_impl(impl)

    def forward_features(self, x):
        """(B, C, H, W) -> final map (B, h, w, num_features) (NHWC), through the architecture's neck."""
        return self.backbone.classification_features(self, self.backbone.forward_stages(x)[-1])

    def forward_head(self, x, pre_logits=False):
        """Final map (B, h, w, F) (the ViT: its tokens, (B, 1, L, F)) -> logits (B, num_classes), or the pooled
        (B, F) with ``pre_logits`` (with ``global_pool=''`` no pooling: (B, h, w, F) / (B, h, w, num_classes))."""
        pooled = self.global_pool != ''
        if pooled:
            x = self.backbone.classification_pool(x, self.global_pool)
        return x if pre_logits else self.backbone.classification_logits(self.head, x, pooled)

    def forward_intermediates(self, x, indices=None, norm=False, stop_early=False, output_fmt='NCHW',
                              intermediates_only=False):
        """Stage maps and final features in one pass (timm's ``forward_intermediates`` API).

        Args:
            x: (B, C, H, W) images.
            indices: stages to return: None (all four), an int n (the last n) or 0-based indices
                (negative ones count from the end).
            norm: pass the last stage map through the final norm (Swin; the other architectures have
                no per-stage norm to apply).
            stop_early: do not run the stages after the last requested one (only with
                ``intermediates_only``: the final features are then not computed).
            output_fmt: only ``'NCHW'``.
            intermediates_only: return only the list of maps.

        Returns:
            ``(final features (B, h, w, F) as from forward_features, [maps])`` or ``[maps]``; each
            map (B, C_i, H_i, W_i) is the raw stage output before patch merging and before any norm.
        """
        if output_fmt != 'NCHW':
            raise PolaConfigError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        num_stages = len(self.backbone.embed_dims)
        take = self._stage_indices(indices, num_stages)
        last = max(take) if stop_early else num_stages - 1
        if last != num_stages - 1 and not intermediates_only:
            raise PolaConfigError('stop_early needs intermediates_only=True (the final features come from the '
                                  'last stage)')
        stages = self.backbone.forward_stages(x, last)
        final_norm = self.backbone.classification_stage_norm(self) if norm else None
        maps = [self.backbone.stage_map(stages[i], final_norm if i == num_stages - 1 else None) for i in take]
        if intermediates_only:
            return maps
        return self.backbone.classification_features(self, stages[-1]), maps

    # ---------------------------------------------------------------------------------------------
    # weights

    def init_weights(self):
        if is_pretrained_cfg(self.init_cfg):
            self.load_checkpoint(self.init_cfg['checkpoint'], strict=self.init_cfg.get('strict', True),
                                 use_ema=self.init_cfg.get('use_ema', True))
            self._is_init = True
        else:
            super().init_weights()

    def load_checkpoint(self, checkpoint, strict=True, use_ema=True, map_location='cpu'):
        """Load an official, mmengine or own checkpoint (path, URL or dict; EMA weights first with
        ``use_ema``): mapped by :func:`checkpoint_filter_fn` (run-time buffers dropped, grids of another
        pretraining size resized), refused when it is not this architecture's and kind's, when it holds
        other blocks (another depth or per-stage layout; ``strict=False`` loads the blocks both have)
        or non-finite weights, then ``load_state_dict(strict)``. Returns the ``load_state_dict`` result."""
        source = checkpoint_source(checkpoint)
        state_dict, _ = extract_state_dict(read_checkpoint(checkpoint, map_location), use_ema)
        state_dict = checkpoint_filter_fn(state_dict, self, source)
        check_classifier_state_dict(self, state_dict, source, layout=strict)
        return super().load_state_dict(state_dict, strict=strict)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """torch's ``load_state_dict`` of official, mmengine or own state dicts (mapped by the
        pre-hook of :func:`accept_official_checkpoints`), refused with one message when they hold
        non-finite weights or (``strict``) other blocks than the model (a deeper or shallower model of
        the same widths would otherwise fail with torch's list of keys)."""
        tensors = _opened_tensors(state_dict)
        check_classifier_state_dict(self, checkpoint_filter_fn(tensors, self), 'the given state dict', layout=strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


@MODELS.register_module()
class PolaPPClassifier(PolaClassifier):
    """The PolaFormer++ classifier: :class:`PolaClassifier` with ``family='polapp'`` (default arch
    ``'b2'``): backbone, 1x1 projection ``proj`` (``projection`` channels; the preset's released
    width by default), BatchNorm ``norm``, swish, average pool, 1x1 conv ``head``."""

    def __init__(self, arch='b2', family='polapp', **kwargs):
        if family != 'polapp':
            raise PolaConfigError(f"PolaPPClassifier is the PolaFormer++ classifier (family='polapp'), got "
                                  f"family={family!r}; use PolaClassifier(family={family!r})")
        super().__init__(family=family, arch=arch, **kwargs)


def checkpoint_filter_fn(state_dict, model, source='the checkpoint'):
    """Official / mmengine / own checkpoint state dict -> :class:`PolaClassifier` state dict (timm style).

    Official keys get the ``backbone.`` prefix except the architecture's classification modules;
    ``module.`` is stripped; the backbone part goes through the architecture's filter
    (``checkpoint_filter``: run-time buffers ...), classification modules the model does not have are
    dropped (the official PVT's unused final norm), and grids are resized to the model.
    """
    model_state = model.state_dict()
    own_prefix, own = find_key_prefix(state_dict, model_state)
    classification_modules = tuple(model.backbone.classification_modules)
    official = OrderedDict()
    for key, value in state_dict.items():
        key = key[len('module.'):] if key.startswith('module.') else key
        top = key.split('.', 1)[0]
        official[key if top in classification_modules else 'backbone.' + key] = value
    _, n_official = find_key_prefix(official, model_state)
    if own >= n_official:
        state_dict = OrderedDict((k[len(own_prefix):], v) for k, v in state_dict.items() if k.startswith(own_prefix))
    else:
        state_dict = official
    backbone, _ = model.backbone.checkpoint_filter(
        OrderedDict((k[len('backbone.'):], v) for k, v in state_dict.items() if k.startswith('backbone.')), source)
    out = OrderedDict(('backbone.' + k, v) for k, v in backbone.items())
    out.update((k, v) for k, v in state_dict.items() if not k.startswith('backbone.')
               and (k in model_state or k.split('.', 1)[0] not in classification_modules))
    return resize_state_dict(out, model_state)[0]


def check_classifier_state_dict(model, state_dict, source, layout=True):
    """Refuse a classifier state dict (already mapped, :func:`checkpoint_filter_fn`) from ``source``
    that is not for ``model``: another architecture or attention kind, with ``layout`` other blocks
    (:meth:`mmpola.checkpoint.KeySignature.check_layout`), or non-finite weights (always)."""
    backbone = OrderedDict((k[len('backbone.'):], v) for k, v in state_dict.items() if k.startswith('backbone.'))
    model.backbone.checkpoint_signature().check(backbone, source, layout=layout, partial_option=PARTIAL_OPTION)
    model_state = model.state_dict()
    check_finite({k: v for k, v in state_dict.items() if k in model_state}, source)


def timm_filter_fn(state_dict, model, layout=True):
    """timm's ``pretrained_filter_fn`` of the entries: :func:`checkpoint_filter_fn`, then the checks of
    :func:`check_classifier_state_dict` (timm loads without ``strict`` when it resets the head, so the
    file's blocks are compared here; ``layout=False`` with ``pretrained_strict=False``)."""
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    source = next((repr(cfg[k]) for k in ('file', 'url', 'hf_hub_id') if cfg.get(k)), 'the pretrained weights')
    out = checkpoint_filter_fn(state_dict, model, source)
    check_classifier_state_dict(model, out, source, layout=layout)
    return out


def official_kwargs_to_classifier_kwargs(kwargs, family=None):
    """Keyword arguments of an official model class -> :class:`PolaClassifier` keyword arguments.

    Each architecture reads its own official arguments (``classifier_kwargs_from_official``; only
    ``family``'s when given: the official PVT-v1 and PVTv2 classes take the same arguments, so
    without it they are read as PVT-v1's); the
    attention kind is the registered kind with the letter of the official ``attn_type`` whose
    options cover the remaining arguments (``alpha``, ``focusing_factor`` ...), the architecture's
    released kind first. Settings the official releases never used and this port does not support
    (``ape=True``, ``patch_norm=False``, a patch size other than 4) and unknown arguments are errors.
    """
    unsupported = None
    architectures = ARCHITECTURES.module_dict
    if family is not None:
        if family not in architectures:
            raise PolaConfigError(f'unknown family {family!r}; valid: {", ".join(architectures)}')
        architectures = {family: architectures[family]}
    for family, architecture in architectures.items():
        parsed = architecture.classifier_kwargs_from_official(kwargs)
        if parsed is None:
            continue
        out, rest, attn_type = parsed
        kind = _official_kind(family, architecture, attn_type, set(rest))
        options = {k: rest.pop(k) for k in list(rest) if kind and k in attention_options(kind)}
        if rest:
            unsupported = unsupported or rest
            continue
        out['kind'] = kind
        if attn_type is not None:
            out['attn_type'] = attn_type
        if options:
            out['attn'] = dict(type=kind, **options)
        return out
    if unsupported:
        raise PolaConfigError(f'unsupported official arguments: {sorted(unsupported)}')
    raise PolaConfigError('official kwargs of no known architecture: PVT / PVTv2 need embed_dims, Swin embed_dim '
                          'and depths, CSWin embed_dim and split_size, the ViT embed_dim and an int depth, '
                          'PolaFormer++ projection / layerscales')


def _official_kind(family, architecture, attn_type, names):
    """The kind of an official model: the letter of its attn_type (none: the architecture's released
    kinds first, the official InLine-DeiT takes no attn_type), options covering ``names``."""
    letters = {c for c in (attn_type or '') if c.isalpha() and c not in 'SM'} or None
    kinds = [p.attn for p in PRESETS if p.family == family] + list(ATTENTIONS.module_dict)
    for kind in dict.fromkeys(kinds):
        options = set(attention_options(kind, architecture.attention_context))
        if (letters is None or attention_letter(kind) in letters) and names & _all_options() <= options:
            return kind
    return None


def _all_options():
    return {name for kind in ATTENTIONS.module_dict for name in attention_options(kind)}


def _opened_tensors(state_dict):
    """The tensors of a state dict, or of an unopened checkpoint container holding one ('state_dict'
    or 'model')."""
    tensors = state_dict
    for key in ('state_dict', 'model'):
        if isinstance(state_dict.get(key), dict):
            tensors = state_dict[key]
            break
    return OrderedDict((k, v) for k, v in tensors.items() if torch.is_tensor(v))


def _official_state_dict_pre_hook(module, state_dict, prefix, *args):
    """Map an official (or mmengine-wrapped) state dict onto the classifier's keys, in place.

    Runs only for the top-level module (``prefix == ''``), before torch matches keys, so
    ``model.load_state_dict(official_state_dict)``, timm's ``checkpoint_path=`` loading and
    mmengine's ``load_from`` / ``tools/test.py CHECKPOINT`` (which hand over the whole official
    ``{'model': ..., 'config': ...}`` container when there is no ``state_dict`` key) all work.
    Own state dicts pass through unchanged (apart from dropping stale run-time buffers).
    """
    if prefix:
        return
    converted = checkpoint_filter_fn(_opened_tensors(state_dict), module)
    state_dict.clear()
    state_dict.update(converted)


def accept_official_checkpoints(model):
    """Let ``model.load_state_dict`` take official state dicts (returns ``model``).

    The hook is a module-level function bound through torch's weak module reference, so
    ``copy.deepcopy`` (EMA copies) and pickling keep working.
    """
    model.register_load_state_dict_pre_hook(_official_state_dict_pre_hook)
    return model
