"""The dense backbones: one class per macro architecture on the shared :class:`DenseBackbone`
contract (pvt.py, swin.py, polapp.py), and the released backbones as presets of them (presets.py)."""
from mmpola.checkpoint import register_known_models

from .base import DenseBackbone, drop_path_rates, parse_attn_type, register_architecture, run_blocks, tokens_to_nchw
from .polapp import PolaPPBackbone
from .presets import (
    PRESETS,
    FLattenPVT,
    FLattenSwin,
    InLinePVT,
    InLineSwin,
    PolaPP,
    PolaPVT,
    PolaSwin,
    Preset,
    backbone_class,
    known_models,
    preset_of,
)
from .pvt import PVTBackbone
from .swin import SwinBackbone

register_known_models(known_models)

__all__ = ['DenseBackbone', 'register_architecture', 'parse_attn_type', 'drop_path_rates', 'run_blocks',
           'tokens_to_nchw', 'PVTBackbone', 'SwinBackbone', 'PolaPPBackbone', 'PRESETS', 'Preset', 'preset_of',
           'backbone_class', 'known_models', 'PolaPVT', 'FLattenPVT', 'InLinePVT', 'PolaSwin', 'FLattenSwin',
           'InLineSwin', 'PolaPP']
