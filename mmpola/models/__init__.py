# Importing this package registers the backbones and the classifier in mmengine's root MODELS
# registry, which makes them visible to mmdet, mmseg and mmpretrain alike.
from . import timm_models  # noqa: F401  (registers the timm entries pola_*, flatten_*, inline_*, polapp_*)
from .attention_kinds import ATTENTION_KINDS, AttentionKind, build_attention, register_attention_kind
from .base import DenseBackbone
from .classifier import PolaClassifier
from .layers import FocusedLinearAttention, InLineAttention, PatchMerging, PolaAttention, PVTAttention, WindowAttention
from .polapp import PolaPP, PolaPPClassifier
from .pvt import FLattenPVT, InLinePVT, PolaPVT, PVTBackbone
from .swin import FLattenSwin, InLineSwin, PolaSwin, SwinBackbone

__all__ = ['PolaPVT', 'PolaSwin', 'FLattenPVT', 'FLattenSwin', 'InLinePVT', 'InLineSwin', 'PolaPP', 'PolaClassifier',
           'PolaPPClassifier', 'FocusedLinearAttention', 'InLineAttention', 'PolaAttention', 'PVTAttention',
           'WindowAttention', 'PatchMerging', 'DenseBackbone', 'PVTBackbone', 'SwinBackbone',
           'ATTENTION_KINDS', 'AttentionKind', 'build_attention', 'register_attention_kind']
