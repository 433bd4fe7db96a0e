"""FLatten and InLine: the classifiers and the dense backbones reproduce the official models
(golden mini models of tests/data, made by the official FLatten-Transformer and InLine code)."""
import pytest
import torch

from mmpola.models import (
    FLattenPVT,
    FLattenSwin,
    FocusedLinearAttention,
    ImageClassifier,
    InLineAttention,
    InLinePVT,
    InLineSwin,
)
from tests.fixtures.checkpoints import classifier_from_official

MINIS = ['flatten_pvt', 'flatten_swin', 'inline_pvt', 'inline_swin']
DENSE = {'flatten_pvt': FLattenPVT, 'flatten_swin': FLattenSwin, 'inline_pvt': InLinePVT,
         'inline_swin': InLineSwin}


@pytest.fixture(scope='module')
def lineage(golden_data):
    """{name: (expected dict, official checkpoint path)}."""
    return {n: golden_data(n) for n in MINIS}


def _classifier(lineage, name, **overrides):
    expected, ckpt = lineage[name]
    model = classifier_from_official(ImageClassifier, expected['constructor'], **overrides)
    model.load_checkpoint(ckpt, strict=True)
    return model.eval(), expected


@pytest.mark.parametrize('name', MINIS)
def test_reference_path_reproduces_official(lineage, name):
    model, expected = _classifier(lineage, name, attn_impl='reference')
    attns = [m for m in model.modules() if isinstance(m, (FocusedLinearAttention, InLineAttention))]
    assert attns and all(m.attn_impl == 'reference' for m in attns)
    assert model.kind == name.split('_')[0]
    with torch.no_grad():
        features, maps = model.forward_intermediates(expected['input'])
        logits = model.forward_head(features)
    assert (logits - expected['logits']).abs().max() <= 1e-5
    assert len(maps) == len(expected['stages']) == 4
    for i, (ours, ref) in enumerate(zip(maps, expected['stages'])):
        assert ours.shape == ref.shape, i
        assert (ours - ref).abs().max() <= 1e-5, f'stage {i}'


@pytest.mark.parametrize('name', MINIS)
def test_default_path_matches_official(lineage, name):
    model, expected = _classifier(lineage, name)
    with torch.no_grad():
        features, maps = model.forward_intermediates(expected['input'])
        logits = model.forward_head(features)
    assert (logits - expected['logits']).abs().max() <= 1e-4
    for i, (ours, ref) in enumerate(zip(maps, expected['stages'])):
        assert (ours - ref).abs().max() <= 1e-4, f'stage {i}'


@pytest.mark.parametrize('name', MINIS)
def test_dense_backbone_reproduces_official_stages(lineage, mini_kwargs, name):
    """At the pretraining size the dense backbone (init_cfg=Pretrained on the official file)
    computes the official stage features (Swin: without output norms, classification shift rule)."""
    expected, ckpt = lineage[name]
    family = name.split('_')[1]
    extra = dict(out_norm=False, clamp_shift=True) if family == 'swin' else {}
    backbone = DENSE[name](**mini_kwargs(family, expected['constructor']), attn_impl='reference', **extra,
                           init_cfg=dict(type='Pretrained', checkpoint=ckpt))
    backbone.init_weights()
    backbone.eval()
    with torch.no_grad():
        outs = backbone(expected['input'])
    for i, (ours, ref) in enumerate(zip(outs, expected['stages'])):
        assert (ours - ref).abs().max() <= 1e-5, f'stage {i}'


def test_pvt_classifiers_have_no_final_norm(lineage):
    """The official PVT forward never uses a final norm: none is built (every parameter trains), and
    the official FLatten file's unused ``norm.*`` is dropped by the loader (it loaded above)."""
    for name in ('inline_pvt', 'flatten_pvt'):
        model, _ = _classifier(lineage, name)
        assert not any(k.startswith('norm.') for k in model.state_dict()), name
