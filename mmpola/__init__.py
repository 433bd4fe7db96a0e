"""mmpola: PolaFormer backbones for OpenMMLab dense prediction.

Importing this package registers every component (configs list it in ``custom_imports``) and
installs the safe checkpoint loading rules (see ``mmpola.safe_load``).
"""
from .safe_load import register_safe_globals
from .version import __version__

register_safe_globals()

from . import models  # noqa: E402,F401  (registers the backbones)
from . import datasets  # noqa: E402,F401  (registers the pipeline checks, e.g. CheckSegLabels)
from . import detection  # noqa: E402,F401  (registers PolaCocoMetric and PolaDetTTAModel)

__all__ = ['__version__']
