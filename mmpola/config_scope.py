"""``mmpola::`` config bases: mmpola in mmengine's table of packages that ship configs.

An outside project inherits mmpola's configs as it inherits mmdet's::

    _base_ = ['mmpola::detection/mask-rcnn_pola-pvt-t_fpn_1x_coco.py']
    custom_imports = dict(imports=['mmpola'], allow_failed_imports=False)

mmengine 0.10 resolves ``pkg::path`` only for the packages named in
``mmengine.config.utils.MODULE2PACKAGE`` (the OpenMMLab libraries), and it resolves the bases of a
config before its ``custom_imports`` run; the files then come from the installed package's
``.mim/configs`` folder (``mmpola/.mim/configs`` is the repository's ``configs``, copied into the
wheel). So mmpola has to be in that table before mmengine reads a config:

* ``import mmpola`` adds it (mmpola's tools import mmpola before they read a config);
* an installed wheel also carries ``mmpola-config-scope.pth``, whose one line runs
  :func:`install_import_hook` when Python starts: it adds the entry as soon as mmengine's config
  utilities are imported (and imports nothing itself), so ``mmpola::`` bases also work with mmdet's and
  mmseg's own ``tools/train.py``. An editable install (``pip install -e .``) has no such line, and
  mmengine cannot find the configs of an editable install anyway (it looks for them next to the
  installed distribution's metadata): outside projects install mmpola with ``pip install .``, or name
  mmpola's configs by their path in ``_base_`` (mmpola's tools say so when they meet such a base).

This module uses the standard library only: the wheel installs a copy of it as the top-level module
``_mmpola_config_scope`` for the ``.pth`` line, which must not import mmpola (or torch) at start-up.
"""
import importlib
import importlib.machinery
import sys

__all__ = ['PACKAGE', 'register_config_scope', 'install_import_hook']

PACKAGE = 'mmpola'
CONFIG_UTILS = 'mmengine.config.utils'


def register_config_scope(utils=None):
    """Add ``mmpola`` to ``mmengine.config.utils.MODULE2PACKAGE`` (kept if already there).

    Args:
        utils: the module ``mmengine.config.utils`` (imported when not given).
    """
    if utils is None:
        utils = importlib.import_module(CONFIG_UTILS)
    utils.MODULE2PACKAGE.setdefault(PACKAGE, PACKAGE)
    return utils


class _RegisterAfterExec:
    """Runs mmengine's own loader for ``mmengine.config.utils``, then adds the entry."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        register_config_scope(module)

    def __getattr__(self, name):  # get_source, get_filename ... of the real loader
        return getattr(self.loader, name)


class ConfigScopeFinder:
    """A meta path finder that only wraps the loader of ``mmengine.config.utils``."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != CONFIG_UTILS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterAfterExec(spec.loader)
        return spec


def install_import_hook():
    """Make sure ``mmpola`` is in mmengine's table whenever mmengine's config utilities are loaded."""
    utils = sys.modules.get(CONFIG_UTILS)
    if utils is not None:
        register_config_scope(utils)
    elif ConfigScopeFinder not in sys.meta_path:
        sys.meta_path.insert(0, ConfigScopeFinder)
