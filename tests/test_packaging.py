"""mmpola as a package in a user's own environment: the wheel holds the configs and tools
(``mmpola/.mim``), its metadata does not require mmcv, and an outside project inherits
``mmpola::`` configs and trains with mmdet's own ``tools/train.py``; ``requirements/pins.txt`` as pip's
constraints installs the set-up's environment."""
import json
import os
import os.path as osp
import pathlib
import subprocess
import sys
import textwrap
import zipfile

import mmdet
import pytest
from packaging.requirements import Requirement

import mmpola
from mmpola.datasets.demo_coco import make_demo_coco
from tests.fixtures.packaging import build_wheel, clean_env, install_into_separate_env
from tests.fixtures.paths import CONFIGS, REPO, TOOLS

PINS = osp.join(REPO, 'requirements', 'pins.txt')


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    return build_wheel(str(tmp_path_factory.mktemp('wheel')))


def test_wheel_holds_configs_tools_and_the_config_scope_hook(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        modes = {info.filename: info.external_attr >> 16 for info in z.infolist()}
        metadata = z.read(next(n for n in names if n.endswith('.dist-info/METADATA'))).decode()
        pth = z.read('mmpola-config-scope.pth').decode()
    configs = {osp.relpath(osp.join(d, f), CONFIGS) for d, _, files in os.walk(CONFIGS) for f in files
               if f.endswith('.py')}
    assert configs and {f'mmpola/.mim/configs/{c}' for c in configs} <= names
    tools = {f for f in os.listdir(TOOLS) if f.endswith(('.py', '.sh'))}
    assert {f'mmpola/.mim/tools/{t}' for t in tools} <= names
    assert modes['mmpola/.mim/tools/train.py'] & 0o111  # executable, as in the checkout
    assert {'mmpola/.mim/model-index.yml', '_mmpola_config_scope.py', 'mmpola/config_scope.py'} <= names
    assert pth.strip() == 'import _mmpola_config_scope; _mmpola_config_scope.install_import_hook()'
    requires = [line for line in metadata.splitlines() if line.startswith('Requires-Dist:')]
    assert not [r for r in requires if 'mmcv' in r and 'extra ==' not in r]  # mmcv is no hard requirement
    assert not [r for r in requires if 'einops' in r]
    assert 'Requires-Python: >=3.10' in metadata and 'License-Expression: Apache-2.0' in metadata


OUTSIDE_CONFIG = textwrap.dedent('''
    # an outside project's config: mmpola's demo detector, one training iteration
    _base_ = ['mmpola::demo/mask-rcnn_pola-pvt-t_fpn_demo-coco.py']
    custom_imports = dict(imports=['mmpola'], allow_failed_imports=False)
    train_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False)
    train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=1)
    val_dataloader = val_cfg = val_evaluator = None
    test_dataloader = test_cfg = test_evaluator = None
    param_scheduler = []
    default_hooks = dict(checkpoint=dict(by_epoch=False, interval=1), logger=dict(interval=1))
''')


def test_outside_project_trains_with_mmdets_own_train_script(wheel, tmp_path):
    python, purelib = install_into_separate_env(wheel, str(tmp_path))
    project = tmp_path / 'project'
    project.mkdir()
    (project / 'tiny_detector.py').write_text(OUTSIDE_CONFIG)
    make_demo_coco(str(project / 'data' / 'demo_coco'), num_train=2, num_val=1)
    env = clean_env()
    where = subprocess.run([python, '-c', 'import importlib.util as u; print(u.find_spec("mmpola").origin)'],
                           cwd=project, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    assert where.startswith(purelib), where  # the installed wheel, not the checkout
    mmdet_train = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')  # mmdet's own script
    res = subprocess.run([python, mmdet_train, 'tiny_detector.py', '--work-dir', 'work'], cwd=project, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:]
    assert (project / 'work' / 'iter_1.pth').is_file(), res.stdout[-2000:]
    assert 'mmpola is not installed' not in res.stdout  # mmengine finds mmpola's registries


def test_loading_a_config_with_an_mmdet_base_prints_no_warning():
    """mmengine resolves `mmdet::` bases with pkg_resources; the pinned setuptools (requirements/pins.txt)
    keeps that a DeprecationWarning for mmengine's developers instead of two UserWarnings at every start."""
    from importlib.metadata import version

    from tests.fixtures.paths import REPO
    pinned = next(line.split('==')[1].strip() for line in open(osp.join(REPO, 'requirements', 'pins.txt'))
                  if line.startswith('setuptools=='))
    assert version('setuptools') == pinned, (f'setuptools {version("setuptools")} is installed, the pin is {pinned}: '
                                            'run tools/setup_env.py')
    # what mmengine runs for every `pkg::` base of a config: import and reload pkg_resources
    check = "from mmengine.utils import is_installed; assert is_installed('mmdet')"
    res = subprocess.run([sys.executable, '-W', 'error::UserWarning', '-c', check],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert res.returncode == 0 and 'Warning' not in res.stdout, res.stdout[-3000:]


def test_pins_as_constraints_install_the_tested_environment(wheel, tmp_path):
    """docs/install.md's pip commands (``pip install ".[det,seg]" -c requirements/pins.txt``, then
    ``wheel ninja`` and mmcv) resolve, offline against this environment (the set-up's, which CI tests), to
    nothing but mmpola: every pin is a version the set-up installed and satisfies what mmpola, mmdet, mmseg
    and mmcv require. (Downloading is pip's; mmcv's ``--no-build-isolation`` build is the set-up's own.)"""
    from importlib.metadata import version
    for line in open(PINS):
        line = line.split('#', 1)[0].strip()
        if line:
            pin = Requirement(line)
            installed = version(pin.name)
            assert pin.specifier.contains(installed), f'{pin} in requirements/pins.txt, {installed} installed: ' \
                                                      'run tools/setup_env.py'
    env = clean_env()
    env.pop('PIP_FIND_LINKS', None)  # only what is installed here, not a machine's local wheel folder
    env['PIP_CONFIG_FILE'] = os.devnull
    report = tmp_path / 'report.json'
    res = subprocess.run([sys.executable, '-m', 'pip', 'install', '--dry-run', '--no-index', '--quiet', '--report',
                          str(report), '-c', PINS, f'mmpola[det,seg] @ {pathlib.Path(wheel).as_uri()}', 'mmcv', 'wheel',
                          'ninja'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    planned = [(item['metadata']['name'], item['metadata']['version'])
               for item in json.loads(report.read_text())['install']]
    assert planned == [('mmpola', mmpola.__version__)]
