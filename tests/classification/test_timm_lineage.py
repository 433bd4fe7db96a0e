"""timm entries of FLatten and InLine: official files load as they are and reproduce the official
logits and stage maps (golden mini models of tests/data)."""

import pytest
import timm
import torch

from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
from mmpola.models.timm_models import TIMM_MODEL_ARGS

MINIS = ['flatten_pvt', 'flatten_swin', 'inline_pvt', 'inline_swin']
def _golden(golden_data, name):
    expected, checkpoint = golden_data(name)
    kwargs = official_kwargs_to_classifier_kwargs(expected['constructor'])
    for key in ('family', 'kind'):
        kwargs.pop(key)
    return expected, checkpoint, kwargs


def test_entries_registered():
    names = {f'{k}_{f}_{s}' for k in ('flatten', 'inline') for f, sizes in
             (('pvt', ('tiny', 'small', 'medium', 'large')), ('swin', ('tiny', 'small', 'base'))) for s in sizes}
    assert names <= set(TIMM_MODEL_ARGS) and names <= set(timm.list_models(['flatten_*', 'inline_*']))
    with torch.device('meta'):
        model = timm.create_model('inline_swin_small')
    assert model.kind == 'inline' and model.backbone.attn_type == 'IIIS'
    assert 'InLine' in model.pretrained_cfg['origin_url']
    with pytest.raises(ValueError, match="'flatten' attention model; kind='pola'"):
        timm.create_model('flatten_pvt_tiny', kind='pola')


@pytest.mark.parametrize('name', MINIS)
def test_checkpoint_path_reproduces_official(golden_data, name):
    expected, ckpt, kwargs = _golden(golden_data, name)
    model = timm.create_model(f'{name}_tiny', checkpoint_path=ckpt, **kwargs).eval()
    with torch.no_grad():
        assert (model(expected['input']) - expected['logits']).abs().max() <= 1e-4
    kwargs.pop('num_classes')
    features = timm.create_model(f'{name}_tiny', features_only=True, pretrained=True,
                                 pretrained_cfg_overlay=dict(file=ckpt), **kwargs).eval()
    with torch.no_grad():
        maps = features(expected['input'])
    for i, (ours, ref) in enumerate(zip(maps, expected['stages'])):
        assert (ours - ref).abs().max() <= 1e-4, f'stage {i}'
