"""The dense backbones: one class per macro architecture on the shared :class:`DenseBackbone`
contract (pvt.py, pvt_v2.py, swin.py, cswin.py, vit.py, polapp.py), and the released backbones as
presets of them (presets.py)."""
from mmpola.checkpoint import register_known_models

from .base import DenseBackbone, drop_path_rates, parse_attn_type, register_architecture, run_blocks, tokens_to_nchw
from .cswin import CSWinBackbone
from .polapp import PolaPPBackbone
from .presets import (
    PRESETS,
    FLattenCSWin,
    FLattenPVT,
    FLattenPVTv2,
    FLattenSwin,
    InLineCSWin,
    InLineDeiT,
    InLinePVT,
    InLineSwin,
    PolaPP,
    PolaPVT,
    PolaSwin,
    Preset,
    backbone_class,
    kinds_on_every_architecture,
    known_models,
    preset_of,
)
from .pvt import PVTBackbone
from .pvt_v2 import PVTv2Backbone
from .swin import SwinBackbone
from .vit import ViTBackbone

register_known_models(known_models)

__all__ = ['DenseBackbone', 'register_architecture', 'parse_attn_type', 'drop_path_rates', 'run_blocks',
           'tokens_to_nchw', 'PVTBackbone', 'PVTv2Backbone', 'SwinBackbone', 'CSWinBackbone', 'ViTBackbone',
           'PolaPPBackbone', 'PRESETS', 'Preset', 'preset_of', 'backbone_class', 'kinds_on_every_architecture',
           'known_models', 'PolaPVT',
           'FLattenPVT', 'InLinePVT', 'PolaSwin', 'FLattenSwin', 'InLineSwin', 'PolaPP', 'FLattenPVTv2',
           'FLattenCSWin', 'InLineCSWin', 'InLineDeiT']
