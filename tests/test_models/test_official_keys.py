"""Every released size has the official parameter names and shapes, and the parameter counts of the papers.

Built on the meta device: no memory, no init cost.
"""
import json
import math
import re

import pytest
import torch

from mmpola.models import PolaClassifier, PolaPVT, PolaSwin

SIZES = {
    'pola_pvt_tiny': (PolaPVT, 'tiny', 12_410_624),
    'pola_pvt_small': (PolaPVT, 'small', 22_643_200),
    'pola_pvt_medium': (PolaPVT, 'medium', 39_451_648),
    'pola_pvt_large': (PolaPVT, 'large', 53_852_544),
    'pola_swin_tiny': (PolaSwin, 'tiny', 28_515_160),
    'pola_swin_small': (PolaSwin, 'small', 49_833_064),
    'pola_swin_base': (PolaSwin, 'base', 88_110_816),
}
_CLASSIFICATION_ONLY = re.compile(r'^(head|norm)\.')
_BUFFERS = re.compile(r'(attn_mask|relative_position_index)$')
_OUT_NORM = re.compile(r'^norm\d\.')


@pytest.fixture(scope='module')
def manifest(data_file):
    with open(data_file('official_key_manifest.json')) as f:
        return json.load(f)


@pytest.mark.parametrize('name', list(SIZES))
def test_backbone_keys_shapes_and_param_count(manifest, name):
    cls, arch, n_params = SIZES[name]
    with torch.device('meta'):
        model = cls(arch=arch)
    official = {k: tuple(v) for k, v in manifest[name]['keys'].items()
                if not _CLASSIFICATION_ONLY.match(k) and not _BUFFERS.search(k)}
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items() if not _OUT_NORM.match(k)}
    assert sorted(set(official) - set(ours)) == []
    assert sorted(set(ours) - set(official)) == []
    assert {k: v for k, v in ours.items() if official[k] != v} == {}
    count = sum(p.numel() for k, p in model.named_parameters() if not _OUT_NORM.match(k))
    assert count == n_params


@pytest.mark.parametrize('name', list(SIZES))
def test_classifier_matches_official_total(manifest, name):
    """The classifier owns exactly the official tensors (minus recomputed buffers and, for Pola-PVT,
    the final norm its forward never uses)."""
    cls, arch, _ = SIZES[name]
    with torch.device('meta'):
        model = PolaClassifier(family='pvt' if cls is PolaPVT else 'swin', arch=arch)
    ours = {re.sub(r'^backbone\.', '', k): tuple(v.shape) for k, v in model.state_dict().items()}
    official = {k: tuple(v) for k, v in manifest[name]['keys'].items() if not _BUFFERS.search(k)}
    unused = {k: v for k, v in official.items() if cls is PolaPVT and k.startswith('norm.')}
    assert sorted(unused) == ([] if cls is PolaSwin else ['norm.bias', 'norm.weight'])
    assert ours == {k: v for k, v in official.items() if k not in unused}
    n_unused = sum(math.prod(shape) for shape in unused.values())
    assert sum(p.numel() for p in model.parameters()) == manifest[name]['params_total'] - n_unused
