"""mmpola's models: attention kinds (:mod:`.attention`), dense backbones, one class per macro
architecture with the released presets (:mod:`.backbones`), the ImageNet classifier
(:mod:`.classifier`) and its timm entries (:mod:`.timm_models`).

Importing this package registers the attention kinds (mmpola.registry.ATTENTIONS), the architectures
(mmpola.registry.ARCHITECTURES) and, in mmengine's root MODELS registry (visible to mmdet, mmseg and
mmpretrain alike), the backbones, their presets and the classifiers; and the timm entries.
"""
from . import timm_models  # noqa: F401  (registers the timm entries pola_*, flatten_*, inline_*, polapp_*)
from .attention import (
    FocusedLinearAttention,
    InLineAttention,
    PaCSAttention,
    PolaAttention,
    RoPESoftmaxAttention,
    SpatialReductionAttention,
    WindowAttention,
    attention_options,
    build_attention,
)
from .backbones import (
    DenseBackbone,
    FLattenPVT,
    FLattenSwin,
    InLinePVT,
    InLineSwin,
    PolaPP,
    PolaPPBackbone,
    PolaPVT,
    PolaSwin,
    PVTBackbone,
    SwinBackbone,
)
from .classifier import PolaClassifier, PolaPPClassifier

__all__ = ['PolaPVT', 'PolaSwin', 'FLattenPVT', 'FLattenSwin', 'InLinePVT', 'InLineSwin', 'PolaPP', 'PolaClassifier',
           'PolaPPClassifier', 'DenseBackbone', 'PVTBackbone', 'SwinBackbone', 'PolaPPBackbone',
           'PolaAttention', 'FocusedLinearAttention', 'InLineAttention', 'PaCSAttention', 'RoPESoftmaxAttention',
           'SpatialReductionAttention', 'WindowAttention', 'build_attention', 'attention_options']
