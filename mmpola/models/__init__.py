# Importing this package registers the backbones and the classifier in mmengine's root MODELS
# registry, which makes them visible to mmdet, mmseg and mmpretrain alike.
from .classifier import PolaClassifier
from .layers import PatchMerging, PolaAttention, PVTAttention, WindowAttention
from .pola_pvt import PolaPVT
from .pola_swin import PolaSwin
from .polapp import PolaPP, PolaPPClassifier
from . import timm_models  # noqa: F401  (registers the timm entries pola_* and polapp_*)

__all__ = ['PolaPVT', 'PolaSwin', 'PolaPP', 'PolaClassifier', 'PolaPPClassifier', 'PolaAttention', 'PVTAttention',
           'WindowAttention', 'PatchMerging']
