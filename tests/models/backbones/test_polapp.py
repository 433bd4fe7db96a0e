"""PolaFormer++ (PolaPP): official names and sizes, golden classification and dense outputs, checkpoint
loading (official classification / dense files, EMA, other families refused), dense-backbone behaviour."""
import json
import re

import pytest
import torch

from mmpola.checkpoint import CheckpointMismatchError
from mmpola.checkpoint.reading import safe_torch_load
from mmpola.models import ImageClassifier, PolaPP
from mmpola.models.checks import PolaConfigError
from mmpola.models.timm_conventions import NotScriptableError
from tests.fixtures.checkpoints import classifier_from_official

# backbone parameters: classification projection, its BatchNorm, the head and the dense output norms
# excluded
BACKBONE_PARAMS = {'b0': 4_707_136, 'b1': 6_385_920, 'b2': 13_346_944, 'b3': 24_042_176,
                   'b4': 46_695_072, 'b5': 93_565_920}
_CLASSIFICATION_ONLY = re.compile(r'^(proj|norm|head)\.')
_OUT_NORM = re.compile(r'^extra_norms\.')


@pytest.fixture(scope='module')
def manifest(data_file):
    with open(data_file('lineage_key_manifest.json')) as f:
        return json.load(f)


@pytest.fixture(scope='module')
def expected(golden_data):
    return golden_data('polapp')[0]


def mini_arch(constructor):
    c = constructor
    return dict(embed_dims=list(c['embed_dims']), depths=list(c['depths']), num_heads=list(c['num_heads']),
                mlp_ratios=list(c['mlp_ratios']),
                layer_scale_init_values=[v if on else None for on, v in zip(c['layerscales'], c['layer_init_values'])])


@pytest.mark.parametrize('arch', list(BACKBONE_PARAMS))
def test_backbone_keys_shapes_and_param_count(manifest, arch):
    with torch.device('meta'):
        model = PolaPP(arch=arch)
    official = {k: tuple(v) for k, v in manifest[f'polapp_{arch}']['keys'].items() if not _CLASSIFICATION_ONLY.match(k)}
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items() if not _OUT_NORM.match(k)}
    assert ours == official
    assert sorted({k.split('.')[1] for k in model.state_dict() if _OUT_NORM.match(k)}) == ['0', '1', '2', '3']
    assert sum(p.numel() for k, p in model.named_parameters() if not _OUT_NORM.match(k)) == BACKBONE_PARAMS[arch]


@pytest.mark.parametrize('arch', list(BACKBONE_PARAMS))
def test_classifier_matches_official_tensors(manifest, arch):
    with torch.device('meta'):
        model = ImageClassifier(family='polapp', arch=arch)
    ours = {re.sub(r'^backbone\.', '', k): tuple(v.shape) for k, v in model.state_dict().items()}
    assert ours == {k: tuple(v) for k, v in manifest[f'polapp_{arch}']['keys'].items()}
    assert sum(p.numel() for p in model.parameters()) == manifest[f'polapp_{arch}']['params_total']


@pytest.mark.parametrize('impl,tol', [('reference', 1e-5), ('auto', 1e-4)])
def test_classifier_reproduces_official_logits_and_stages(expected, data_file, impl, tol):
    model = classifier_from_official(ImageClassifier, expected['constructor'], attn_impl=impl)
    result = model.load_checkpoint(data_file('polapp_mini_official.pth'))
    assert not result.missing_keys and not result.unexpected_keys
    model.eval()
    with torch.no_grad():
        logits = model(expected['input'])
        stages = model.forward_intermediates(expected['input'], intermediates_only=True)
    assert (logits - expected['logits']).abs().max() <= tol
    for i, (ours, theirs) in enumerate(zip(stages, expected['stages'])):
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() <= tol, f'stage {i}'


@pytest.mark.parametrize('impl,tol', [('reference', 1e-5), ('auto', 1e-4)])
def test_dense_backbone_reproduces_official_dense_outputs(expected, data_file, impl, tol):
    """Loaded from the official dense file (classification weights plus its per-stage norms)."""
    model = PolaPP(arch=mini_arch(expected['constructor']), drop_path_rate=0.0, attn_impl=impl,
                   init_cfg=dict(type='Pretrained', checkpoint=data_file('polapp_mini_dense_official.pth')))
    model.init_weights()
    model.eval()
    with torch.no_grad():
        outs = model(expected['dense_input'])
    assert len(outs) == 4
    for i, (ours, theirs) in enumerate(zip(outs, expected['dense_stages'])):
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() <= tol, f'stage {i}'


def test_pretrained_classification_checkpoint_prefers_ema(expected, data_file, tmp_path):
    """An official classification file loads into the dense backbone (projection, its BatchNorm and the
    head dropped, dense norms left at their init, as the official dense code); ``state_dict_ema`` wins
    unless use_ema=False."""
    official = safe_torch_load(data_file('polapp_mini_official.pth'))
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in official['model'].items()}
    path = tmp_path / 'with_ema.pth'
    torch.save(dict(model=official['model'], state_dict_ema=ema), path)
    arch = mini_arch(expected['constructor'])
    for use_ema, source in ((True, ema), (False, official['model'])):
        model = PolaPP(arch=arch, init_cfg=dict(type='Pretrained', checkpoint=str(path), use_ema=use_ema))
        model.init_weights()
        state = model.state_dict()
        for key in ('patch_embed.proj.0.weight', 'layers.0.blocks.0.attn.s1', 'layers.3.blocks.0.gamma_2'):
            assert torch.equal(state[key], source[key]), (use_ema, key)
        assert torch.equal(state['extra_norms.0.norm.weight'], torch.ones(16))


@pytest.mark.parametrize('name,family', [('pola_pvt_mini_official.pth', 'Pola-PVT'),
                                         ('pola_swin_mini_official.pth', 'Pola-Swin'),
                                         ('flatten_swin_mini_official.pth', 'FLatten')])
def test_other_family_checkpoints_are_refused(data_file, name, family):
    model = PolaPP(arch='b0', init_cfg=dict(type='Pretrained', checkpoint=data_file(name)))
    with pytest.raises(CheckpointMismatchError, match=family) as info:
        model.init_weights()
    assert 'PolaPP' in str(info.value)
    classifier = ImageClassifier(family='polapp', arch='b0', num_classes=10)
    with pytest.raises(CheckpointMismatchError, match='not a PolaFormer\\+\\+ checkpoint'):
        classifier.load_checkpoint(data_file(name))


def mini_backbone(expected, **kwargs):
    kwargs.setdefault('drop_path_rate', 0.0)
    return PolaPP(arch=mini_arch(expected['constructor']), **kwargs)


@pytest.mark.parametrize('size', [(800, 1216), (513, 677), (32, 480)])
def test_sizes_gradients_and_strides(expected, size):
    torch.manual_seed(0)
    model = mini_backbone(expected)
    model.train()
    x = torch.randn(1, 3, *size)
    outs = model(x)
    h, w = size
    for i, out in enumerate(outs):
        h, w = (h + 1) // 2, (w + 1) // 2
        if i == 0:
            h, w = (h + 1) // 2, (w + 1) // 2
        assert out.shape == (1, model.embed_dims[i], h, w)
        assert torch.isfinite(out).all()
    sum(o.float().square().mean() for o in outs).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert no_grad == []


def test_bf16_autocast_is_finite(expected):
    torch.manual_seed(0)
    model = mini_backbone(expected)
    x = torch.randn(1, 3, 96, 128)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(x)
        loss = sum(o.float().square().mean() for o in outs)
    assert all(torch.isfinite(o.float()).all() for o in outs)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_out_indices_frozen_stages_norm_eval_and_with_cp(expected):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 96)
    model = mini_backbone(expected, out_indices=(1, 3), frozen_stages=2, norm_eval=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    assert [o.shape[1] for o in model(x)] == model.out_channels == [32, 128]
    assert not model.patch_embed.training and not model.layers[1].training and model.layers[2].training
    assert not model.layers[2].downsample.norm.training  # norm_eval
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(re.match(r'(patch_embed|layers\.[01]|extra_norms\.[01])\.', n) for n in frozen)
    # running statistics untouched by the training-mode forward (frozen and norm_eval BatchNorms)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items() if 'running' in k)

    plain, checkpointed = mini_backbone(expected), mini_backbone(expected, with_cp=True)
    checkpointed.load_state_dict(plain.state_dict())
    inputs = [x.clone().requires_grad_() for _ in range(2)]
    for model, inp in zip((plain, checkpointed), inputs):
        sum(o.sum() for o in model(inp)).backward()
    torch.testing.assert_close(inputs[0].grad, inputs[1].grad)


def test_bad_arguments_and_inputs_are_clear_errors():
    with pytest.raises(PolaConfigError, match='unknown arch'):
        PolaPP(arch='b9')
    with pytest.raises(PolaConfigError, match='out_indices'):
        PolaPP(arch='b0', out_indices=(4,))
    with pytest.raises(PolaConfigError, match='attn_type'):
        PolaPP(arch='b0', attn_type='LLXS')
    with pytest.raises(PolaConfigError, match='smaller than the minimum'):
        PolaPP(arch='b0')(torch.randn(1, 3, 31, 64))
    with pytest.raises(ValueError, match='projection='):
        ImageClassifier(family='polapp', arch=PolaPP.arch_settings['b0'])


def test_classifier_timm_api(expected):
    torch.manual_seed(0)
    model = classifier_from_official(ImageClassifier, expected['constructor']).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features, maps = model.forward_intermediates(x)
        assert torch.equal(features, model.forward_features(x))
        assert [m.shape[1] for m in maps] == [16, 32, 64, 128]
        assert model.forward_head(features, pre_logits=True).shape == (2, 256)
        torch.testing.assert_close(model.forward_head(features), model(x))
        assert len(model.forward_intermediates(x, indices=2, stop_early=True, intermediates_only=True)) == 2
        model.reset_classifier(3)
        assert model(x).shape == (2, 3)
        model.reset_classifier(0)
        assert model(x).shape == (2, 256)
        model.reset_classifier(0, '')
        assert model(x).shape == (2, 2, 2, 256)  # timm's unpooled NHWC map
        assert features.shape == (2, 2, 2, 256)
        model.set_grad_checkpointing()
        assert model.grad_checkpointing and model.backbone.with_cp
    with pytest.raises(NotScriptableError, match='cannot be compiled with torch.jit.script'):
        torch.jit.script(model)
    assert model.prune_intermediate_layers(indices=2, prune_norm=True) == [2, 3]
    assert isinstance(model.proj, torch.nn.Identity)


def test_timm_entries_load_official_files(expected, data_file):
    """``timm.create_model('polapp_*', checkpoint_path=<official file>)`` reproduces the official logits;
    ``features_only`` gives the raw stage maps."""
    import timm
    ckpt = data_file('polapp_mini_official.pth')
    c = expected['constructor']
    kwargs = dict(arch=mini_arch(c), projection=c['projection'], drop_path_rate=0.0)
    model = timm.create_model('polapp_b0', checkpoint_path=ckpt, num_classes=10, **kwargs).eval()
    assert isinstance(model, ImageClassifier) and model.pretrained_cfg['first_conv'] == 'backbone.patch_embed.proj.0'
    with torch.no_grad():
        assert (model(expected['input']) - expected['logits']).abs().max() <= 1e-4
    features = timm.create_model('polapp_b0', features_only=True, pretrained=True,
                                 pretrained_cfg_overlay=dict(file=ckpt), **kwargs).eval()
    assert features.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        maps = features(expected['input'])
    for ours, theirs in zip(maps, expected['stages']):
        assert (ours - theirs).abs().max() <= 1e-4
    with pytest.raises(ValueError, match='polapp model'):
        timm.create_model('polapp_b0', family='swin')


def test_released_b0_at_dense_sizes_and_bf16():
    """The smallest released preset (not the mini arch) at the sizes of the dense checks: finite
    outputs, a gradient for every parameter, finite under bf16 autocast."""
    torch.manual_seed(0)
    model = PolaPP(arch='b0', drop_path_rate=0.0).train()
    for size in [(800, 1216), (513, 677), (32, 480)]:
        model.zero_grad(set_to_none=True)
        outs = model(torch.randn(1, 3, *size))
        assert all(torch.isfinite(o).all() for o in outs), size
        sum(o.square().mean() for o in outs).backward()
        assert [n for n, p in model.named_parameters() if p.grad is None] == [], size
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, 513, 677))
    assert all(torch.isfinite(o.float()).all() for o in outs)
