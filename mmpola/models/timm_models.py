"""timm model entries: ``timm.create_model('pola_pvt_tiny' ... 'pola_swin_base')``, the lineage
``flatten_pvt_{tiny,small,medium,large}``, ``flatten_swin_{tiny,small,base}``, ``inline_pvt_{...}``,
``inline_swin_{...}``, and PolaFormer++'s ``polapp_b0`` ... ``polapp_b5``.

Importing mmpola registers them. The entries build :class:`PolaClassifier` (official forward,
state dict ``backbone.*`` / ``norm.*`` (Swin) / ``head.*``) or, for PolaFormer++, :class:`PolaPPClassifier`
(``backbone.*`` / ``proj.*`` / ``norm.*`` / ``head.*``); timm's model conventions come from
:class:`~mmpola.models.timm_conventions.TimmClassifierMixin`. The entries differ only in an args dict::

    import mmpola, timm
    model = timm.create_model('pola_swin_tiny', checkpoint_path='pola_swin_t.pth')  # official file
    model = timm.create_model('pola_pvt_small', num_classes=100, drop_path_rate=0.2)
    model = timm.create_model('pola_pvt_tiny', pretrained=True,                      # head dropped
                              pretrained_cfg_overlay=dict(file='pola_pvt_t.pth'), num_classes=10)
    features = timm.create_model('pola_swin_tiny', features_only=True)               # 4 NCHW maps
    pooled = timm.create_model('pola_pvt_tiny', num_classes=0)                       # (B, 512)

Checkpoints: official PolaFormer / FLatten / InLine files (``{'model': ..., 'config': <yacs CfgNode>}``), mmengine
checkpoints of our classification runs (``{'state_dict': ...}``) and bare state dicts all load,
through ``checkpoint_path=`` as well as ``pretrained_cfg_overlay=dict(file=...)``. timm reads
them with ``torch.load(weights_only=True)`` (no unsafe fallback); importing mmpola adds the
yacs config and mmengine's logging types to torch's allowlist (:mod:`mmpola.checkpoint.reading`), so
nothing in the file is executed; a refused file raises torch's ``UnpicklingError``.
Official keys are mapped by :func:`checkpoint_filter_fn`.

``pretrained=True`` downloads the official ImageNet weights where their release publishes a direct
download (FLatten and InLine; :mod:`mmpola.models.pretrained` holds the table, ``pretrained_cfg['url']``
names it) into timm's cache. The PolaFormer weights (Hugging Face ``ZachMeng/PolaFormer``, file names not
verified) and PolaFormer++'s (Baidu Netdisk; their EMA weights ``state_dict_ema`` are used when present)
are passed as a file, as above.
"""
from collections import OrderedDict

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from mmpola.checkpoint.sources import pretrained_url

from .attention_kinds import get_attention_kind
from .classifier import PolaClassifier, checkpoint_filter_fn
from .polapp import DROP_PATH_RATE, PolaPPClassifier
from .pretrained import timm_pretrained_overlay
from .timm_conventions import refuse_scriptable, timm_pretrained_cfg

__all__ = ['accept_official_checkpoints', 'create_pola_classifier', 'TIMM_MODEL_ARGS']

# Entry name -> PolaClassifier arguments (drop_path_rate as the official yaml files).
TIMM_MODEL_ARGS = {
    'pola_pvt_tiny': dict(family='pvt', arch='tiny', drop_path_rate=0.1),
    'pola_pvt_small': dict(family='pvt', arch='small', drop_path_rate=0.1),
    'pola_pvt_medium': dict(family='pvt', arch='medium', drop_path_rate=0.3),
    'pola_pvt_large': dict(family='pvt', arch='large', drop_path_rate=0.3),
    'pola_swin_tiny': dict(family='swin', arch='tiny', drop_path_rate=0.2),
    'pola_swin_small': dict(family='swin', arch='small', drop_path_rate=0.3),
    'pola_swin_base': dict(family='swin', arch='base', drop_path_rate=0.5),
    **{f'polapp_{arch}': dict(family='polapp', arch=arch, drop_path_rate=rate)
       for arch, rate in DROP_PATH_RATE.items()},
}
# FLatten and InLine (the official yaml files: same drop-path rates; window 56 for Swin)
for _kind in ('flatten', 'inline'):
    for _name, _args in list(TIMM_MODEL_ARGS.items()):
        if _name.startswith('pola_'):
            TIMM_MODEL_ARGS[_name.replace('pola_', f'{_kind}_', 1)] = dict(_args, kind=_kind)
del _kind, _name, _args

_FIRST_CONV = {'pvt': 'backbone.patch_embed1.proj', 'swin': 'backbone.patch_embed.proj',
               'polapp': 'backbone.patch_embed.proj.0'}
_PAPERS = {
    'pola': ('PolaFormer: Polarity-aware Linear Attention for Vision Transformers',
             'https://github.com/ZacharyMeng/PolaFormer'),
    'flatten': ('FLatten Transformer: Vision Transformer using Focused Linear Attention',
                'https://github.com/LeapLabTHU/FLatten-Transformer'),
    'inline': ('Bridging the Divide: Reconsidering Softmax and Linear Attention',
               'https://github.com/LeapLabTHU/InLine'),
    'polapp': ('PolaFormer++: Polarity-aware Linear Attention with Channel-wise Spikiness',
               'https://github.com/ZacharyMeng/PolaFormerPP'),
}


def _cfg(family, kind='pola', **kwargs):
    # Evaluation exactly as the official code: square resize to 256 (bicubic), centre crop 224.
    paper, origin = _PAPERS[kind]
    return timm_pretrained_cfg(first_conv=_FIRST_CONV[family], classifier='head', paper_name=paper,
                               origin_url=origin, **kwargs)


default_cfgs = generate_default_cfgs({
    f'{name}.in1k': _cfg(args['family'], args.get('kind', 'polapp' if args['family'] == 'polapp' else 'pola'),
                         url=pretrained_url(name) or '')
    for name, args in TIMM_MODEL_ARGS.items()})


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
    tensors = state_dict
    for key in ('state_dict', 'model'):  # an unopened checkpoint container
        if isinstance(state_dict.get(key), dict):
            tensors = state_dict[key]
            break
    tensors = OrderedDict((k, v) for k, v in tensors.items() if torch.is_tensor(v))
    converted = checkpoint_filter_fn(tensors, module)
    state_dict.clear()
    state_dict.update(converted)


def accept_official_checkpoints(model):
    """Let ``model.load_state_dict`` take official PolaFormer state dicts (returns ``model``).

    The hook is a module-level function bound through torch's weak module reference, so
    ``copy.deepcopy`` (EMA copies) and pickling keep working.
    """
    model.register_load_state_dict_pre_hook(_official_state_dict_pre_hook)
    return model


def _build_classifier(in_chans=3, family='pvt', **kwargs):
    """timm calls the model class with ``in_chans``; the Pola backbones say ``in_channels``."""
    if family == 'polapp':
        return accept_official_checkpoints(PolaPPClassifier(in_channels=in_chans, **kwargs))
    return accept_official_checkpoints(PolaClassifier(family=family, in_channels=in_chans, **kwargs))


def create_pola_classifier(variant, pretrained=False, **kwargs):
    """Shared builder of the entries (timm's ``build_model_with_cfg`` with our filter).

    Any :class:`PolaClassifier` argument overrides the entry's preset (``arch=dict(...)``,
    ``drop_path_rate``, ``pretrain_img_size``, ``attn_impl`` ...). ``features_only=True``
    wraps the model in timm's ``FeatureGetterNet`` (``forward_intermediates``): a list of NCHW
    stage maps, strides 4, 8, 16, 32, ``out_indices`` 0-based (default all four).
    """
    model_args = dict(TIMM_MODEL_ARGS[variant])
    refuse_scriptable(PolaPPClassifier if model_args['family'] == 'polapp' else PolaClassifier)
    family = kwargs.pop('family', model_args['family'])
    if 'polapp' in (family, model_args['family']):  # PolaFormer++: one attention kind (PaCS)
        if family != model_args['family']:
            entries = 'a polapp_* entry' if family == 'polapp' else f'a pola_{family}_* entry'
            raise ValueError(f"{variant} is a {model_args['family']} model; family={family!r} does not fit "
                             f"(use {entries})")
        if 'kind' in kwargs:
            raise ValueError(f'{variant} is a PolaFormer++ model (PaCS attention); kind= does not apply')
        kind = prefix = None
    else:
        kind = kwargs.pop('kind', model_args.get('kind', 'pola'))
        prefix = model_args.get('kind', 'pola')
    if family != model_args['family']:
        title = get_attention_kind(prefix).title
        raise ValueError(f"{variant} is a {title}-{model_args['family'].upper()} model; "
                         f"family={family!r} does not fit (use a {prefix}_{family}_* entry)")
    if kind != prefix:
        raise ValueError(f'{variant} is a {prefix!r} attention model; kind={kind!r} does not fit '
                         f'(use a {kind}_{family}_* entry)')
    model_args.update(kwargs)
    if pretrained:  # the official file, downloaded once into timm's cache (mmpola.models.pretrained)
        overlay = model_args.get('pretrained_cfg_overlay')
        model_args['pretrained_cfg_overlay'] = timm_pretrained_overlay(variant, overlay)
    if model_args.get('features_only'):
        model_args.setdefault('num_classes', 0)  # a feature extractor carries no classifier
    return build_model_with_cfg(
        _build_classifier, variant, pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(feature_cls='getter', out_indices=(0, 1, 2, 3)),
        **model_args)


@register_model
def pola_pvt_tiny(pretrained=False, **kwargs):
    return create_pola_classifier('pola_pvt_tiny', pretrained, **kwargs)


@register_model
def pola_pvt_small(pretrained=False, **kwargs):
    return create_pola_classifier('pola_pvt_small', pretrained, **kwargs)


@register_model
def pola_pvt_medium(pretrained=False, **kwargs):
    return create_pola_classifier('pola_pvt_medium', pretrained, **kwargs)


@register_model
def pola_pvt_large(pretrained=False, **kwargs):
    return create_pola_classifier('pola_pvt_large', pretrained, **kwargs)


@register_model
def pola_swin_tiny(pretrained=False, **kwargs):
    return create_pola_classifier('pola_swin_tiny', pretrained, **kwargs)


@register_model
def pola_swin_small(pretrained=False, **kwargs):
    return create_pola_classifier('pola_swin_small', pretrained, **kwargs)


@register_model
def pola_swin_base(pretrained=False, **kwargs):
    return create_pola_classifier('pola_swin_base', pretrained, **kwargs)


@register_model
def polapp_b0(pretrained=False, **kwargs):
    return create_pola_classifier('polapp_b0', pretrained, **kwargs)


@register_model
def polapp_b1(pretrained=False, **kwargs):
    return create_pola_classifier('polapp_b1', pretrained, **kwargs)


@register_model
def polapp_b2(pretrained=False, **kwargs):
    return create_pola_classifier('polapp_b2', pretrained, **kwargs)


@register_model
def polapp_b3(pretrained=False, **kwargs):
    return create_pola_classifier('polapp_b3', pretrained, **kwargs)


@register_model
def polapp_b4(pretrained=False, **kwargs):
    return create_pola_classifier('polapp_b4', pretrained, **kwargs)


@register_model
def polapp_b5(pretrained=False, **kwargs):
    return create_pola_classifier('polapp_b5', pretrained, **kwargs)


@register_model
def flatten_pvt_tiny(pretrained=False, **kwargs):
    return create_pola_classifier('flatten_pvt_tiny', pretrained, **kwargs)


@register_model
def flatten_pvt_small(pretrained=False, **kwargs):
    return create_pola_classifier('flatten_pvt_small', pretrained, **kwargs)


@register_model
def flatten_pvt_medium(pretrained=False, **kwargs):
    return create_pola_classifier('flatten_pvt_medium', pretrained, **kwargs)


@register_model
def flatten_pvt_large(pretrained=False, **kwargs):
    return create_pola_classifier('flatten_pvt_large', pretrained, **kwargs)


@register_model
def flatten_swin_tiny(pretrained=False, **kwargs):
    return create_pola_classifier('flatten_swin_tiny', pretrained, **kwargs)


@register_model
def flatten_swin_small(pretrained=False, **kwargs):
    return create_pola_classifier('flatten_swin_small', pretrained, **kwargs)


@register_model
def flatten_swin_base(pretrained=False, **kwargs):
    return create_pola_classifier('flatten_swin_base', pretrained, **kwargs)


@register_model
def inline_pvt_tiny(pretrained=False, **kwargs):
    return create_pola_classifier('inline_pvt_tiny', pretrained, **kwargs)


@register_model
def inline_pvt_small(pretrained=False, **kwargs):
    return create_pola_classifier('inline_pvt_small', pretrained, **kwargs)


@register_model
def inline_pvt_medium(pretrained=False, **kwargs):
    return create_pola_classifier('inline_pvt_medium', pretrained, **kwargs)


@register_model
def inline_pvt_large(pretrained=False, **kwargs):
    return create_pola_classifier('inline_pvt_large', pretrained, **kwargs)


@register_model
def inline_swin_tiny(pretrained=False, **kwargs):
    return create_pola_classifier('inline_swin_tiny', pretrained, **kwargs)


@register_model
def inline_swin_small(pretrained=False, **kwargs):
    return create_pola_classifier('inline_swin_small', pretrained, **kwargs)


@register_model
def inline_swin_base(pretrained=False, **kwargs):
    return create_pola_classifier('inline_swin_base', pretrained, **kwargs)
