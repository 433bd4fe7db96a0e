"""mmpola: PolaFormer backbones for OpenMMLab dense prediction.

Importing this package registers every component (configs list it in ``custom_imports``) and,
unless the environment variable ``MMPOLA_SAFE_LOAD`` is ``0``, extends the safe checkpoint loading
to torch's, mmengine's and timm's loaders (``mmpola.checkpoint.safe_load.install``; undone by
``mmpola.checkpoint.safe_load.uninstall()``). docs/development.md, "What `import mmpola` changes", lists it all.
"""
from .checkpoint.safe_load import install_unless_disabled
from .config_scope import register_config_scope
from .version import __version__

install_unless_disabled()
register_config_scope()  # `mmpola::` config bases (mmpola/config_scope.py)

# registration: backbones and classifiers (models), pipeline checks such as CheckSegLabels (datasets),
# PolaDetTTAModel (detection)
from . import datasets, detection, models  # noqa: E402,F401

__all__ = ['__version__']
