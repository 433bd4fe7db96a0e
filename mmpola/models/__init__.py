"""mmpola's models: attention kinds (:mod:`.attention`), dense backbones, one class per macro
architecture with the released presets (:mod:`.backbones`), the ImageNet classifier (:mod:`.classifier`;
each architecture's official head: :mod:`.classification_head`) and its timm entries (:mod:`.timm_models`).

Importing this package registers the attention kinds (mmpola.registry.ATTENTIONS), the architectures
(mmpola.registry.ARCHITECTURES) and, in mmengine's root MODELS registry (visible to mmdet, mmseg and
mmpretrain alike), the backbones, their presets and the classifier (and each architecture's
classification head in mmpola.registry.CLASSIFICATION_HEADS); and the timm entries.
"""
from . import timm_models  # noqa: F401  (registers the timm entries pola_*, flatten_*, inline_*, polapp_*)
from .attention import (
    FocusedLinearAttention,
    InLineAttention,
    PaCSAttention,
    PolaAttention,
    RoPESoftmaxAttention,
    SpatialReductionAttention,
    StripeAttention,
    WindowAttention,
    attention_options,
    build_attention,
)
from .backbones import (
    CSWinBackbone,
    DenseBackbone,
    FLattenCSWin,
    FLattenPVT,
    FLattenPVTv2,
    FLattenSwin,
    InLineCSWin,
    InLineDeiT,
    InLinePVT,
    InLineSwin,
    PolaPP,
    PolaPPBackbone,
    PolaPVT,
    PolaSwin,
    PVTBackbone,
    PVTv2Backbone,
    SwinBackbone,
    ViTBackbone,
)
from .classifier import ImageClassifier

__all__ = ['PolaPVT', 'PolaSwin', 'FLattenPVT', 'FLattenSwin', 'InLinePVT', 'InLineSwin', 'PolaPP', 'FLattenPVTv2',
           'FLattenCSWin', 'InLineCSWin', 'InLineDeiT', 'ImageClassifier', 'DenseBackbone',
           'PVTBackbone', 'PVTv2Backbone', 'SwinBackbone', 'CSWinBackbone', 'ViTBackbone', 'PolaPPBackbone',
           'PolaAttention', 'FocusedLinearAttention', 'InLineAttention', 'PaCSAttention', 'RoPESoftmaxAttention',
           'SpatialReductionAttention', 'WindowAttention', 'StripeAttention', 'build_attention', 'attention_options']
