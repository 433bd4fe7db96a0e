"""FLatten-PVTv2, FLatten-CSWin, InLine-CSWin, InLine-DeiT (at 224 and 288) and InLine-Swin's mixed
stage layout ('IIMS2'): the classifiers and the dense backbones reproduce the official models
(golden mini models of tests/data, made by the official FLatten-Transformer and InLine code).

Stages of the golden data: PVTv2 after each stage's norm; CSWin and Swin the last block of each
stage; DeiT the patch tokens after every block, then after the final norm.
"""
import pytest
import torch

from mmpola.models import ImageClassifier
from mmpola.models.backbones import backbone_class
from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
from tests.fixtures.checkpoints import classifier_from_official

# golden mini model: its architecture
MINIS = {'flatten_pvt_v2': 'pvt_v2', 'flatten_cswin': 'cswin', 'inline_cswin': 'cswin',
         'inline_deit_mini_224': 'vit', 'inline_deit_mini_288': 'vit', 'inline_swin_mixed': 'swin'}
TOL = {'reference': 1e-5, 'auto': 1e-4}


def _classifier(golden_data, name, impl):
    expected, ckpt = golden_data(name)
    model = classifier_from_official(ImageClassifier, expected['constructor'], family=MINIS[name], attn_impl=impl)
    model.load_checkpoint(ckpt, strict=True)
    return model.eval(), expected


def _outputs(model, x):
    """(logits, [every stage map], then for a ViT the last block's map through the final norm)."""
    with torch.no_grad():
        features, maps = model.forward_intermediates(x)
        if model.family == 'vit':
            maps += model.forward_intermediates(x, indices=[-1], norm=True, intermediates_only=True)
        return model.forward_head(features), maps


@pytest.mark.parametrize('impl', ['reference', 'auto'])
@pytest.mark.parametrize('name', list(MINIS))
def test_classifier_reproduces_official(golden_data, name, impl):
    """The official logits and every stage: within 1e-5 on the reference path (the official op order),
    1e-4 on the default path."""
    model, expected = _classifier(golden_data, name, impl)
    logits, maps = _outputs(model, expected['input'])
    assert (logits - expected['logits']).abs().max() <= TOL[impl]
    assert len(maps) == len(expected['stages'])
    for i, (ours, ref) in enumerate(zip(maps, expected['stages'])):
        assert ours.shape == ref.shape, i
        assert (ours - ref).abs().max() <= TOL[impl], f'stage {i}'


def _dense(golden_data, name, **overrides):
    """The dense backbone of a golden mini model (its released preset), initialised with
    init_cfg=Pretrained from the official file."""
    expected, ckpt = golden_data(name)
    kwargs = official_kwargs_to_classifier_kwargs(expected['constructor'], MINIS[name])
    family, kind = kwargs.pop('family'), kwargs.pop('kind')
    for key in ('num_classes', 'drop_rate', 'drop_path_rate'):
        kwargs.pop(key, None)
    backbone = backbone_class(family, kind)(**kwargs, **overrides, attn_impl='reference', drop_path_rate=0.,
                                            init_cfg=dict(type='Pretrained', checkpoint=ckpt))
    backbone.init_weights()
    return backbone.eval(), expected


# the dense settings that give the official classification features at the pretraining size
DENSE = {'flatten_pvt_v2': {}, 'flatten_cswin': dict(out_norm=False), 'inline_cswin': dict(out_norm=False),
         'inline_swin_mixed': dict(out_norm=False, clamp_shift=True)}


@pytest.mark.parametrize('name', list(DENSE))
def test_dense_backbone_reproduces_official_stages(golden_data, name):
    backbone, expected = _dense(golden_data, name, **DENSE[name])
    with torch.no_grad():
        outs = backbone(expected['input'])
    assert len(outs) == 4
    for i, (ours, ref) in enumerate(zip(outs, expected['stages'])):
        assert (ours - ref).abs().max() <= 1e-5, f'stage {i}'


@pytest.mark.parametrize('name', ['inline_deit_mini_224', 'inline_deit_mini_288'])
def test_dense_vit_reproduces_official_blocks(golden_data, name):
    """Every block's patch map (the class token dropped), and with final_norm the last one through the
    trained final norm (loaded from the official ``norm``)."""
    depth = golden_data(name)[0]['constructor']['depth']
    backbone, expected = _dense(golden_data, name, out_indices=tuple(range(depth)), final_norm=True)
    with torch.no_grad():
        outs = backbone(expected['input'])
    raw, _ = _dense(golden_data, name, out_indices=(depth - 1,))
    with torch.no_grad():
        last_raw = raw(expected['input'])[0]
    for i, (ours, ref) in enumerate(zip(outs[:-1], expected['stages'])):
        assert (ours - ref).abs().max() <= 1e-5, f'block {i}'
    assert (last_raw - expected['stages'][depth - 1]).abs().max() <= 1e-5
    assert (outs[-1] - expected['stages'][depth]).abs().max() <= 1e-5  # the final norm
