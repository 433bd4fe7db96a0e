"""Build hook of mmpola (metadata: pyproject.toml).

Besides the package, the wheel gets two files at its root (site-packages): ``_mmpola_config_scope.py``,
a copy of :mod:`mmpola.config_scope`, and ``mmpola-config-scope.pth``, whose line lets mmengine resolve
``mmpola::`` config bases in every process of the environment, mmdet's and mmseg's own tools included.
"""
import os.path as osp

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK_MODULE = '_mmpola_config_scope'
PTH_FILE = 'mmpola-config-scope.pth'


class BuildPyWithConfigScope(build_py):

    def run(self):
        super().run()
        self.copy_file(osp.join('mmpola', 'config_scope.py'), osp.join(self.build_lib, HOOK_MODULE + '.py'))
        with open(osp.join(self.build_lib, PTH_FILE), 'w') as f:
            f.write(f'import {HOOK_MODULE}; {HOOK_MODULE}.install_import_hook()\n')

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [
            osp.join(self.build_lib, HOOK_MODULE + '.py'), osp.join(self.build_lib, PTH_FILE)]


setup(cmdclass={'build_py': BuildPyWithConfigScope})
