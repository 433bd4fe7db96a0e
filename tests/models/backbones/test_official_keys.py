"""Every released size of the lineage (Pola, FLatten, InLine on PVT, PVTv2, Swin, CSWin and DeiT) has the
official parameter names and shapes, and the published backbone parameter counts.

Built on the meta device: no memory, no init cost.
"""
import json
import math
import re

import pytest
import torch

from mmpola.models import (
    FLattenCSWin,
    FLattenPVT,
    FLattenPVTv2,
    FLattenSwin,
    ImageClassifier,
    InLineCSWin,
    InLineDeiT,
    InLinePVT,
    InLineSwin,
    PolaPVT,
    PolaSwin,
)

# entry name: (backbone class, arch, backbone parameters without the dense-only output norms)
SIZES = {
    'pola_pvt_tiny': (PolaPVT, 'tiny', 12_410_624),
    'pola_pvt_small': (PolaPVT, 'small', 22_643_200),
    'pola_pvt_medium': (PolaPVT, 'medium', 39_451_648),
    'pola_pvt_large': (PolaPVT, 'large', 53_852_544),
    'pola_swin_tiny': (PolaSwin, 'tiny', 28_515_160),
    'pola_swin_small': (PolaSwin, 'small', 49_833_064),
    'pola_swin_base': (PolaSwin, 'base', 88_110_816),
    'flatten_pvt_tiny': (FLattenPVT, 'tiny', 11_636_480),
    'flatten_pvt_small': (FLattenPVT, 'small', 21_156_224),
    'flatten_pvt_medium': (FLattenPVT, 'medium', 36_728_192),
    'flatten_pvt_large': (FLattenPVT, 'large', 50_135_168),
    'inline_pvt_tiny': (InLinePVT, 'tiny', 11_519_232),
    'inline_pvt_small': (InLinePVT, 'small', 21_043_136),
    'inline_pvt_medium': (InLinePVT, 'medium', 37_105_856),
    'inline_pvt_large': (InLinePVT, 'large', 50_641_280),
    'flatten_swin_tiny': (FLattenSwin, 'tiny', 28_421_848),
    'flatten_swin_small': (FLattenSwin, 'small', 49_739_752),
    'flatten_swin_base': (FLattenSwin, 'base', 87_945_440),
    'inline_swin_tiny': (InLineSwin, 'tiny', 28_453_008),
    'inline_swin_small': (InLineSwin, 'small', 49_022_760),
    'inline_swin_base': (InLineSwin, 'base', 87_323_072),
}
_CLASSIFICATION_ONLY = re.compile(r'^(head|norm)\.')
_BUFFERS = re.compile(r'(attn_mask|relative_position_index)$')
_OUT_NORM = re.compile(r'^norm\d\.')


@pytest.fixture(scope='module')
def manifest(data_file):
    """Both key manifests made from the official code: Pola's, and FLatten / InLine / PolaFormer++'s."""
    keys = {}
    for name in ('official_key_manifest.json', 'lineage_key_manifest.json', 'macro_key_manifest.json'):
        with open(data_file(name)) as f:
            keys.update(json.load(f))
    return keys


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
    assert sum(p.numel() for k, p in model.named_parameters() if not _OUT_NORM.match(k)) == n_params


@pytest.mark.parametrize('name', list(SIZES))
def test_classifier_matches_official_total(manifest, name):
    """The classifier owns exactly the official tensors (minus recomputed buffers and, for PVT, the
    final norm the official forward never uses)."""
    kind, family, _ = name.split('_')
    with torch.device('meta'):
        model = ImageClassifier(family=family, kind=kind, arch=SIZES[name][1])
    ours = {re.sub(r'^backbone\.', '', k): tuple(v.shape) for k, v in model.state_dict().items()}
    official = {k: tuple(v) for k, v in manifest[name]['keys'].items() if not _BUFFERS.search(k)}
    unused = {k: v for k, v in official.items() if family == 'pvt' and k.startswith('norm.')}
    if kind == 'pola':
        assert sorted(unused) == ([] if family == 'swin' else ['norm.bias', 'norm.weight'])
    assert ours == {k: v for k, v in official.items() if k not in unused}
    n_unused = sum(math.prod(shape) for shape in unused.values())
    assert sum(p.numel() for p in model.parameters()) == manifest[name]['params_total'] - n_unused


# the other macro architectures of the FLatten and InLine releases: entry name: (backbone class, arch,
# backbone parameters of the dense backbone: PVTv2's stage norms included, CSWin's and DeiT's final
# classification norm and the dense output norms left out)
MACRO = {
    'flatten_pvt_v2_b0': (FLattenPVTv2, 'b0', 3_337_824),
    'flatten_pvt_v2_b1': (FLattenPVTv2, 'b1', 12_418_240),
    'flatten_pvt_v2_b2': (FLattenPVTv2, 'b2', 22_035_264),
    'flatten_pvt_v2_b3': (FLattenPVTv2, 'b3', 37_760_832),
    'flatten_pvt_v2_b4': (FLattenPVTv2, 'b4', 51_323_968),
    'flatten_cswin_tiny': (FLattenCSWin, 'tiny', 20_687_744),
    'flatten_cswin_small': (FLattenCSWin, 'small', 34_937_728),
    'flatten_cswin_base': (FLattenCSWin, 'base', 74_096_496),
    'flatten_cswin_base_384': (FLattenCSWin, 'base_384', 77_598_576),
    'inline_cswin_tiny': (InLineCSWin, 'tiny', 20_090_496),
    'inline_cswin_small': (InLineCSWin, 'small', 32_518_848),
    'inline_cswin_base': (InLineCSWin, 'base', 72_643_104),
    'inline_cswin_base_384': (InLineCSWin, 'base_384', 72_643_104),
    'inline_deit_tiny': (InLineDeiT, 'tiny', 6_284_736 - 384),
    'inline_deit_small': (InLineDeiT, 'small', 16_413_760 - 640),
    'inline_deit_base': (InLineDeiT, 'base', 23_412_096 - 768),
}
_HEAD = re.compile(r'^head\.')
_FINAL_NORM = re.compile(r'^norm\.')  # CSWin's and DeiT's classification norm (PVTv2's are norm1..norm4)


@pytest.mark.parametrize('name', list(MACRO))
def test_macro_backbone_keys_shapes_and_param_count(manifest, name):
    cls, arch, n_params = MACRO[name]
    with torch.device('meta'):
        model = cls(arch=arch)
    dense_only = tuple(m + '.' for m in model.dense_only_modules())
    official = {k: tuple(v) for k, v in manifest[name]['keys'].items()
                if not _HEAD.match(k) and not _FINAL_NORM.match(k)}
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith(dense_only)}
    assert sorted(set(official) - set(ours)) == []
    assert sorted(set(ours) - set(official)) == []
    assert {k: v for k, v in ours.items() if official[k] != v} == {}
    assert sum(p.numel() for k, p in model.named_parameters() if not k.startswith(dense_only)) == n_params


@pytest.mark.parametrize('name', list(MACRO))
def test_macro_classifier_matches_official_total(manifest, name):
    """The classifier (its timm entry) owns exactly the official tensors and parameter count."""
    import timm
    with torch.device('meta'):
        model = timm.create_model(name)
    ours = {re.sub(r'^backbone\.', '', k): tuple(v.shape) for k, v in model.state_dict().items()}
    assert ours == {k: tuple(v) for k, v in manifest[name]['keys'].items()}
    assert sum(p.numel() for p in model.parameters()) == manifest[name]['params_total']
