"""mmpola.checkpoint: every checkpoint layout our users have loads into the backbones
(docs/design.md, "Checkpoints: official names, loading is a filter")."""
import logging
import os.path as osp
import sys
from collections import OrderedDict

import numpy as np
import pytest
import torch

import mmpola  # noqa: F401
from mmpola.checkpoint import CheckpointMismatchError, find_key_prefix, load_checkpoint
from mmpola.checkpoint.reading import safe_torch_load
from mmpola.models import ImageClassifier, PolaPVT, PolaSwin
from tests.fixtures.checkpoints import classifier_from_official
from tests.fixtures.paths import DATA  # noqa: E402


def _golden(family):
    path = osp.join(DATA, f'pola_{family}_mini_official.pth')
    if not osp.isfile(path):
        pytest.fail(f'golden file {path} is missing (tests/data is ignored by the .gitignore rule '
                    "'data/'; restore it from the repository's test data)")
    return path, safe_torch_load(osp.join(DATA, f'pola_{family}_mini_expected.pth'))['constructor']


def _mini(family, **kwargs):
    """The golden mini backbone architecture, random weights."""
    _, c = _golden(family)
    if family == 'pvt':
        arch = {k: list(c[k]) for k in ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')}
        return PolaPVT(arch=arch, **kwargs)
    arch = dict(embed_dims=c['embed_dim'], depths=list(c['depths']), num_heads=list(c['num_heads']))
    return PolaSwin(arch=arch, **kwargs)


@pytest.fixture(scope='module')
def official():
    """{'pvt' | 'swin': (path, official state dict)}."""
    out = {}
    for family in ('pvt', 'swin'):
        path, _ = _golden(family)
        out[family] = (path, safe_torch_load(path)['model'])
    return out


def _assert_loaded_official(model, state_dict):
    for key, value in model.state_dict().items():
        if key in state_dict:
            assert torch.equal(value, state_dict[key]), key


def test_official_container(official):
    path, sd = official['pvt']
    model = _mini('pvt')
    report = load_checkpoint(model, path)
    _assert_loaded_official(model, sd)
    assert report.origin == "'model'" and report.prefix == ''
    assert len(report.loaded) == len(model.state_dict())
    assert not report.missing and not report.unexpected
    assert sorted(report.dropped) == ['head.bias', 'head.weight', 'norm.bias', 'norm.weight']


def test_swin_attn_mask_and_index_dropped(official):
    path, sd = official['swin']
    model = _mini('swin')
    report = load_checkpoint(model, path)
    _assert_loaded_official(model, sd)
    assert any(k.endswith('attn_mask') for k in report.dropped)
    assert any(k.endswith('relative_position_index') for k in report.dropped)
    assert not report.unexpected
    assert sorted(report.missing) == sorted(f'norm{i}.{p}' for i in range(4) for p in ('weight', 'bias'))
    assert not any(k.endswith('attn_mask') for k in model.state_dict())


def test_swin_map_final_norm(official):
    path, sd = official['swin']
    model = _mini('swin')
    load_checkpoint(model, path, map_final_norm=True)
    assert torch.equal(model.norm3.weight, sd['norm.weight'])
    # from a classifier run: the final norm sits beside 'backbone.'
    classifier_sd = {f'model.backbone.{k}': v for k, v in sd.items() if not k.startswith('norm.')}
    classifier_sd['model.norm.weight'] = sd['norm.weight'] + 1
    classifier_sd['model.norm.bias'] = sd['norm.bias']
    model = _mini('swin')
    load_checkpoint(model, {'state_dict': classifier_sd}, map_final_norm=True)
    assert torch.equal(model.norm3.weight, sd['norm.weight'] + 1)


@pytest.mark.parametrize('layout', ['bare', 'module.', 'backbone.', 'module.backbone.', 'detector'])
def test_prefixed_and_bare_variants(official, tmp_path, layout):
    _, sd = official['pvt']
    if layout == 'bare':
        ckpt = OrderedDict(sd)
    elif layout == 'detector':  # what mmdet saves: backbone.* next to neck.* / heads, mmengine meta
        ckpt = {'state_dict': OrderedDict([(f'backbone.{k}', v) for k, v in sd.items()] +
                                          [('neck.lateral_convs.0.conv.weight', torch.zeros(4, 4, 1, 1))]),
                'meta': {'epoch': 12, 'seed': np.int64(0), 'mmengine_version': '0.10.7'}}
    else:
        ckpt = OrderedDict((layout + k, v) for k, v in sd.items())
    path = tmp_path / 'ckpt.pth'
    torch.save(ckpt, path)
    model = _mini('pvt')
    report = load_checkpoint(model, str(path))
    _assert_loaded_official(model, sd)
    assert len(report.loaded) == len(model.state_dict())
    assert report.prefix == {'bare': '', 'detector': 'backbone.'}.get(layout, layout)


def test_explicit_prefix_and_init_cfg(official, tmp_path):
    _, sd = official['swin']
    path = tmp_path / 'seg.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in sd.items()}}, path)
    model = _mini('swin', init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix='backbone.'))
    model.init_weights()
    _assert_loaded_official(model, sd)
    with pytest.raises(CheckpointMismatchError, match='no key matching'):
        load_checkpoint(_mini('swin'), str(path), prefix='model.')


def test_classifier_run_checkpoint_loads_into_backbone(official, tmp_path):
    """An ImageNet run of ImageClassifier saves backbone.* / norm.* / head.*: loads with no conversion."""
    path, sd = official['pvt']
    _, constructor = _golden('pvt')
    clf = classifier_from_official(ImageClassifier, constructor)
    clf.load_checkpoint(path)
    out = tmp_path / 'epoch_300.pth'
    torch.save({'meta': {'epoch': 300}, 'state_dict': clf.state_dict(), 'message_hub': {}}, out)
    model = _mini('pvt', init_cfg=dict(type='Pretrained', checkpoint=str(out)))
    model.init_weights()
    _assert_loaded_official(model, sd)


def test_ema_preference(official):
    _, sd = official['pvt']
    ema = OrderedDict((k, v + 1) for k, v in sd.items())
    ckpt = {'model': sd, 'model_ema': ema}
    model = _mini('pvt')
    report = load_checkpoint(model, ckpt)
    assert 'EMA' in report.origin
    assert torch.equal(model.pos_embed1, ema['pos_embed1'])
    load_checkpoint(model, ckpt, use_ema=False)
    assert torch.equal(model.pos_embed1, sd['pos_embed1'])


def test_swin_checkpoint_into_pvt_is_refused(official):
    path, _ = official['swin']
    with pytest.raises(CheckpointMismatchError, match=r"no key matching PolaPVT.*'block1\.\*'.*Pola-Swin"):
        load_checkpoint(_mini('pvt'), path)
    path, _ = official['pvt']
    with pytest.raises(CheckpointMismatchError, match=r'layers\.0\.blocks.*Pola-PVT'):
        load_checkpoint(_mini('swin'), path)


def test_la_sr_mismatch_names_the_fix(official):
    path, _ = official['pvt']
    with pytest.raises(CheckpointMismatchError, match="la_sr_ratios='1111'"):
        load_checkpoint(_mini('pvt', la_sr_ratios='8421'), path)


def test_resize_to_another_pretraining_grid(official):
    path, sd = official['pvt']
    model = _mini('pvt', pretrain_img_size=256)
    report = load_checkpoint(model, path)
    assert model.pos_embed1.shape == (1, 64 * 64, 16)
    assert model.block1[0].attn.positional_encoding.shape == (1, 64 * 64, 16)
    assert any(r.startswith('pos_embed1:') for r in report.resized)
    assert not report.mismatched and not report.missing
    path, sd = official['swin']
    swin = _mini('swin', softmax_window_size=12, pretrain_img_size=448)
    report = load_checkpoint(swin, path)
    table = swin.layers[2].blocks[0].attn.relative_position_bias_table
    assert table.shape == (23 * 23, 4)
    # the Pola positional encodings follow the pretraining grid: 56 -> 112 at 448
    assert swin.layers[0].blocks[0].attn.positional_encoding.shape == (1, 112 * 112, 16)
    assert any('relative_position_bias_table' in r for r in report.resized)
    assert any('layers.1.blocks.0.attn.positional_encoding' in r for r in report.resized)


def test_strict_mode_reports_missing(official):
    path, _ = official['swin']
    with pytest.raises(CheckpointMismatchError, match='norm0'):
        load_checkpoint(_mini('swin'), path, strict=True)
    load_checkpoint(_mini('swin', out_norm=False), path, strict=True)


def test_prefix_search():
    model_keys = ['a.b', 'c']
    assert find_key_prefix(['x.y.a.b', 'x.y.c', 'q'], model_keys) == ('x.y.', 2)
    assert find_key_prefix(['z'], model_keys) == ('', 0)


def test_loading_needs_no_yacs(official, monkeypatch):
    """The official config is a yacs CfgNode; it comes back as plain dicts and yacs is never
    imported (a stand-in module that raises on import proves it)."""
    path, _ = official['swin']
    monkeypatch.setitem(sys.modules, 'yacs', None)  # `import yacs` now raises ImportError
    monkeypatch.setitem(sys.modules, 'yacs.config', None)
    from mmpola.checkpoint import read_checkpoint
    ckpt = read_checkpoint(path)
    assert isinstance(ckpt['config'], dict)
    load_checkpoint(_mini('swin'), path)


def test_the_classifier_loads_through_the_same_path(official):
    """A classifier's load_checkpoint is load_checkpoint: the official file mapped below ``backbone.`` (its
    unused final norm dropped), one report line, the LoadReport returned (torch's names too)."""
    path, sd = official['pvt']
    _, constructor = _golden('pvt')
    clf = classifier_from_official(ImageClassifier, constructor)
    logger = logging.getLogger('mmpola.test_classifier_report')
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        report = clf.load_checkpoint(path, logger=logger)
    finally:
        logger.removeHandler(handler)
    assert len(records) == 1 and records[0].getMessage().startswith(f'ImageClassifier: loaded {len(report.loaded)}/')
    assert report.prefix == '' and not report.missing_keys and not report.unexpected_keys
    assert all(key.startswith('norm.') for key in report.dropped)
    for key, value in sd.items():
        if 'backbone.' + key in report.loaded:
            assert torch.equal(clf.state_dict()['backbone.' + key], value), key
    assert torch.equal(clf.head.weight, sd['head.weight'])
