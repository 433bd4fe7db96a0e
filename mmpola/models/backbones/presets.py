"""The released backbones as registered presets: one row each, an architecture with an attention
kind and the released per-stage layout.

``PolaPVT``, ``FLattenSwin``, ``FLattenPVTv2``, ``InLineCSWin``, ``InLineDeiT`` ... are generated from
:data:`PRESETS`: subclasses of their architecture that only change defaults (``attn``, ``attn_type``
and, where a release differs, a class attribute such as InLine-PVT's doubled heads or InLine-CSWin's
deeper small size). They take every argument of the architecture; ``PolaPVT(attn=dict(alpha=3.0))``
sets an option of its kind.

The module also tells mmpola.checkpoint what the files of every architecture with every
registered kind look like (:func:`known_models`), for its messages.
"""
from dataclasses import dataclass, field

import torch

from mmpola.checkpoint import KnownModel, LookAlike
from mmpola.registry import ARCHITECTURES, ATTENTIONS, MODELS

from ..attention import attention_citation, attention_letter, attention_paper, attention_title
from . import polapp, pvt_v2, swin, vit  # noqa: F401  (registers the architectures the rows name)
from .cswin import CSWinBackbone
from .pvt import PVTBackbone

__all__ = ['Preset', 'PRESETS', 'preset_of', 'backbone_class', 'kinds_on_every_architecture', 'known_models',
           'PolaPVT', 'FLattenPVT', 'InLinePVT', 'PolaSwin', 'FLattenSwin', 'InLineSwin', 'PolaPP', 'FLattenPVTv2',
           'FLattenCSWin', 'InLineCSWin', 'InLineDeiT']


@dataclass(frozen=True)
class Preset:
    """One released backbone.

    Attributes:
        name: the registered type (``'PolaPVT'``).
        family: its architecture (``'pvt'``, mmpola.registry.ARCHITECTURES).
        attn: its attention kind (``'pola'``).
        attn_type: the released per-stage layout, or ``{arch: layout}`` where the sizes of a release
            differ (a custom arch dict gets the first entry's).
        official: its name as a checkpoint in messages (default ``'<kind title>-<architecture title>'``).
        release: its short name in descriptions of files (default ``'<kind paper> <architecture title>'``).
        overrides: class attributes the release changes (``arch_settings`` ...).
    """
    name: str
    family: str
    attn: str
    attn_type: str
    official: str = None
    release: str = None
    overrides: dict = field(default_factory=dict)


def _doubled_heads(settings):
    return {name: dict(arch, num_heads=[2 * h for h in arch['num_heads']]) for name, arch in settings.items()}


# the InLine release's CSWin-S is deeper than FLatten's (LeapLabTHU/InLine models/inline_cswin.py)
_INLINE_CSWIN = dict(CSWinBackbone.arch_settings,
                     small=dict(CSWinBackbone.arch_settings['small'], depths=[3, 6, 29, 2]))


def _inline_softmax_window(window_size):
    """The InLine release's softmax window: max(7, window_size // 8) (7 at 56, 12 at 96)."""
    return max(7, window_size // 8)


PRESETS = (
    Preset('PolaPVT', 'pvt', 'pola', 'LLLL'),
    Preset('FLattenPVT', 'pvt', 'flatten', 'LLLL'),
    # the released InLine-PVT models use twice the heads of PVT
    Preset('InLinePVT', 'pvt', 'inline', 'IIII',
           overrides=dict(arch_settings=_doubled_heads(PVTBackbone.arch_settings))),
    Preset('PolaSwin', 'swin', 'pola', 'LLSS'),
    Preset('FLattenSwin', 'swin', 'flatten', 'LLSS'),
    # the released layouts differ per size (LeapLabTHU/InLine cfgs/inline_swin_{t,s,b}.yaml)
    Preset('InLineSwin', 'swin', 'inline', dict(tiny='IIIS', small='IISS', base='IIMS2'),
           overrides=dict(default_softmax_window_size=staticmethod(_inline_softmax_window))),
    Preset('PolaPP', 'polapp', 'pacs', 'LLSS', official='PolaFormer++', release='PolaFormer++'),
    Preset('FLattenPVTv2', 'pvt_v2', 'flatten', 'LLLL'),
    Preset('FLattenCSWin', 'cswin', 'flatten', 'LLSS'),
    Preset('InLineCSWin', 'cswin', 'inline', 'IISS', overrides=dict(arch_settings=_INLINE_CSWIN)),
    Preset('InLineDeiT', 'vit', 'inline', 'I'),
)


def _complete(preset):
    arch = ARCHITECTURES.get(preset.family)
    official = preset.official or f'{attention_title(preset.attn)}-{arch.title}'
    release = preset.release or f'{attention_paper(preset.attn)} {arch.title}'
    return Preset(preset.name, preset.family, preset.attn, preset.attn_type, official, release,
                  preset.overrides)


def _make(preset):
    """The registered class of a preset: its architecture with the preset's defaults."""
    arch = ARCHITECTURES.get(preset.family)
    layout = preset.attn_type if isinstance(preset.attn_type, str) else \
        ', '.join(f"'{v}' ({k})" for k, v in preset.attn_type.items())
    citation = attention_citation(preset.attn)
    doc = (f"""{preset.official} backbone ({citation}) for mmdet / mmseg: :class:`{arch.__name__}` with
    ``attn=dict(type='{preset.attn}')`` and ``attn_type`` {layout!s} by default (its release).

    Registered in mmengine's root ``MODELS`` registry, so ``dict(type='{preset.name}', ...)`` builds from
    mmdet's, mmseg's and any other OpenMMLab library's registry. Every argument of
    :class:`{arch.__name__}`; the options of the kind go in ``attn=dict(...)``
    (:func:`mmpola.models.attention.attention_options`).
    """)
    attrs = dict(preset.overrides, default_attn=dict(type=preset.attn), default_attn_type=preset.attn_type,
                 preset=preset, __doc__=doc, __module__=__name__, __qualname__=preset.name)
    cls = type(preset.name, (arch,), attrs)
    MODELS.register_module(module=cls)
    return cls


PRESETS = tuple(_complete(p) for p in PRESETS)
_CLASSES = {p.name: _make(p) for p in PRESETS}
PolaPVT = _CLASSES['PolaPVT']
FLattenPVT = _CLASSES['FLattenPVT']
InLinePVT = _CLASSES['InLinePVT']
PolaSwin = _CLASSES['PolaSwin']
FLattenSwin = _CLASSES['FLattenSwin']
InLineSwin = _CLASSES['InLineSwin']
PolaPP = _CLASSES['PolaPP']
FLattenPVTv2 = _CLASSES['FLattenPVTv2']
FLattenCSWin = _CLASSES['FLattenCSWin']
InLineCSWin = _CLASSES['InLineCSWin']
InLineDeiT = _CLASSES['InLineDeiT']


def preset_of(family, kind):
    """The :class:`Preset` of an architecture with a kind, or None."""
    return next((p for p in PRESETS if p.family == family and p.attn == kind), None)


def kinds_on_every_architecture():
    """The registered linear kinds (letter other than 'S') that every registered architecture takes
    (:meth:`DenseBackbone.accepts_kind`): what the benchmark and the tests put on every architecture
    beside its softmax (PaCS, which needs PolaFormer++'s RoPE tables and no class token, is not one)."""
    return tuple(kind for kind in ATTENTIONS.module_dict if attention_letter(kind) != 'S'
                 and all(arch.accepts_kind(kind) for arch in ARCHITECTURES.module_dict.values()))


def backbone_class(family, kind=None):
    """The class that builds architecture ``family`` with ``kind``: its preset when there is one (the
    released defaults), else the architecture. ``kind=None``: the architecture's first preset."""
    preset = preset_of(family, kind) if kind is not None else next((p for p in PRESETS if p.family == family), None)
    return _CLASSES[preset.name] if preset is not None else ARCHITECTURES.get(family)


# --------------------------------------------------------------------------------------------------
# what the files of every architecture with every kind look like (mmpola.checkpoint's messages)

_KNOWN = {}


def _probe(arch, kind):
    """The key signature of ``arch`` built on the meta device with ``kind`` in every stage (its first
    arch setting, one block per stage: key patterns do not depend on the depth)."""
    settings = dict(next(iter(arch.arch_settings.values())))
    if isinstance(settings.get('depths'), (list, tuple)):
        settings['depths'] = [1] * len(settings['depths'])
    if isinstance(settings.get('depth'), int):  # the ViT: a stage per block
        settings['depth'] = 1
    with torch.device('meta'):
        model = arch(arch=settings, attn=dict(type=kind), attn_type=attention_letter(kind) * arch.stages_of(settings),
                     init_cfg=None)
    return model.checkpoint_signature()


def _known_entries(family, arch, kind):
    try:
        signature = _probe(arch, kind)
    except Exception:  # a kind that does not fit this architecture (a user's kind, say)
        return []
    if kind not in signature.kinds or not signature.attention_prefixes:
        return []
    preset = preset_of(family, kind)
    softmax = kind == arch.softmax_attn
    if preset is not None:
        official, release, fix = preset.official, preset.release, f"build type='{preset.name}'"
        name = f'{official} (type="{preset.name}")'
    elif softmax:
        name = official = release = arch.softmax_name or f'softmax {arch.title}'
        fix = "build the backbone with attn_type='SSSS'"
    else:
        official = f'{attention_title(kind)}-{arch.title}'
        name = f"{official} (type=\"{arch.__name__}\", attn=dict(type='{kind}'))"
        release = f'{attention_paper(kind)} {arch.title}'
        fix = f"build type='{arch.__name__}' with attn=dict(type='{kind}')"
    return [KnownModel(name=name, official=official, release=release, family=family, kind=kind,
                       structure=signature.structure, attention_prefix=sorted(signature.attention_prefixes)[0],
                       leaves=signature.kinds[kind], softmax=softmax, released=preset is not None, fix=fix,
                       letter=attention_letter(kind), sizes=lambda: _size_layouts(family, arch, kind))]


# the short names of the preset sizes in a file's name ('Pola-PVT-S'); others as they are ('b0')
_SIZE_NAMES = {'tiny': 'T', 'small': 'S', 'medium': 'M', 'large': 'L', 'base': 'B', 'base_384': 'B-384'}
_SIZES = {}


def _size_layouts(family, arch, kind):
    """``{arch name: (short name, BlockLayout)}`` of every preset size of ``arch`` with ``kind`` as its
    release builds it (the preset's per-stage layout; softmax: every stage 'S'), built on the meta device
    once, when a message needs it."""
    key = (arch, kind)
    if key not in _SIZES:
        cls = backbone_class(family, kind) if preset_of(family, kind) is not None else arch
        out = {}
        for size, settings in cls.arch_settings.items():
            kwargs = dict(arch=size, init_cfg=None)
            if preset_of(family, kind) is None:
                kwargs['attn'] = None if kind == arch.softmax_attn else dict(type=kind)
                letter = 'S' if kind == arch.softmax_attn else attention_letter(kind)
                kwargs['attn_type'] = letter * arch.stages_of(settings)
            try:
                with torch.device('meta'):
                    out[size] = (_SIZE_NAMES.get(size, size), cls(**kwargs).checkpoint_signature().layout)
            except Exception:  # a size this kind cannot build
                continue
        _SIZES[key] = out
    return _SIZES[key]


def known_models():
    """:class:`mmpola.checkpoint.KnownModel` entries of every registered architecture with every
    registered kind, and the architectures' look-alikes of other libraries (cached per pair)."""
    entries = []
    for family, arch in ARCHITECTURES.module_dict.items():
        for kind in ATTENTIONS.module_dict:
            key = (arch, kind, ATTENTIONS.module_dict[kind])
            if key not in _KNOWN:
                _KNOWN[key] = _known_entries(family, arch, kind)
            entries += _KNOWN[key]
        entries += [LookAlike(description, pattern) for description, pattern in arch.look_alikes.items()]
    return entries
