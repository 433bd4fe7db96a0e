"""Every timm entry follows timm's model conventions, as timm's own model test-suite checks them
(tests/test_models.py of the timm repository): gradients of every parameter, pretrained_cfg,
forward_features / forward_head, reset_classifier, and an explicit TorchScript refusal; the
traced and feature-extraction checks, for one entry of each architecture and kind, are in
test_timm_tracing.py.

Parametrized over every entry of ``TIMM_ENTRIES``; inputs are reduced as timm's tests reduce them
(``input_size``), and each entry is built once (the ``entry`` fixture).
"""
import pytest
import timm
import torch
import torch.nn as nn
from timm.data import resolve_data_config
from timm.layers import get_spatial_dim
from timm.models import get_notrace_functions, get_notrace_modules
from timm.models._features import FeatureGetterNet
from torchvision.models.feature_extraction import NodePathTracer

from mmpola.models.timm_conventions import NotScriptableError, TimmClassifierMixin, check_global_pool
from tests.fixtures.timm_checks import NAMES, TARGET_BWD_SIZE, copy_entry, input_size

CFG_KEYS = ('num_classes', 'input_size', 'pool_size', 'crop_pct', 'crop_mode', 'interpolation', 'mean', 'std',
            'first_conv', 'classifier', 'fixed_input_size', 'min_input_size')


@pytest.fixture(scope='module', params=NAMES)
def entry(request):
    """An entry built once with ``timm.create_model`` (in eval mode); tests that change it copy it
    with :func:`copy_entry` (pytest runs all tests of one entry before building the next)."""
    torch.manual_seed(0)
    return timm.create_model(request.param).eval()


def test_backward_reaches_every_parameter(entry):
    """timm's test_model_backward (and test_model_forward's grad-checkpointing check)."""
    model = copy_entry(entry, num_classes=42).train()
    size = input_size(model, TARGET_BWD_SIZE)
    outputs = model(torch.randn(2, *size))
    outputs.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == [], f'no gradient for {missing}'
    assert all(p.requires_grad for p in model.parameters())
    assert outputs.shape == (2, 42) and not torch.isnan(outputs).any()

    model.eval()
    x = torch.randn(1, *size)
    with torch.no_grad():
        reference = model(x)
    model.set_grad_checkpointing()
    assert model.grad_checkpointing
    assert torch.allclose(model(x), reference, rtol=1e-4, atol=1e-5)


def _unpooled_shape(model, size):
    """forward_features of an input of ``size``: the NHWC map at stride 32, or (the ViT) its tokens as
    one row: the class token and the patch tokens at stride 16."""
    if model.pretrained_cfg['architecture'].startswith('inline_deit'):
        grid = [-(-s // model.backbone.patch_size) for s in size[1:]]
        return (1, 1, model.backbone.num_prefix_tokens + grid[0] * grid[1], model.num_features)
    return (1, *[-(-s // 32) for s in size[1:]], model.num_features)


def test_pretrained_cfg_and_head_api(entry):
    """timm's test_model_default_cfgs, which timm runs on every model but its own ViT-like names (those
    get test_model_default_cfgs_non_std): the config describes the model, forward_features is the
    unpooled NHWC map of ``pool_size``, forward_head(pre_logits=True) / reset_classifier /
    global_pool=''."""
    model = copy_entry(entry)
    cfg = model.pretrained_cfg
    assert model.default_cfg == cfg
    assert [k for k in CFG_KEYS if cfg.get(k) is None] == []
    assert cfg['num_classes'] == model.num_classes == 1000
    assert model.num_features > 0 and model.head_hidden_size == model.num_features
    assert model.output_fmt == 'NHWC' and len(get_spatial_dim(model.output_fmt)) == 2  # timm: no 1-D support
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
        assert features.shape == _unpooled_shape(model, cfg['input_size'])
        assert features.shape[1:3] == cfg['pool_size'] and features.shape[3] == model.num_features
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
        assert model(x).shape == _unpooled_shape(model, cfg['min_input_size'])
        model.reset_classifier(5, 'avg')
        assert model(x).shape == (1, 5)
    with torch.device('meta'):
        unpooled = timm.create_model(model.pretrained_cfg['architecture'], num_classes=0, global_pool='')
    assert unpooled.global_pool == '' and unpooled.num_classes == 0
    with pytest.raises(ValueError, match="global_pool='max'"):
        model.reset_classifier(0, 'max')


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


# a parameter of a stage's other modules -> a parameter of the block it joins in group_matcher's groups
STAGE_PARTS_JOIN = {
    'pvt': {'backbone.patch_embed2.proj.weight': 'backbone.block2.0.norm1.weight',
            'backbone.pos_embed2': 'backbone.block2.0.norm1.weight'},  # before the stage's blocks
    'pvt_v2': {'backbone.patch_embed2.proj.weight': 'backbone.block2.0.norm1.weight',
               'backbone.norm1.weight': 'backbone.block1.{last}.norm1.weight'},  # the stage norm after them
    'swin': {'backbone.layers.0.downsample.norm.weight': 'backbone.layers.0.blocks.{last}.norm1.weight'},
    'polapp': {'backbone.layers.0.downsample.norm.weight': 'backbone.layers.0.blocks.{last}.norm2.norm.weight'},
    'cswin': {'backbone.merge1.conv.weight': 'backbone.stage2.0.norm1.weight'},
    'vit': {},
}


def test_timm_optimizer_groups(entry):
    """timm's optimizer factory: ``no_weight_decay()`` names the parameters the official training leaves
    undecayed besides the 1-D ones (Swin's relative position bias, DeiT's position embedding and class token), and
    ``group_matcher()`` (layer-wise lr decay) puts the stem first, each block in the order they run (coarse: each
    stage), a stage's patch embedding or merging with its first block and its downsampling or norm with its last,
    the final norm with the last block and the classifier last; every parameter in one group."""
    from timm.models import group_modules, group_parameters
    from timm.models._manipulate import named_modules_with_params
    from timm.optim import create_optimizer_v2
    model = entry
    names = [n for n, _ in model.named_parameters()]
    name_of = {id(p): n for n, p in model.named_parameters()}
    if model.family == 'vit':
        assert model.no_weight_decay() == {'backbone.pos_embed', 'backbone.cls_token'}
    else:
        assert model.no_weight_decay() == {n for n in names if 'relative_position_bias_table' in n}
    backbone = model.backbone
    blocks = [[name_of[id(p)] for p in block.parameters()]
              for i in range(backbone.num_stages) for block in backbone._stage_blocks(i)]
    stem_modules, stem_params = backbone._stem_parts()
    stem = [name_of[id(p)] for p in [*[p for m in stem_modules for p in m.parameters()], *stem_params]]
    head = [n for n in names if n.startswith('head.')]
    neck = [n for n in names if n.split('.', 1)[0] in model._neck_names]

    groups = group_parameters(model, model.group_matcher(), reverse=True)
    assert sorted(groups) == sorted(names)
    assert {groups[n] for n in stem} == {0} and {groups[n] for n in head} == {len(blocks) + 1}
    assert [{groups[n] for n in block} for block in blocks] == [{k + 1} for k in range(len(blocks))]
    assert {groups[n] for n in neck} <= {len(blocks)}
    last = len(list(backbone._stage_blocks(0))) - 1
    for part, joins in STAGE_PARTS_JOIN[model.family].items():
        assert groups[part] == groups[joins.format(last=last)], part

    coarse = group_parameters(model, model.group_matcher(coarse=True), reverse=True)
    stage_of = {n: i for i in range(backbone.num_stages) for block in backbone._stage_blocks(i)
                for n in (name_of[id(p)] for p in block.parameters())}
    assert {n: coarse[n] for n in stage_of} == {n: i + 1 for n, i in stage_of.items()}
    assert {coarse[n] for n in stem} == {0} and {coarse[n] for n in head} == {backbone.num_stages + 1}

    # timm's group_modules: the modules whose own parameters lie in one group, grouped as those parameters
    modules = group_modules(model, model.group_matcher(), reverse=True)
    pairs = set()
    for name, module in named_modules_with_params(model):
        own = {groups[f'{name}.{n}'] for n, _ in module.named_parameters(recurse=False)}
        if len(own) == 1:
            pairs.add((own.pop(), modules[name]))
    assert len({a for a, _ in pairs}) == len({b for _, b in pairs}) == len(pairs) == len(blocks) + 2
    assert [b for _, b in sorted(pairs)] == sorted(b for _, b in pairs)  # in the order they run

    optimizer = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    scales = {name_of[id(p)]: g['lr_scale'] for g in optimizer.param_groups for p in g['params']}
    assert scales[head[0]] == 1 and scales[stem[0]] == 0.5 ** (len(blocks) + 1)


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
