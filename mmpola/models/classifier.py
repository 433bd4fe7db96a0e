"""The ImageNet classifier of every architecture and attention kind: a dense backbone plus the official
classification head of its release, with timm's model API.

:class:`ImageClassifier` reproduces the official forward of every released model (Pola, FLatten, InLine,
PolaFormer++ and the softmax layouts) and loads official checkpoints strictly. What differs between the
releases (the modules after the last stage, the pooling, the head) is the architecture's head
(:class:`~mmpola.models.classification_head.ClassificationHead`, beside each architecture in its
module): PVT has no final norm and a linear head, Swin a final LayerNorm, PolaFormer++ a 1x1 projection
with BatchNorm and swish and a 1x1 conv head.

The state dict is ``backbone.*`` (official names below it) and the head's modules (``norm.*`` /
``head.*``; PolaFormer++ ``proj.*`` / ``norm.*`` / ``head.*``). Official, mmengine and own files load
through :func:`mmpola.checkpoint.load_checkpoint`, the one loading path of the backbones, the
classifier and the timm entries (:meth:`ImageClassifier.checkpoint_filter` maps official keys onto the
classifier's); timm's model API comes from :class:`~mmpola.models.timm_conventions.TimmClassifierMixin`.
"""
import re
from collections import OrderedDict

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from mmpola.checkpoint import checkpoint_source, find_key_prefix, load_checkpoint, prepare_state_dict, resize_state_dict
from mmpola.registry import ARCHITECTURES, ATTENTIONS, MODELS

from .attention import attention_letter, attention_options
from .backbones import PRESETS, backbone_class
from .checks import PolaConfigError, is_pretrained_cfg
from .classification_head import classification_head_of
from .timm_conventions import TimmClassifierMixin, check_global_pool

__all__ = ['ImageClassifier', 'official_kwargs_to_classifier_kwargs', 'timm_filter_fn', 'PARTIAL_OPTION']

# how the classifier's loaders load a file of other blocks on purpose (their messages say it)
PARTIAL_OPTION = ("strict=False (model.load_checkpoint(..., strict=False), init_cfg=dict(type='Pretrained', "
                  'checkpoint=..., strict=False), model.load_state_dict(..., strict=False); timm: '
                  'create_model(..., pretrained_cfg_overlay=dict(file=...), pretrained_strict=False))')

# backbone arguments the official classification forward fixes (besides the head's own)
_FIXED = ('out_indices', 'out_norm', 'init_cfg')


@MODELS.register_module()
class ImageClassifier(TimmClassifierMixin, BaseModule):
    """Image classifier of any architecture and attention kind with the official forward: the backbone
    and its architecture's official head.

    Args:
        family: the architecture, ``'pvt'``, ``'pvt_v2'``, ``'swin'``, ``'cswin'``, ``'vit'``, ``'polapp'``
            (mmpola.registry.ARCHITECTURES).
        arch: preset name of the backbone (``'tiny'`` ...) or a custom arch dict (see the
            architecture). None: the architecture's default (PolaFormer++: ``'b2'``).
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
    :meth:`~mmpola.models.backbones.vit.ViTHead.features`).

    ``load_state_dict`` takes official state dicts as well (a pre-hook maps their keys), so
    ``model.load_state_dict(official)``, timm's ``checkpoint_path=`` and mmengine's ``load_from`` work.
    """

    not_scriptable_reason = ('the attention cores are custom autograd Functions (optionally torch.compile-d) '
                             'and the stages build their positional encodings, windows and rotary tables from '
                             'the run-time map size, which TorchScript does not support')
    # mmpola.checkpoint's loading: the file's backbone part is compared with the backbone's signature,
    # and its messages offer the classifier's ways of loading other blocks on purpose
    checkpoint_signature_prefix = 'backbone.'
    partial_load_option = PARTIAL_OPTION

    def __init__(self, family='pvt', arch=None, num_classes=1000, global_pool=None, drop_rate=0.,
                 drop_path_rate=0.1, attn_impl='auto', fp32_attn=True, with_cp=False, init_cfg=None, kind=None,
                 attn=None, **backbone_kwargs):
        super().__init__(init_cfg=init_cfg)
        architecture = ARCHITECTURES.get(family) if isinstance(family, str) else None
        if architecture is None:
            raise PolaConfigError(f'unknown family {family!r}; valid: {", ".join(ARCHITECTURES.module_dict)}')
        head_settings = classification_head_of(family)
        for key in _FIXED + tuple(head_settings.backbone_kwargs):
            if key in backbone_kwargs:
                raise PolaConfigError(f'{key} is fixed by {type(self).__name__} (the official classification '
                                      'forward); build the backbone directly to change it')
        head_args = {k: backbone_kwargs.pop(k) for k in head_settings.args if k in backbone_kwargs}
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
                            **head_settings.backbone_kwargs, **backbone_kwargs)
        self.family = family
        self.kind = self.backbone.attn_kind
        self.head_settings = head_settings
        self.num_classes = num_classes
        self.global_pool_types = head_settings.global_pools
        self.global_pool = check_global_pool(self.global_pool_types[0] if global_pool is None else global_pool,
                                             self.global_pool_types)
        neck, self.num_features = head_settings.neck(self.backbone, **head_args)
        self._neck_names = tuple(neck)
        for name, module in neck.items():
            self.add_module(name, module)
        # timm's description of the stage maps; ``module``: the stage's blocks (in an fx graph, the
        # node of that name gives the stage's tokens, or maps for architectures whose blocks work on maps)
        self.feature_info = self.backbone.feature_info(prefix='backbone.')
        self.head = self._make_head(num_classes)
        # official (or mmengine-wrapped) state dicts map onto the classifier's keys before torch matches
        # them; a module-level function bound through torch's weak module reference, so copy.deepcopy
        # (EMA copies) and pickling keep working
        self.register_load_state_dict_pre_hook(_official_state_dict_pre_hook)

    # ---------------------------------------------------------------------------------------------
    # timm's API (TimmClassifierMixin) over the architecture's head

    def _make_head(self, num_classes):
        return self.head_settings.build_head(self.backbone, self.num_features, num_classes)

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

    def no_weight_decay(self):
        """timm's names of the parameters to leave undecayed besides the 1-D ones (``timm.optim.create_optimizer_v2``
        reads it): those the official ImageNet training leaves undecayed, the names that hold one of the backbone's
        ``no_weight_decay_keys`` (the recipes' ``custom_keys`` with ``decay_mult=0``)."""
        keys = self.backbone.no_weight_decay_keys
        return {name for name, _ in self.named_parameters() if any(key in name for key in keys)}

    def group_matcher(self, coarse=False):
        """timm's grouping of the parameters by depth (layer-wise lr decay: ``create_optimizer_v2(...,
        layer_decay=...)``): the stem, then each block in the order they run (``coarse``: each stage), with the
        modules after the last stage (the final norm) in the last block's group; the classifier comes last.
        Each group is a pattern of its parameters' names
        (:meth:`~mmpola.models.backbones.DenseBackbone.depth_groups`) and of the modules whose own parameters
        all lie in it (timm's ``group_modules``)."""
        groups = self.backbone.depth_groups(coarse, prefix='backbone.')
        groups[-1] = groups[-1] + [name for name, _ in self.named_parameters()
                                   if name.split('.', 1)[0] in self._neck_names]
        group_of = {}
        for k, names in enumerate(groups):
            for name in names:
                group_of.setdefault(name, k)  # the first pattern that matches decides, as in timm
        for module_name, module in self.named_modules():
            owned = {group_of.get(f'{module_name}.{name}') for name, _ in module.named_parameters(recurse=False)}
            if module_name and len(owned) == 1 and None not in owned:
                groups[owned.pop()].append(module_name)
        patterns = ['^(?:' + '|'.join(re.escape(name) for name in names) + ')$' for names in groups]
        return dict(stem=patterns[0], blocks=[(pattern, (k, )) for k, pattern in enumerate(patterns[1:])])

    def set_attn_impl(self, impl):
        """Switch every attention op between ``'auto'``, ``'fast'``, ``'reference'`` or another
        registered implementation."""
        self.backbone.set_attn_impl(impl)

    def forward_features(self, x):
        """(B, C, H, W) -> final map (B, h, w, num_features) (NHWC), through the architecture's neck."""
        return self.head_settings.features(self.backbone, self, self.backbone.forward_stages(x)[-1])

    def forward_head(self, x, pre_logits=False):
        """Final map (B, h, w, F) (the ViT: its tokens, (B, 1, L, F)) -> logits (B, num_classes), or the pooled
        (B, F) with ``pre_logits`` (with ``global_pool=''`` no pooling: (B, h, w, F) / (B, h, w, num_classes))."""
        pooled = self.global_pool != ''
        if pooled:
            x = self.head_settings.pool(self.backbone, x, self.global_pool)
        return x if pre_logits else self.head_settings.logits(self.head, x, pooled)

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
        final_norm = self.head_settings.stage_norm(self) if norm else None
        maps = [self.backbone.stage_map(stages[i], final_norm if i == num_stages - 1 else None) for i in take]
        if intermediates_only:
            return maps
        return self.head_settings.features(self.backbone, self, stages[-1]), maps

    # ---------------------------------------------------------------------------------------------
    # weights: mmpola.checkpoint's one loading path

    def init_weights(self):
        if is_pretrained_cfg(self.init_cfg):
            self.load_checkpoint(self.init_cfg['checkpoint'], strict=self.init_cfg.get('strict', True),
                                 use_ema=self.init_cfg.get('use_ema', True))
            self._is_init = True
        else:
            super().init_weights()

    def load_checkpoint(self, checkpoint, strict=True, use_ema=True, map_location='cpu', logger='current'):
        """Load an official, mmengine or own checkpoint (path, URL or dict; EMA weights first with
        ``use_ema``) through :func:`mmpola.checkpoint.load_checkpoint`: mapped by :meth:`checkpoint_filter`
        (run-time buffers dropped), refused when it is not this architecture's and kind's, when it holds
        other blocks (another depth or per-stage layout; ``strict=False`` loads the blocks both have) or
        non-finite weights, grids of another pretraining size resized, loaded, one report line (``strict``:
        every key of the model and of the file used). Returns the :class:`~mmpola.checkpoint.LoadReport`."""
        return load_checkpoint(self, checkpoint, prefix='', use_ema=use_ema, strict=strict,
                               map_location=map_location, logger=logger)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """torch's ``load_state_dict`` of official, mmengine or own state dicts (mapped by the
        pre-hook), refused with one message when they hold non-finite weights or (``strict``) other
        blocks than the model (a deeper or shallower model of the same widths would otherwise fail with
        torch's list of keys): :func:`mmpola.checkpoint.prepare_state_dict` checks them first."""
        prepare_state_dict(self, _opened_tensors(state_dict), 'the given state dict', prefix='',
                           strict=None if strict else False)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def checkpoint_signature(self):
        """The backbone's key signature (compared with the keys below ``backbone.``)."""
        return self.backbone.checkpoint_signature()

    def checkpoint_filter(self, state_dict, source='the checkpoint', map_final_norm=False):
        """Official / mmengine / own checkpoint tensors -> the classifier's keys, timm's
        ``checkpoint_filter_fn``: official keys get the ``backbone.`` prefix except the head's modules;
        ``module.`` is stripped; the backbone part goes through the backbone's filter (run-time buffers
        ...), head modules the model does not have are dropped (the official PVT's unused final norm).
        ``map_final_norm`` is the backbones' option (the classifier keeps its own ``norm``).

        Returns:
            (kept state dict, dropped keys).
        """
        model_state = self.state_dict()
        own_prefix, own = find_key_prefix(state_dict, model_state)
        head_modules = tuple(self.head_settings.modules)
        official = OrderedDict()
        for key, value in state_dict.items():
            key = key[len('module.'):] if key.startswith('module.') else key
            official[key if key.split('.', 1)[0] in head_modules else 'backbone.' + key] = value
        _, n_official = find_key_prefix(official, model_state)
        if own >= n_official:
            state_dict = OrderedDict((k[len(own_prefix):], v) for k, v in state_dict.items()
                                     if k.startswith(own_prefix))
        else:
            state_dict = official
        backbone, dropped = self.backbone.checkpoint_filter(
            OrderedDict((k[len('backbone.'):], v) for k, v in state_dict.items() if k.startswith('backbone.')),
            source)
        out = OrderedDict(('backbone.' + k, v) for k, v in backbone.items())
        dropped = ['backbone.' + k for k in dropped]
        for key, value in state_dict.items():
            if key.startswith('backbone.'):
                continue
            if key in model_state or key.split('.', 1)[0] not in head_modules:
                out[key] = value
            else:
                dropped.append(key)
        return out, dropped


def timm_filter_fn(state_dict, model, layout=True):
    """timm's ``pretrained_filter_fn`` of the entries: :func:`mmpola.checkpoint.prepare_state_dict` (the
    classifier's filter, "is this file for this model", resizing, the finite check; timm loads without
    ``strict`` when it resets the head, so the file's blocks are compared here; ``layout=False`` with
    ``pretrained_strict=False``)."""
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    source = next((checkpoint_source(cfg[k]) for k in ('file', 'url', 'hf_hub_id') if cfg.get(k)),
                  'the pretrained weights')
    return prepare_state_dict(model, state_dict, source, prefix='', strict=None if layout else False).state_dict


def official_kwargs_to_classifier_kwargs(kwargs, family=None):
    """Keyword arguments of an official model class -> :class:`ImageClassifier` keyword arguments.

    Each architecture's head reads its own official arguments (``official_kwargs``; only
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
        parsed = classification_head_of(family).official_kwargs(architecture, kwargs)
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
    mapped, _ = module.checkpoint_filter(_opened_tensors(state_dict))
    converted, _ = resize_state_dict(mapped, module.state_dict())
    state_dict.clear()
    state_dict.update(converted)
