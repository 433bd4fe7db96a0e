# Importing this package registers the backbones and the classifier in mmengine's root MODELS
# registry, which makes them visible to mmdet, mmseg and mmpretrain alike.
from .attention_kinds import ATTENTION_KINDS, AttentionKind, build_attention, register_attention_kind
from .base import DenseBackbone
from .classifier import PolaClassifier
from .layers import PatchMerging, PolaAttention, PVTAttention, WindowAttention
from .polapp import PolaPP, PolaPPClassifier
from .pvt import PolaPVT, PVTBackbone
from .swin import PolaSwin, SwinBackbone
from . import timm_models  # noqa: F401  (registers the timm entries pola_* and polapp_*)

__all__ = ['PolaPVT', 'PolaSwin', 'PolaPP', 'PolaClassifier', 'PolaPPClassifier', 'PolaAttention', 'PVTAttention',
           'WindowAttention', 'PatchMerging', 'DenseBackbone', 'PVTBackbone', 'SwinBackbone',
           'ATTENTION_KINDS', 'AttentionKind', 'build_attention', 'register_attention_kind']
