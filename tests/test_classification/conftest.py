"""Fixtures of the classification tests: golden official mini models, a tiny generated dataset."""
import os.path as osp

import pytest

import mmpola  # noqa: F401  (registers the models, installs the safe loader)
import mmpola.classification  # noqa: F401
from mmpola.safe_load import safe_torch_load

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DATA = osp.join(REPO_ROOT, 'tests', 'data')


def data_path(name):
    path = osp.join(DATA, name)
    if not osp.isfile(path):
        pytest.fail(f'golden file {path} is missing (restore tests/data from the repository)')
    return path


@pytest.fixture(autouse=True)
def _no_compile(monkeypatch):
    """Keep the attention core eager: a torch.compile build costs seconds per new shape on CPU."""
    monkeypatch.setenv('MMPOLA_NO_COMPILE', '1')


@pytest.fixture(scope='session')
def golden():
    """{'pvt' | 'swin': (expected dict, official checkpoint path)}; expected holds 'input',
    'logits', 'stages' and the official 'constructor' kwargs."""
    return {n: (safe_torch_load(data_path(f'pola_{n}_mini_expected.pth')),
                data_path(f'pola_{n}_mini_official.pth')) for n in ('pvt', 'swin')}


@pytest.fixture(scope='session')
def tiny_imagenet(tmp_path_factory):
    """A tiny demo dataset in the ImageNet layout: 6 classes, 4 train / 2 val images each, 64 px."""
    from mmpola.classification.demo_imagenet import make_demo_imagenet
    root = str(tmp_path_factory.mktemp('tiny_imagenet'))
    make_demo_imagenet(root, num_train=4, num_val=2, size=64, seed=0)
    return root
