"""Shared fixtures for the backbone / classifier tests: the golden mini models of tests/data."""
import os.path as osp

import pytest

import mmpola  # noqa: F401  (registers the models, installs the safe loader)
from mmpola.safe_load import safe_torch_load

DATA = osp.join(osp.dirname(osp.dirname(__file__)), 'data')


@pytest.fixture(scope='session')
def data_file():
    """``data_file(name)``: path of a file in tests/data (fails clearly when it is missing)."""
    return data_path


def data_path(name):
    path = osp.join(DATA, name)
    if not osp.isfile(path):
        pytest.fail(f'golden file {path} is missing (tests/data is ignored by the .gitignore rule '
                    "'data/'; restore it from the repository's test data)")
    return path


@pytest.fixture(autouse=True)
def _no_compile(monkeypatch):
    """Keep the attention core eager: a torch.compile build costs seconds per new shape on CPU."""
    monkeypatch.setenv('MMPOLA_NO_COMPILE', '1')


@pytest.fixture(scope='session')
def golden():
    """{'pvt' | 'swin': (expected dict, official checkpoint path)}."""
    return {n: (safe_torch_load(data_path(f'pola_{n}_mini_expected.pth')),
                data_path(f'pola_{n}_mini_official.pth')) for n in ('pvt', 'swin')}


@pytest.fixture(scope='session')
def mini_kwargs():
    """``mini_kwargs(family, constructor)``: backbone kwargs of a golden mini model."""
    return _mini_backbone_kwargs


def _mini_backbone_kwargs(family, constructor):
    """Backbone kwargs of a golden mini model from the official constructor kwargs."""
    c = constructor
    if family == 'pvt':
        return dict(arch={k: list(c[k]) for k in ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')},
                    la_sr_ratios=c['la_sr_ratios'], attn_type=c['attn_type'],
                    pretrain_img_size=c['img_size'])
    return dict(arch=dict(embed_dims=c['embed_dim'], depths=list(c['depths']),
                          num_heads=list(c['num_heads'])),
                window_size=c['window_size'], attn_type=c['attn_type'],
                pretrain_img_size=c['img_size'])
