"""timm model entries, generated from one table (:data:`TIMM_ENTRIES`): ``timm.create_model('pola_pvt_tiny'
... 'pola_swin_base')``, ``flatten_pvt_{tiny,small,medium,large}``, ``flatten_swin_{tiny,small,base}``,
``inline_pvt_{...}``, ``inline_swin_{...}``, the Swin-B fine-tunes at 384 ``{pola,flatten}_swin_base_384``,
the other releases of the lineage ``flatten_pvt_v2_b0`` ...
``_b4``, ``{flatten,inline}_cswin_{tiny,small,base,base_384}``, ``inline_deit_{tiny,small,base}`` and
PolaFormer++'s ``polapp_b0`` ... ``polapp_b5``.

Importing mmpola registers them. Every entry builds :class:`~mmpola.models.classifier.ImageClassifier`
(official forward; state dict ``backbone.*`` and the architecture's head modules); timm's model
conventions come from :class:`~mmpola.models.timm_conventions.TimmClassifierMixin`. The entries differ only in their
table row::

    import mmpola, timm
    model = timm.create_model('pola_swin_tiny', checkpoint_path='pola_swin_t.pth')  # official file
    model = timm.create_model('pola_pvt_small', num_classes=100, drop_path_rate=0.2)
    model = timm.create_model('pola_pvt_tiny', pretrained=True,                      # head dropped
                              pretrained_cfg_overlay=dict(file='pola_pvt_t.pth'), num_classes=10)
    features = timm.create_model('pola_swin_tiny', features_only=True)               # 4 NCHW maps
    pooled = timm.create_model('pola_pvt_tiny', num_classes=0)                       # (B, 512)

Checkpoints: official PolaFormer / FLatten / InLine files (``{'model': ..., 'config': <yacs
CfgNode>}``), PolaFormer++ files (EMA weights ``state_dict_ema`` used when present), mmengine
checkpoints of our classification runs (``{'state_dict': ...}``) and bare state dicts all load, through
``checkpoint_path=`` as well as ``pretrained_cfg_overlay=dict(file=...)``, through mmpola.checkpoint's
one loading path (:func:`~mmpola.models.classifier.timm_filter_fn`; official keys are mapped by the
classifier's filter). A file of other blocks than the entry (a ``pola_pvt_small`` file for
``pola_pvt_tiny``) or with NaN / inf weights is refused, naming what it holds;
``pretrained_strict=False`` loads the blocks both have on purpose. timm reads them with
``torch.load(weights_only=True)``; importing mmpola adds the yacs config and mmengine's logging types to
torch's allowlist (:mod:`mmpola.checkpoint.reading`), so nothing in the file is executed.

``pretrained=True`` downloads the official ImageNet weights where their release publishes a direct
download (FLatten and InLine; :mod:`mmpola.checkpoint.sources` holds the table, ``pretrained_cfg['url']``
names it) into timm's cache (:mod:`mmpola.models.pretrained`). The PolaFormer weights (Hugging Face
``ZachMeng/PolaFormer``, file names not verified) and PolaFormer++'s (Baidu Netdisk) are passed as a file,
as above; ``pretrained=True`` without one says where they are.
"""
import functools
import inspect
from dataclasses import dataclass, field

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from mmpola.checkpoint.sources import pretrained_url
from mmpola.registry import ARCHITECTURES

from .attention import attention_publication, attention_title
from .backbones import backbone_class, preset_of
from .classification_head import classification_head_of
from .classifier import ImageClassifier, timm_filter_fn
from .pretrained import timm_pretrained_overlay
from .timm_conventions import refuse_scriptable, timm_pretrained_cfg

__all__ = ['TimmEntry', 'TIMM_ENTRIES', 'create_classifier']


@dataclass(frozen=True)
class TimmEntry:
    """One timm entry.

    Attributes:
        family: the architecture (``'pvt'``).
        arch: the backbone preset (``'tiny'``).
        attn: the attention kind (``'pola'``).
        options: other classifier arguments (``drop_path_rate`` as the official recipe).
        source: where the official weights are, as timm's pretrained_cfg keys (``url``,
            ``hf_hub_id`` ...); empty: the verified download of :mod:`mmpola.checkpoint.sources`, if any.
        img_size: the official evaluation size (the pretraining size: CSWin-B-384 384, InLine-DeiT-S
            288, InLine-DeiT-B 448).
        crop_pct: the official evaluation's centre crop (1.0: the Swin-B 384 fine-tunes resize to the size,
            ``TEST.CROP: False``).
    """
    family: str
    arch: str
    attn: str
    options: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    img_size: int = 224
    crop_pct: float = 0.875


def _row(family, arch, attn, drop_path_rate, **kwargs):
    options = dict(drop_path_rate=drop_path_rate)
    if family == 'swin' and kwargs.get('img_size', 224) != 224:  # pretrained at another size
        options.update(_pretraining_size(kwargs['img_size']))
    return TimmEntry(family, arch, attn, options, **kwargs)


def _pretraining_size(img_size):
    """The backbone arguments of a pretraining size: the stored grids' size and (Swin) the linear blocks'
    window, a quarter of it as released (56 at 224, 96 at 384)."""
    return dict(pretrain_img_size=img_size, window_size=img_size // 4)


# name: (architecture, arch, attention, options, pretrained cfg); drop-path rates of the official recipes
TIMM_ENTRIES = {
    'pola_pvt_tiny': _row('pvt', 'tiny', 'pola', 0.1),
    'pola_pvt_small': _row('pvt', 'small', 'pola', 0.1),
    'pola_pvt_medium': _row('pvt', 'medium', 'pola', 0.3),
    'pola_pvt_large': _row('pvt', 'large', 'pola', 0.3),
    'pola_swin_tiny': _row('swin', 'tiny', 'pola', 0.2),
    'pola_swin_small': _row('swin', 'small', 'pola', 0.3),
    'pola_swin_base': _row('swin', 'base', 'pola', 0.5),
    'flatten_pvt_tiny': _row('pvt', 'tiny', 'flatten', 0.1),
    'flatten_pvt_small': _row('pvt', 'small', 'flatten', 0.1),
    'flatten_pvt_medium': _row('pvt', 'medium', 'flatten', 0.3),
    'flatten_pvt_large': _row('pvt', 'large', 'flatten', 0.3),
    'flatten_swin_tiny': _row('swin', 'tiny', 'flatten', 0.2),
    'flatten_swin_small': _row('swin', 'small', 'flatten', 0.3),
    'flatten_swin_base': _row('swin', 'base', 'flatten', 0.5),
    'inline_pvt_tiny': _row('pvt', 'tiny', 'inline', 0.1),
    'inline_pvt_small': _row('pvt', 'small', 'inline', 0.1),
    'inline_pvt_medium': _row('pvt', 'medium', 'inline', 0.3),
    'inline_pvt_large': _row('pvt', 'large', 'inline', 0.3),
    'inline_swin_tiny': _row('swin', 'tiny', 'inline', 0.2),
    'inline_swin_small': _row('swin', 'small', 'inline', 0.3),
    'inline_swin_base': _row('swin', 'base', 'inline', 0.5),
    # the Swin-B fine-tunes at 384 (cfgs/{pola,flatten}_swin_b_384.yaml: window 96 for the linear blocks)
    'pola_swin_base_384': _row('swin', 'base', 'pola', 0.5, img_size=384, crop_pct=1.0),
    'flatten_swin_base_384': _row('swin', 'base', 'flatten', 0.5, img_size=384, crop_pct=1.0),
    'polapp_b0': _row('polapp', 'b0', 'pacs', 0.1),
    'polapp_b1': _row('polapp', 'b1', 'pacs', 0.1),
    'polapp_b2': _row('polapp', 'b2', 'pacs', 0.1),
    'polapp_b3': _row('polapp', 'b3', 'pacs', 0.15),
    'polapp_b4': _row('polapp', 'b4', 'pacs', 0.4),
    'polapp_b5': _row('polapp', 'b5', 'pacs', 0.55),
    # the other macro architectures of the FLatten and InLine releases (drop path of their yaml files)
    'flatten_pvt_v2_b0': _row('pvt_v2', 'b0', 'flatten', 0.1),
    'flatten_pvt_v2_b1': _row('pvt_v2', 'b1', 'flatten', 0.1),
    'flatten_pvt_v2_b2': _row('pvt_v2', 'b2', 'flatten', 0.1),
    'flatten_pvt_v2_b3': _row('pvt_v2', 'b3', 'flatten', 0.3),
    'flatten_pvt_v2_b4': _row('pvt_v2', 'b4', 'flatten', 0.3),
    'flatten_cswin_tiny': _row('cswin', 'tiny', 'flatten', 0.2),
    'flatten_cswin_small': _row('cswin', 'small', 'flatten', 0.4),
    'flatten_cswin_base': _row('cswin', 'base', 'flatten', 0.5),
    'flatten_cswin_base_384': _row('cswin', 'base_384', 'flatten', 0.7, img_size=384),
    'inline_cswin_tiny': _row('cswin', 'tiny', 'inline', 0.2),
    'inline_cswin_small': _row('cswin', 'small', 'inline', 0.4),
    'inline_cswin_base': _row('cswin', 'base', 'inline', 0.5),
    'inline_cswin_base_384': _row('cswin', 'base_384', 'inline', 0.7, img_size=384),
    'inline_deit_tiny': _row('vit', 'tiny', 'inline', 0.1),
    'inline_deit_small': _row('vit', 'small', 'inline', 0.1, img_size=288),
    'inline_deit_base': _row('vit', 'base', 'inline', 0.1, img_size=448),
}

def _cfg(name, entry):
    # evaluation exactly as the official code: square resize to 256 / 224 of the size (bicubic), centre crop
    paper, origin = attention_publication(entry.attn)  # the kind's release: its class says
    architecture = ARCHITECTURES.get(entry.family)
    first_conv = 'backbone.' + architecture.first_conv
    source = entry.source or dict(url=pretrained_url(name) or '')
    size = entry.img_size
    return timm_pretrained_cfg(first_conv=first_conv, classifier='head', paper_name=paper, origin_url=origin,
                               input_size=(3, size, size), crop_pct=entry.crop_pct,
                               pool_size=classification_head_of(entry.family).pool_size(architecture, size),
                               min_input_size=(3, architecture.min_input_size, architecture.min_input_size),
                               **source)


default_cfgs = generate_default_cfgs({f'{name}.in1k': _cfg(name, entry) for name, entry in TIMM_ENTRIES.items()})


def _official_name(family, kind):
    preset = preset_of(family, kind)
    return preset.official if preset else f'{attention_title(kind)}-{ARCHITECTURES.get(family).title}'


def _entries_of(family, kind):
    names = [n for n, e in TIMM_ENTRIES.items() if e.family == family and e.attn == kind]
    return f'a {names[0].rsplit("_", 1)[0]}_* entry' if names else f"ImageClassifier(family='{family}', kind='{kind}')"


def _build_classifier(in_chans=3, **kwargs):
    """timm calls the model class with ``in_chans``; the backbones say ``in_channels``."""
    return ImageClassifier(in_channels=in_chans, **kwargs)


def create_classifier(variant, pretrained=False, **kwargs):
    """Shared builder of the entries (timm's ``build_model_with_cfg`` with our filter).

    Any :class:`~mmpola.models.classifier.ImageClassifier` argument overrides the entry's row (``arch=dict(...)``,
    ``drop_path_rate``, ``pretrain_img_size``, ``attn_impl`` ...); timm's ``img_size`` sets the pretraining size
    (:func:`_img_size_args`). ``features_only=True`` wraps the model in timm's ``FeatureGetterNet``
    (``forward_intermediates``): a list of NCHW stage maps, strides 4, 8, 16, 32, ``out_indices`` 0-based
    (default all four); ``feature_cls='fx'`` gives the stages' tokens, the other extractors are refused.
    """
    entry = TIMM_ENTRIES[variant]
    refuse_scriptable(ImageClassifier)
    family = kwargs.pop('family', entry.family)
    kind = kwargs.pop('kind', entry.attn)
    if family != entry.family:
        raise ValueError(f'{variant} is a {_official_name(entry.family, entry.attn)} model (the {entry.family} model '
                         f'family); family={family!r} does not fit (use {_entries_of(family, entry.attn)})')
    if kind != entry.attn:
        raise ValueError(f'{variant} is a {entry.attn!r} attention model; kind={kind!r} does not fit '
                         f'(use {_entries_of(family, kind)})')
    model_args = dict(family=entry.family, arch=entry.arch, kind=entry.attn, **entry.options)
    if 'img_size' in kwargs:  # timm's name of the size the model is built for
        model_args.update(_img_size_args(variant, entry, kwargs.pop('img_size')))
    model_args.update(kwargs)
    if pretrained and not entry.source:  # the official file, downloaded once into timm's cache
        overlay = model_args.get('pretrained_cfg_overlay')
        model_args['pretrained_cfg_overlay'] = timm_pretrained_overlay(variant, overlay)
    if model_args.get('features_only'):
        model_args.setdefault('num_classes', 0)  # a feature extractor carries no classifier
        _check_feature_cls(variant, model_args.get('feature_cls', 'getter'))
    strict = model_args.get('pretrained_strict', True)  # False: a file of other blocks loads what fits
    return build_model_with_cfg(
        _build_classifier, variant, pretrained,
        pretrained_filter_fn=functools.partial(timm_filter_fn, layout=strict is not False),
        feature_cfg=dict(feature_cls='getter', out_indices=_feature_indices(entry, model_args.get('arch'))),
        **model_args)


def _img_size_args(variant, entry, img_size):
    """``img_size=``: the size the stored grids (positional encodings; Swin's linear windows) are built for,
    as the entries of another pretraining size (``*_384``) set it; inputs of any size run either way."""
    cls = backbone_class(entry.family, entry.attn)
    if 'pretrain_img_size' not in inspect.signature(cls.__init__).parameters:
        raise TypeError(f'{variant} takes no img_size: it stores no grid of a pretraining size, and inputs of any '
                        'size (at least pretrained_cfg["min_input_size"]) run without it')
    args = _pretraining_size(img_size)
    if entry.family != 'swin':
        args.pop('window_size')
    return args


def _check_feature_cls(variant, feature_cls):
    """The feature extractors that fit: timm's ``'getter'`` (``forward_intermediates``, the default) and
    ``'fx'``; the hook, list and dict extractors take a module's output, and no module of these backbones
    returns a stage's NCHW map (a stage's blocks work on tokens)."""
    name = feature_cls.lower() if isinstance(feature_cls, str) else getattr(feature_cls, '__name__', feature_cls)
    if name not in ('getter', 'fx', 'FeatureGetterNet', 'FeatureGraphNet'):
        raise ValueError(f"feature_cls={feature_cls!r} does not fit {variant}: its stage maps (NCHW) come from "
                         'forward_intermediates, not from the output of a module, which the hook, list and dict '
                         "extractors take; use the default feature_cls='getter', or 'fx' for each stage's "
                         '(B, H*W, C) tokens')


def _feature_indices(entry, arch=None):
    """The stages ``features_only`` returns by default: the architecture's ``default_out_indices`` (the
    four pyramid stages; the ViT's quarter points)."""
    cls = backbone_class(entry.family, entry.attn)
    arch = arch if arch is not None else entry.arch
    settings = cls.arch_settings[arch] if isinstance(arch, str) else arch
    return cls.default_out_indices(cls.stages_of(settings))


def _register(name):
    """Register timm entry ``name`` of the table."""
    entry = TIMM_ENTRIES[name]

    def create(pretrained=False, **kwargs):
        return create_classifier(name, pretrained, **kwargs)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = (f'{_official_name(entry.family, entry.attn)} ({entry.arch}) ImageNet classifier: '
                      f'``timm.create_model({name!r}, ...)``.')
    return register_model(create)


for _name in TIMM_ENTRIES:
    globals()[_name] = _register(_name)
del _name
