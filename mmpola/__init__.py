"""mmpola: PolaFormer backbones for OpenMMLab dense prediction.

Importing this package (configs list it in ``custom_imports``) only registers: the backbones,
classifiers and timm entries (models), pipeline checks (datasets), the detection metric and test-time
augmentation (detection), the run-time hooks and optimizer wrapper (runtime), and the types that
mmengine's and official PolaFormer checkpoints hold in torch's weights-only allowlist
(:func:`mmpola.checkpoint.reading.register_safe_globals`). No function or attribute of torch,
mmengine or timm is replaced. One entry is added to mmengine's table of packages that ship configs
(``MODULE2PACKAGE``), so that ``mmpola::`` config bases resolve (mmpola/config_scope.py);
docs/development.md, "What importing mmpola changes", says it all.

``mmpola.DetInferencer`` / ``mmpola.SegInferencer`` (also in :mod:`mmpola.apis`) are mmdet's and
mmseg's inferencers extended for image folders (:mod:`mmpola.inferencers`), made on first use.
"""
from torch import __version__ as _torch_version

from .version import __version__, torch_too_old

if (_too_old := torch_too_old(_torch_version)):  # before anything that would fail on it less clearly
    raise ImportError(f'mmpola: {_too_old}')

from .checkpoint.reading import register_safe_globals  # noqa: E402
from .config_scope import register_config_scope  # noqa: E402

register_safe_globals()
register_config_scope()  # `mmpola::` config bases (mmpola/config_scope.py)

from . import datasets, detection, models, runtime  # noqa: E402,F401

__all__ = ['__version__', 'DetInferencer', 'SegInferencer']  # noqa: F822 (the inferencers: made on first use)


def __getattr__(name):
    if name in ('DetInferencer', 'SegInferencer'):
        from . import inferencers
        return getattr(inferencers, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
