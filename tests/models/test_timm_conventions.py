"""Every timm entry follows timm's model conventions, as timm's own model test-suite checks them
(tests/test_models.py of the timm repository): gradients of every parameter, pretrained_cfg,
forward_features / forward_head, reset_classifier, forward_intermediates and features_only,
torch.fx tracing, and an explicit TorchScript refusal.

Parametrized over every entry of ``TIMM_ENTRIES``; inputs are reduced as timm's tests reduce them
(``_input_size``), and each entry is built once (the ``entry`` fixture).
"""
import copy
import math

import pytest
import timm
import torch
import torch.nn as nn
from timm.data import resolve_data_config
from timm.models import FeatureInfo, get_notrace_functions, get_notrace_modules
from timm.models._features import FeatureGetterNet
from torchvision.models.feature_extraction import NodePathTracer, create_feature_extractor, get_graph_node_names

from mmpola.models.timm_conventions import NotScriptableError, TimmClassifierMixin, check_global_pool
from mmpola.models.timm_models import TIMM_ENTRIES

NAMES = sorted(TIMM_ENTRIES)
# timm's targets (tests/test_models.py): a model with ``min_input_size`` runs at that size
TARGET_BWD_SIZE = 128
TARGET_FFEAT_SIZE = 96
TARGET_FX_SIZE = 128
CFG_KEYS = ('num_classes', 'input_size', 'pool_size', 'crop_pct', 'crop_mode', 'interpolation', 'mean', 'std',
            'first_conv', 'classifier', 'fixed_input_size', 'min_input_size')


@pytest.fixture(scope='module', params=NAMES)
def entry(request):
    """An entry built once with ``timm.create_model`` (in eval mode); tests that change it copy it
    with :func:`_copy` (pytest runs all tests of one entry before building the next)."""
    torch.manual_seed(0)
    return timm.create_model(request.param).eval()


def _copy(model, **kwargs):
    """A copy of ``model``, reset as ``create_model(name, num_classes=..., global_pool=...)`` builds it."""
    model = copy.deepcopy(model)
    if kwargs:
        model.reset_classifier(kwargs.pop('num_classes', model.num_classes), kwargs.pop('global_pool', None))
    assert not kwargs
    return model


def _input_size(model, target=None):
    """timm's ``_get_input_size``: the default size, or ``min_input_size`` above the target."""
    cfg = model.pretrained_cfg
    input_size = cfg['input_size']
    if cfg.get('fixed_input_size'):
        return input_size
    if target and max(input_size) > target:
        return cfg.get('min_input_size') or tuple(min(x, target) for x in input_size)
    return input_size


def _fx_model(model, train=False):
    """timm's ``_create_fx_model``: torchvision's feature extractor with timm's tracer settings,
    returning the output node(s)."""
    tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                         param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    eval_return_nodes = [eval_nodes[-1]]
    train_return_nodes = [train_nodes[-1]]
    if train:
        graph = NodePathTracer(**tracer_kwargs).trace(model)
        graph_nodes = list(reversed(graph.nodes))
        output_names = [n.name for n in graph_nodes[0]._input_nodes.keys()]
        node_names = [n.name for n in graph_nodes]
        train_return_nodes = [train_nodes[-node_names.index(n)] for n in output_names]
    return create_feature_extractor(model, train_return_nodes=train_return_nodes,
                                    eval_return_nodes=eval_return_nodes, tracer_kwargs=tracer_kwargs)


def _check_maps(maps, model_or_info, input_size, batch_size):
    info = model_or_info
    assert len(maps) == len(info.channels())
    for c, r, m in zip(info.channels(), info.reduction(), maps):
        assert m.shape[:2] == (batch_size, c)
        assert m.shape[2] <= math.ceil(input_size[1] / r) + 1 and m.shape[3] <= math.ceil(input_size[2] / r) + 1
        assert not torch.isnan(m).any()


def test_backward_reaches_every_parameter(entry):
    """timm's test_model_backward (and test_model_forward's grad-checkpointing check)."""
    model = _copy(entry, num_classes=42).train()
    input_size = _input_size(model, TARGET_BWD_SIZE)
    outputs = model(torch.randn(2, *input_size))
    outputs.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == [], f'no gradient for {missing}'
    assert all(p.requires_grad for p in model.parameters())
    assert outputs.shape == (2, 42) and not torch.isnan(outputs).any()

    model.eval()
    x = torch.randn(1, *input_size)
    with torch.no_grad():
        reference = model(x)
    model.set_grad_checkpointing()
    assert model.grad_checkpointing
    assert torch.allclose(model(x), reference, rtol=1e-4, atol=1e-5)


def test_pretrained_cfg_and_head_api(entry):
    """timm's test_model_default_cfgs: the config describes the model, forward_features is the
    unpooled map of ``pool_size``, forward_head(pre_logits=True) / reset_classifier / global_pool=''."""
    model = _copy(entry)
    cfg = model.pretrained_cfg
    assert model.default_cfg == cfg
    assert [k for k in CFG_KEYS if cfg.get(k) is None] == []
    assert cfg['num_classes'] == model.num_classes == 1000
    assert model.num_features > 0 and model.head_hidden_size == model.num_features
    assert model.output_fmt == 'NHWC'
    state_dict = model.state_dict()
    assert f"{cfg['classifier']}.weight" in state_dict
    assert model.get_classifier() is model.get_submodule(cfg['classifier'])
    assert f"{cfg['first_conv']}.weight" in state_dict
    assert model.get_submodule(cfg['first_conv']).in_channels == cfg['input_size'][0]
    data_config = resolve_data_config(model=model)
    for key in ('input_size', 'crop_pct', 'crop_mode', 'interpolation', 'mean', 'std'):
        assert data_config[key] == cfg[key], key

    with torch.no_grad():
        features = model.forward_features(torch.randn(1, *cfg['input_size']))
        assert features.shape == (1, *cfg['pool_size'], model.num_features)
        pre_logits = model.forward_head(features, pre_logits=True)
        assert pre_logits.shape == (1, model.head_hidden_size)
        assert model.forward_head(features).shape == (1, 1000)

        x = torch.randn(1, *cfg['min_input_size'])
        model.reset_classifier(0)
        assert model.num_classes == 0
        pooled = model(x)
        assert pooled.shape == (1, model.head_hidden_size)
        assert torch.equal(pooled, model.forward_head(model.forward_features(x), pre_logits=True))
        model.reset_classifier(0, '')
        assert model(x).shape == (1, 1, 1, model.num_features)
        model.reset_classifier(5, 'avg')
        assert model(x).shape == (1, 5)
    with torch.device('meta'):
        unpooled = timm.create_model(model.pretrained_cfg['architecture'], num_classes=0, global_pool='')
    assert unpooled.global_pool == '' and unpooled.num_classes == 0
    with pytest.raises(ValueError, match="global_pool='max'"):
        model.reset_classifier(0, 'max')


def test_forward_intermediates_and_features_only(entry):
    """timm's test_model_forward_intermediates and test_model_forward_(intermediates_)features."""
    model = _copy(entry)
    info = FeatureInfo(model.feature_info, len(model.feature_info))
    assert len(info.channels()) >= 3 and info.reduction() == [4, 8, 16, 32][:len(info.reduction())]
    input_size = _input_size(model, TARGET_FFEAT_SIZE)
    x = torch.randn(1, *input_size)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, output_fmt='NCHW')
        _check_maps(maps, info, input_size, 1)
        assert torch.allclose(final, model.forward_features(x))
        last_two = model.forward_intermediates(x, indices=2, stop_early=True, intermediates_only=True)
        assert [m.shape for m in last_two] == [m.shape for m in maps[-2:]]
        model.set_grad_checkpointing()
        assert torch.allclose(model.forward_intermediates(x)[0], final, rtol=1e-4, atol=1e-5)

    with torch.device('meta'):  # the entry's features_only model: timm's FeatureGetterNet, no classifier
        created = timm.create_model(model.pretrained_cfg['architecture'], features_only=True)
    assert isinstance(created, FeatureGetterNet)
    assert not any(k.startswith(('model.head.', 'model.norm.')) for k in created.state_dict())
    features = FeatureGetterNet(model, out_indices=created.out_indices).eval()  # the same on real weights
    assert features.feature_info.channels() == info.channels()
    assert features.feature_info.reduction() == info.reduction()
    with torch.no_grad():
        feature_maps = features(x)
    _check_maps(feature_maps, features.feature_info, input_size, 1)
    assert all(torch.allclose(a, b) for a, b in zip(feature_maps, maps))


def test_fx_forward_matches_eager(entry):
    """timm's test_model_forward_fx: symbolic tracing with timm's leaf modules reproduces forward."""
    model = entry
    x = torch.randn(1, *_input_size(model, TARGET_FX_SIZE))
    with torch.inference_mode():
        outputs = model(x)
        fx_outputs = torch.cat(tuple(_fx_model(model)(x).values()))
    assert torch.equal(fx_outputs, outputs)


def test_fx_features_of_feature_info_modules(entry):
    """timm's fx feature extraction (timm.models.create_feature_extractor): each ``feature_info``
    module names a traceable node with that stage's features ((B, H*W, C) tokens for the PVT / Swin
    families, NCHW maps for PolaFormer++, whose blocks work on maps)."""
    model = entry
    modules = [info['module'] for info in model.feature_info]
    for module in modules:
        model.get_submodule(module)
    extractor = timm.models.create_feature_extractor(model, modules + [model.pretrained_cfg['classifier']])
    x = torch.randn(1, *_input_size(model, TARGET_FX_SIZE))
    with torch.inference_mode():
        outputs = extractor(x)
        _, maps = model.forward_intermediates(x)
        logits = model(x)
    for module, stage_map in zip(modules, maps):
        node = outputs[module]
        assert torch.equal(node, stage_map if node.dim() == 4 else stage_map.flatten(2).transpose(1, 2)), module
    # PolaFormer++'s head is a 1x1 conv on the pooled (B, P, 1, 1) map
    assert torch.equal(outputs[model.pretrained_cfg['classifier']].reshape(logits.shape), logits)


def test_fx_backward_reaches_every_parameter(entry):
    """timm's test_model_backward_fx."""
    model = _copy(entry, num_classes=42).train()
    num_params = sum(p.numel() for p in model.parameters())
    fx_model = _fx_model(model, train=True)
    outputs = torch.cat(tuple(fx_model(torch.randn(2, *_input_size(model, TARGET_FX_SIZE))).values()))
    outputs.mean().backward()
    missing = [n for n, p in fx_model.named_parameters() if p.grad is None]
    assert missing == [], f'no gradient for {missing}'
    assert sum(p.grad.numel() for p in fx_model.parameters()) == num_params
    assert outputs.shape[-1] == 42 and not torch.isnan(outputs).any()


def test_torchscript_refused_with_reason(entry):
    """Not scriptable: ``create_model(scriptable=True)`` (what timm's TorchScript tests do) and
    ``torch.jit.script`` both fail with the reason, before any compiler trace."""
    name = entry.pretrained_cfg['architecture']
    with pytest.raises(NotScriptableError, match='cannot be compiled with torch.jit.script: .+'):
        timm.create_model(name, scriptable=True)
    with timm.layers.set_scriptable(True), pytest.raises(NotScriptableError):
        timm.create_model(name)
    model = entry
    assert not model.scriptable and model.not_scriptable_reason
    with pytest.raises(NotScriptableError, match=type(model).__name__):
        torch.jit.script(model)


@pytest.mark.parametrize('backbone', ['PolaPVT', 'PolaSwin'])
def test_dense_backbones_trace_with_timm_leaves(backbone):
    """The dense backbones (mmdet / mmseg) trace too: the input check skips fx proxies, timm's
    notrace modules stay leaves; the graph returns the same four maps (odd, non-square input)."""
    from mmpola.models import PolaPVT, PolaSwin
    torch.manual_seed(0)
    if backbone == 'PolaPVT':
        model = PolaPVT(arch=dict(embed_dims=[16, 32, 64, 128], num_heads=[1, 2, 4, 8], mlp_ratios=[2, 2, 2, 2],
                                  depths=[1, 1, 1, 1]))
    else:
        model = PolaSwin(arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]))
    model.eval()
    graph = NodePathTracer(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions()).trace(model)
    traced = torch.fx.GraphModule(model, graph)
    x = torch.randn(1, 3, 67, 97)
    with torch.no_grad():
        expected, outputs = model(x), traced(x)
    assert len(outputs) == len(expected) == 4
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected))


class _ToyClassifier(TimmClassifierMixin, nn.Module):
    """Only what the mixin's docstring asks of a new classifier class: four strided conv stages."""

    not_scriptable_reason = 'a toy model'

    def __init__(self, num_classes=3, global_pool='avg'):
        super().__init__()
        self.num_classes, self.num_features = num_classes, 8
        self.global_pool = check_global_pool(global_pool)
        self.stages = nn.ModuleList(nn.Conv2d(3 if i == 0 else 8, 8, 4 if i == 0 else 2, stride=4 if i == 0 else 2)
                                    for i in range(4))
        self.feature_info = [dict(num_chs=8, reduction=4 * 2 ** i, module=f'stages.{i}') for i in range(4)]
        self.grad_checkpointing = False
        self.head = self._make_head(num_classes)

    def forward_intermediates(self, x, indices=None, norm=False, stop_early=False, output_fmt='NCHW',
                              intermediates_only=False):
        take = self._stage_indices(indices, len(self.stages))
        maps = []
        for stage in self.stages:
            x = stage(x)
            maps.append(x)
        maps = [maps[i] for i in take]
        return maps if intermediates_only else (x.permute(0, 2, 3, 1), maps)

    def forward_features(self, x):
        return self.forward_intermediates(x)[0]


def test_mixin_serves_any_classifier_class():
    """A class providing what the mixin's docstring lists gets timm's head / pooling / features API."""
    model = _ToyClassifier().eval()
    x = torch.randn(2, 3, 64, 64)
    assert model(x).shape == (2, 3) and model.head_hidden_size == 8 and model.get_classifier() is model.head
    assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (2, 8)
    model.set_grad_checkpointing()
    assert model.grad_checkpointing
    model.reset_classifier(0, '')
    assert model(x).shape == (2, 2, 2, 8)
    with pytest.raises(ValueError, match='out of range'):
        model.forward_intermediates(x, indices=[4])
    features = FeatureGetterNet(_ToyClassifier(), out_indices=(1, 3))
    assert isinstance(features.model.head, nn.Identity)
    assert [m.shape[-1] for m in features(x)] == [8, 2]
    with pytest.raises(NotScriptableError, match='_ToyClassifier cannot be compiled with torch.jit.script: a toy'):
        torch.jit.script(model)
