"""``mmpola::`` config bases: mmpola in mmengine's table of packages with configs, added by
``import mmpola`` and, before anything is imported, by the start-up hook the wheel installs."""
import os.path as osp
import subprocess
import sys

from tests.fixtures.paths import REPO

HOOK_CHECK = f'''
import importlib.util, sys
spec = importlib.util.spec_from_file_location('_mmpola_config_scope', {osp.join(REPO, 'mmpola', 'config_scope.py')!r})
hook = importlib.util.module_from_spec(spec); spec.loader.exec_module(hook)
hook.install_import_hook()                         # what the wheel's .pth line runs at start-up
assert not any(m.startswith(('mmengine', 'mmpola', 'torch')) for m in sys.modules), 'the hook imported something'
from mmengine.config.utils import MODULE2PACKAGE, _get_package_and_cfg_path
assert MODULE2PACKAGE['mmpola'] == 'mmpola'
assert _get_package_and_cfg_path('mmpola::detection/x.py') == ('mmpola', 'detection/x.py')
import inspect, mmengine.config.utils as utils
assert 'MODULE2PACKAGE' in inspect.getsource(utils)  # the wrapped loader still serves mmengine's source
print('ok')
'''


def test_start_up_hook_registers_mmpola_when_mmengine_loads_its_config_utils():
    res = subprocess.run([sys.executable, '-c', HOOK_CHECK], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith('ok'), res.stdout[-3000:]


def test_import_mmpola_registers_the_scope_once():
    import mmengine.config.utils as utils

    import mmpola  # noqa: F401
    from mmpola.config_scope import install_import_hook, register_config_scope
    assert utils.MODULE2PACKAGE['mmpola'] == 'mmpola'
    register_config_scope()
    install_import_hook()  # mmengine already loaded: registers at once, adds no finder
    assert list(utils.MODULE2PACKAGE).count('mmpola') == 1
    assert not [f for f in sys.meta_path if type(f).__name__ == 'ConfigScopeFinder' or
                getattr(f, '__name__', '') == 'ConfigScopeFinder']
