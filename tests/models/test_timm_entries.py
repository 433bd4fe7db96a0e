"""timm entries (mmpola.models.timm_models): every name of the table builds; official checkpoints load safely
and reproduce the official logits (Pola, FLatten and InLine golden mini models)."""
import pickle

import pytest
import timm
import torch

from mmpola.models import ImageClassifier
from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
from mmpola.models.timm_models import TIMM_ENTRIES

TOL = 1e-5
ENTRY = {'pvt': 'pola_pvt_tiny', 'swin': 'pola_swin_tiny'}
# parameters with the 1000-class head (the papers' counts)
PARAMS_M = {'pola_pvt_tiny': 12.92, 'pola_pvt_small': 23.16, 'pola_pvt_medium': 39.97,
            'pola_pvt_large': 54.37, 'pola_swin_tiny': 29.29, 'pola_swin_small': 50.60,
            'pola_swin_base': 89.14,
            'flatten_pvt_tiny': 12.15, 'flatten_pvt_small': 21.67, 'flatten_pvt_medium': 37.24,
            'flatten_pvt_large': 50.65, 'flatten_swin_tiny': 29.19, 'flatten_swin_small': 50.51,
            'flatten_swin_base': 88.97, 'inline_pvt_tiny': 12.03, 'inline_pvt_small': 21.56,
            'inline_pvt_medium': 37.62, 'inline_pvt_large': 51.15, 'inline_swin_tiny': 29.22,
            'inline_swin_small': 49.79, 'inline_swin_base': 88.35,
            'polapp_b0': 7.55, 'polapp_b1': 9.23, 'polapp_b2': 16.45, 'polapp_b3': 27.15,
            'polapp_b4': 49.80, 'polapp_b5': 97.77,
            'flatten_pvt_v2_b0': 3.59, 'flatten_pvt_v2_b1': 12.93, 'flatten_pvt_v2_b2': 22.55,
            'flatten_pvt_v2_b3': 38.27, 'flatten_pvt_v2_b4': 51.84,
            'flatten_cswin_tiny': 21.20, 'flatten_cswin_small': 35.45, 'flatten_cswin_base': 74.87,
            'flatten_cswin_base_384': 78.37, 'inline_cswin_tiny': 20.60, 'inline_cswin_small': 33.03,
            'inline_cswin_base': 73.41, 'inline_cswin_base_384': 73.41,
            'inline_deit_tiny': 6.48, 'inline_deit_small': 16.73, 'inline_deit_base': 23.80,
            'pola_swin_base_384': 91.60, 'flatten_swin_base_384': 91.43}


def _mini_kwargs(expected):
    kwargs = official_kwargs_to_classifier_kwargs(expected['constructor'])
    kwargs.pop('family')
    return kwargs


@pytest.mark.parametrize('name', sorted(TIMM_ENTRIES))
def test_every_entry_builds(name):
    assert timm.is_model(name)
    with torch.device('meta'):
        model = timm.create_model(name)
    assert isinstance(model, ImageClassifier)
    assert model.num_classes == 1000
    assert model.family == TIMM_ENTRIES[name].family
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(PARAMS_M[name], abs=0.01)
    assert model.pretrained_cfg['crop_mode'] == 'squash'


def test_entries_listed_and_overridable():
    assert set(timm.list_models(['pola_*', 'flatten_*', 'inline_*', 'polapp_*'])) >= set(TIMM_ENTRIES)
    with torch.device('meta'):
        model = timm.create_model('pola_swin_small', num_classes=7, drop_path_rate=0.0, in_chans=1)
    assert model.head.out_features == 7
    assert model.backbone.patch_embed.proj.in_channels == 1
    with pytest.raises(ValueError, match='Pola-PVT model'):
        timm.create_model('pola_pvt_tiny', family='swin')


def test_img_size_sets_the_pretraining_size(tmp_path):
    """timm's ``img_size=``: the size the stored grids are built for (Swin: its linear windows too), as the
    ``*_384`` entries set it; a file of the default size loads into it (grids resized)."""
    with torch.device('meta'):
        swin = timm.create_model('pola_swin_base', img_size=384)
        base_384 = timm.create_model('pola_swin_base_384')
        back = timm.create_model('pola_swin_base_384', img_size=224)
    assert swin.backbone.pretrain_img_size == (384, 384) and swin.backbone.window_size == 96
    assert {k: v.shape for k, v in swin.state_dict().items()} == {k: v.shape for k, v in base_384.state_dict().items()}
    assert back.backbone.window_size == 56
    with pytest.raises(TypeError, match='polapp_b0 takes no img_size'):
        timm.create_model('polapp_b0', img_size=256)

    torch.manual_seed(0)
    torch.save(timm.create_model('pola_pvt_tiny', num_classes=3).state_dict(), tmp_path / 'tiny.pth')
    model = timm.create_model('pola_pvt_tiny', img_size=256, num_classes=3, pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(tmp_path / 'tiny.pth'), num_classes=3)).eval()
    assert model.backbone.pretrain_img_size == (256, 256)
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 64, 64))).all()


@pytest.mark.parametrize('feature_cls', ['hook', 'list', 'dict'])
def test_features_only_refuses_module_output_extractors(feature_cls):
    """timm's hook / list / dict extractors take module outputs, and no module returns a stage's map: refused
    with the extractors that fit, instead of an empty list (hooks) or timm's assertion."""
    with pytest.raises(ValueError, match=f"feature_cls='{feature_cls}' does not fit pola_pvt_tiny.*'getter'"):
        timm.create_model('pola_pvt_tiny', features_only=True, feature_cls=feature_cls)


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_checkpoint_path_reproduces_official_logits(golden, family):
    """``checkpoint_path=`` an official file (with its yacs config object): timm reads it with
    weights_only=True (mmpola's allowlist), the entry maps the official keys."""
    expected, ckpt = golden[family]
    model = timm.create_model(ENTRY[family], checkpoint_path=ckpt, **_mini_kwargs(expected)).eval()
    with torch.no_grad():
        logits = model(expected['input'])
    assert (logits - expected['logits']).abs().max() <= TOL


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_pretrained_file_and_features_only(golden, family):
    expected, ckpt = golden[family]
    kwargs = _mini_kwargs(expected)
    model = timm.create_model(ENTRY[family], pretrained=True,
                              pretrained_cfg_overlay=dict(file=ckpt, num_classes=kwargs['num_classes']),
                              **kwargs).eval()
    with torch.no_grad():
        assert (model(expected['input']) - expected['logits']).abs().max() <= TOL

    kwargs.pop('num_classes')
    features = timm.create_model(ENTRY[family], features_only=True, pretrained=True,
                                 pretrained_cfg_overlay=dict(file=ckpt), **kwargs).eval()
    assert features.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        maps = features(expected['input'])
    assert len(maps) == 4
    for i, (ours, ref) in enumerate(zip(maps, expected['stages'])):
        assert ours.shape == ref.shape, i
        assert (ours - ref).abs().max() <= TOL, f'stage {i}'
    # a feature extractor has no classifier
    assert not any(k.startswith('model.head.') for k in features.state_dict())


def test_load_state_dict_accepts_official_and_own_keys(golden):
    expected, ckpt = golden['pvt']
    from mmpola.checkpoint.reading import safe_torch_load
    official = safe_torch_load(ckpt)['model']
    model = timm.create_model('pola_pvt_tiny', **_mini_kwargs(expected)).eval()
    model.load_state_dict(official)  # strict
    own = model.state_dict()
    assert any(k.startswith('backbone.block1.') for k in own)
    clone = timm.create_model('pola_pvt_tiny', **_mini_kwargs(expected)).eval()
    clone.load_state_dict(own)
    with torch.no_grad():
        assert torch.equal(clone(expected['input']), model(expected['input']))


def test_timm_refuses_unsafe_checkpoints(tmp_path):
    """No unsafe-pickle fallback on the timm path: a file naming an arbitrary global fails."""
    path = tmp_path / 'evil.pth'
    with open(path, 'wb') as f:
        pickle.dump({'model': {}, 'payload': pickle.PickleError}, f)  # a global outside the allowlist
    with pytest.raises(Exception, match='weights_only|Unsupported global|allowlist'):
        timm.create_model('pola_pvt_tiny', checkpoint_path=str(path),
                          arch=dict(embed_dims=[8, 16, 24, 32], num_heads=[1, 1, 1, 1],
                                    mlp_ratios=[1, 1, 1, 1], depths=[1, 1, 1, 1]))


def test_timm_data_config_is_official_eval(golden):
    """``resolve_data_config`` + ``create_transform`` give the official evaluation transform."""
    from timm.data import create_transform, resolve_data_config
    with torch.device('meta'):
        model = timm.create_model('pola_pvt_tiny')
    config = resolve_data_config(model=model)
    assert config['crop_mode'] == 'squash' and config['interpolation'] == 'bicubic'
    transform = create_transform(**config)
    steps = [type(t).__name__ for t in transform.transforms]
    assert steps[:2] == ['Resize', 'CenterCrop']
    assert tuple(transform.transforms[0].size) == (256, 256)


# FLatten and InLine (golden mini models of the official FLatten-Transformer and InLine code)
MINIS = ['flatten_pvt', 'flatten_swin', 'inline_pvt', 'inline_swin']


def _golden(golden_data, name):
    expected, checkpoint = golden_data(name)
    kwargs = official_kwargs_to_classifier_kwargs(expected['constructor'])
    for key in ('family', 'kind'):
        kwargs.pop(key)
    return expected, checkpoint, kwargs


def test_flatten_inline_entries_registered():
    names = {f'{k}_{f}_{s}' for k in ('flatten', 'inline') for f, sizes in
             (('pvt', ('tiny', 'small', 'medium', 'large')), ('swin', ('tiny', 'small', 'base'))) for s in sizes}
    assert names <= set(TIMM_ENTRIES) and names <= set(timm.list_models(['flatten_*', 'inline_*']))
    with torch.device('meta'):
        model = timm.create_model('inline_swin_small')
    assert model.kind == 'inline' and model.backbone.attn_type == 'IISS'  # the released layout of InLine-Swin-S
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


# the other macro architectures of the lineage: entry, golden mini model, its architecture (the official
# PVTv2 class takes PVT-v1's arguments, so the family is named)
MACRO = {'flatten_pvt_v2_b0': ('flatten_pvt_v2', 'pvt_v2'), 'flatten_cswin_tiny': ('flatten_cswin', 'cswin'),
         'inline_cswin_tiny': ('inline_cswin', 'cswin'), 'inline_deit_tiny': ('inline_deit_mini_224', 'vit'),
         'inline_deit_small': ('inline_deit_mini_288', 'vit')}


@pytest.mark.parametrize('name', list(MACRO))
def test_macro_entries_load_official_files(golden_data, name):
    """``checkpoint_path=`` an official FLatten-PVTv2 / FLatten-CSWin / InLine-CSWin / InLine-DeiT file gives
    the official logits; ``features_only`` the official stage maps (a ViT's are its blocks' maps)."""
    mini, family = MACRO[name]
    expected, ckpt = golden_data(mini)
    kwargs = official_kwargs_to_classifier_kwargs(expected['constructor'], family)
    for key in ('family', 'kind'):
        kwargs.pop(key)
    model = timm.create_model(name, checkpoint_path=ckpt, **kwargs).eval()
    assert model.pretrained_cfg['input_size'][-1] == {'inline_deit_small': 288}.get(name, 224)
    with torch.no_grad():
        assert (model(expected['input']) - expected['logits']).abs().max() <= 1e-4
    kwargs.pop('num_classes')
    depth = len(model.feature_info)
    features = timm.create_model(name, features_only=True, out_indices=tuple(range(depth)), pretrained=True,
                                 pretrained_cfg_overlay=dict(file=ckpt), **kwargs).eval()
    with torch.no_grad():
        maps = features(expected['input'])
    for i, (ours, ref) in enumerate(zip(maps, expected['stages'])):
        assert (ours - ref).abs().max() <= 1e-4, f'stage {i}'
