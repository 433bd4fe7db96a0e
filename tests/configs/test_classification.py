"""The ImageNet recipes (configs/classification): the recipe models reproduce the official logits from
official files, build the released architectures, train one step; the FLatten / InLine recipes are the
Pola ones with another attention; the 384 fine-tunes start from 224 weights. The numbers of the recipes:
test_recipes_doc.py."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from tests.fixtures.checkpoints import classifier_from_official
from tests.fixtures.paths import CONFIGS, DATA

CONFIG_DIR = osp.join(CONFIGS, 'classification')
TOL = 1e-5
MINI_SWIN = dict(embed_dims=8, depths=[1, 1, 2, 1], num_heads=[1, 1, 2, 2])
MINI_PVT = dict(embed_dims=[8, 16, 24, 32], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])


def _load(name):
    import mmpola.classification  # noqa: F401
    return Config.fromfile(osp.join(CONFIG_DIR, name))


def _build(model_cfg):
    from mmengine.registry import MODELS
    return MODELS.build(model_cfg)


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_recipe_model_reproduces_official_logits(golden, family):
    """The model of a classification config, built for the golden mini arch and initialised
    through init_cfg=Pretrained from the official file, gives the official logits."""
    from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
    expected, ckpt = golden[family]
    cfg = _load(f'pola-{family}-t_8xb128_in1k.py')
    cfg.model.update(official_kwargs_to_classifier_kwargs(expected['constructor']))
    cfg.model.init_cfg = dict(type='Pretrained', checkpoint=ckpt)
    model = _build(cfg.model)
    model.init_weights()
    model.eval()
    with torch.no_grad():
        logits = model(expected['input'], mode='tensor')
    assert (logits - expected['logits']).abs().max() <= TOL


def test_weight_decay_groups_follow_the_official_set():
    """No decay for 1-D parameters and Swin's relative position bias; Pola's power, scale and
    positional encodings (and PVT's pos_embed) are decayed, as the official set_weight_decay."""
    from mmengine.optim import build_optim_wrapper
    cfg = _load('pola-swin-t_8xb128_in1k.py')
    cfg.model.arch = MINI_SWIN
    model = _build(cfg.model)
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)]: g['weight_decay'] for g in optim.optimizer.param_groups for p in g['params']}
    for name, wd in decay.items():
        param = model.get_parameter(name)
        assert wd == (0 if param.ndim == 1 or 'relative_position_bias_table' in name else 0.05), name
    assert any('attn.power' in n for n in decay) and any('positional_encoding' in n for n in decay)
    # one group per set of options (mmpola.runtime.param_groups): decayed, 1-D, and the custom key's (which
    # also holds its decay_mult)
    assert len(optim.optimizer.param_groups) == 3


RECIPES = sorted(osp.relpath(p, CONFIG_DIR) for p in glob.glob(osp.join(CONFIG_DIR, '**', '*.py'), recursive=True)
                 if '_base_' not in p)


@pytest.mark.parametrize('name', RECIPES)
def test_timm_optimizer_factory_decays_as_the_recipe(name):
    """timm's optimizer factory (the 1-D parameters and the model's ``no_weight_decay()``) leaves the same
    parameters undecayed as the recipe's ``paramwise_cfg``, for the released size of every recipe."""
    from mmengine.optim import DefaultOptimWrapperConstructor
    from timm.optim._param_groups import param_groups_weight_decay
    cfg = _load(name)
    with torch.device('meta'):
        model = _build(cfg.model)
    groups = []
    DefaultOptimWrapperConstructor(cfg.optim_wrapper, cfg.optim_wrapper.get('paramwise_cfg')).add_params(groups,
                                                                                                        model)
    name_of = {id(p): n for n, p in model.named_parameters()}
    recipe = {name_of[id(g['params'][0])] for g in groups if g.get('weight_decay', 1) == 0}
    timm_groups = param_groups_weight_decay(model, 0.05, no_weight_decay_list=model.no_weight_decay())
    assert {name_of[id(p)] for p in timm_groups[0]['params']} == recipe
    assert timm_groups[0]['weight_decay'] == 0 and recipe


# the FLatten / InLine recipes of the PVT and Swin sizes, which have a Pola recipe of the same size (PVTv2,
# CSWin and DeiT: their releases' own recipes, below)
LINEAGE = sorted(osp.relpath(p, CONFIG_DIR) for kind in ('flatten', 'inline')
                 for p in glob.glob(osp.join(CONFIG_DIR, kind, '*-pvt-[tsml]_*.py')) +
                 glob.glob(osp.join(CONFIG_DIR, kind, '*-swin-[tsb]_*.py')))


@pytest.mark.parametrize('name', LINEAGE)
def test_lineage_recipe_is_the_pola_recipe_with_another_attention(name):
    """Apart from the attention (kind, and the released layout of InLine-Swin-S/B), the init file of
    the 384 fine-tunes and the batch per GPU of the official yaml, each FLatten / InLine recipe is
    the Pola recipe of that size."""
    kind = osp.dirname(name)
    cfg = _load(name)
    stem = osp.basename(name).split('_')[0].replace(kind, 'pola')  # e.g. pola-pvt-t
    suffix = '_in1k-384px.py' if name.endswith('-384px.py') else '_in1k.py'
    (pola_path,) = [p for p in glob.glob(osp.join(CONFIG_DIR, f'{stem}_*{suffix}')) if p.endswith(suffix)]
    pola = Config.fromfile(pola_path)
    assert cfg.model.kind == kind
    ours, theirs = cfg.to_dict(), pola.to_dict()
    for d in (ours, theirs):
        for key in ('kind', 'attn_type'):
            d['model'].pop(key, None)
        d['model'].get('init_cfg', {}).pop('checkpoint', None)
        d['train_dataloader'].pop('batch_size')
    assert ours == theirs


@pytest.mark.parametrize('name, attn_type, params', [
    ('inline/inline-swin-t_8xb128_in1k.py', 'IIIS', 29223544),
    ('inline/inline-swin-s_8xb128_in1k.py', 'IISS', 49793296),
    ('inline/inline-swin-b_8xb64_in1k.py', 'IIMS2', 88350120),
    ('inline/inline-swin-b_8xb32_in1k-384px.py', 'IIMS2', None),
])
def test_inline_swin_recipes_build_the_released_layouts(name, attn_type, params):
    """The released InLine-Swin sizes differ in their attention layout (official cfgs/inline_swin_*.yaml):
    the recipe models have exactly the parameter count of the released state dicts."""
    cfg = _load(name)
    with torch.device('meta'):
        model = _build(cfg.model)
    assert model.backbone.attn_type == attn_type
    if params is not None:
        assert sum(t.numel() for t in model.state_dict().values()) == params


@pytest.mark.parametrize('name', ['flatten/flatten-swin-t_8xb128_in1k.py', 'inline/inline-pvt-t_8xb128_in1k.py'])
def test_lineage_recipe_model_trains_one_step(name):
    from mmengine.optim import build_optim_wrapper
    cfg = _load(name)
    cfg.model.arch = MINI_SWIN if 'swin' in name else MINI_PVT
    cfg.model.pop('attn_type', None)
    cfg.model.num_classes = 5
    torch.manual_seed(0)
    model = _build(cfg.model)
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    assert model.kind == name.split('/')[0]
    loss = model(torch.randn(2, 3, 64, 64), dict(gt_label=torch.tensor([0, 3])), mode='loss')['loss']
    assert torch.isfinite(loss)
    qkv = model.backbone.layers[0].blocks[0].attn.qkv if 'swin' in name else model.backbone.block1[0].attn.q
    before = qkv.weight.detach().clone()
    optim.update_params(loss)
    assert not torch.equal(qkv.weight, before)


@pytest.mark.parametrize('name', ['pola-swin-b_8xb32_in1k-384px.py', 'flatten/flatten-swin-b_8xb32_in1k-384px.py',
                                  'inline/inline-swin-b_8xb32_in1k-384px.py'])
def test_384_finetune_starts_from_224_weights_trains_and_predicts(name, tmp_path):
    """The 384 recipe model (the mini arch here) initialises from a 224 checkpoint of the same model
    through its init_cfg: positional encodings and softmax bias tables are resized, every other tensor
    is copied; then one training step at 384 and a prediction."""
    from mmengine.optim import build_optim_wrapper
    cfg = _load(name)
    arch = dict(MINI_SWIN, depths=[1, 1, 2, 2])  # two blocks in stage 4 (softmax in every layout)
    layout = 'IIMS1' if cfg.model.get('attn_type') == 'IIMS2' else None  # stage 3 of the mini has 2 blocks
    torch.manual_seed(0)
    source = _build(dict(cfg.model, arch=arch, pretrain_img_size=224, window_size=56, attn_type=layout,
                         init_cfg=None, num_classes=5))
    torch.save({'model': source.state_dict()}, tmp_path / 'w224.pth')
    model = _build(dict(cfg.model, arch=arch, attn_type=layout, num_classes=5,
                        init_cfg=dict(cfg.model.init_cfg, checkpoint=str(tmp_path / 'w224.pth'))))
    model.init_weights()
    assert model.backbone.window_size == 96 and cfg.model.pretrain_img_size == 384
    theirs = source.state_dict()
    resized = [k for k, v in model.state_dict().items() if v.shape != theirs[k].shape]
    assert resized and all('positional_encoding' in k or 'relative_position_bias_table' in k for k in resized)
    assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items() if k not in resized)

    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    images = torch.randn(2, 3, 384, 384)
    loss = model(images, dict(gt_label=torch.tensor([0, 3])), mode='loss')['loss']
    optim.update_params(loss)
    assert torch.isfinite(loss)
    model.eval()
    with torch.no_grad():
        assert model(images[:1], mode='tensor').shape == (1, 5)


def test_polapp_recipe_model_reproduces_official_logits_and_trains_one_step():
    """The b0 recipe's model, built for the golden mini arch, loads the official file through
    init_cfg=Pretrained (official logits), then one optimizer step of the recipe with a gradient for
    every parameter; PaCS's s1 / s2 and the layer scales are decayed, as the official set."""
    from mmengine.optim import build_optim_wrapper

    from mmpola.checkpoint.reading import safe_torch_load
    from mmpola.models import ImageClassifier
    expected = safe_torch_load(osp.join(DATA, 'polapp_mini_expected.pth'))
    cfg = _load('polapp-b0_8xb256_in1k.py')
    reference = classifier_from_official(ImageClassifier, expected['constructor'])
    cfg.model.update(arch=reference.backbone.arch, projection=reference.num_features, num_classes=10,
                     drop_path_rate=0.0,
                     init_cfg=dict(type='Pretrained', checkpoint=osp.join(DATA, 'polapp_mini_official.pth')))
    model = _build(cfg.model)
    model.init_weights()
    model.eval()
    with torch.no_grad():
        logits = model(expected['input'], mode='tensor')
    assert (logits - expected['logits']).abs().max() <= 1e-4

    model.train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    scores = torch.softmax(torch.randn(2, 10), dim=-1)
    loss = model(expected['input'], dict(gt_score=scores), mode='loss')['loss']
    optim_wrapper.backward(loss)
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    optim_wrapper.step()
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)]: g['weight_decay'] for g in optim_wrapper.optimizer.param_groups for p in g['params']}
    assert decay['backbone.layers.0.blocks.0.attn.s1'] == 0.05 and decay['backbone.layers.0.blocks.0.gamma_1'] == 0.05
    assert decay['backbone.layers.0.blocks.0.norm1.norm.weight'] == 0.0


# the recipes of the other macro architectures of the FLatten and InLine releases: (family, arch, layout, the
# timm entry whose released parameter count the model has)
MACRO = {
    'flatten/flatten-pvt-v2-b0_8xb128_in1k.py': ('pvt_v2', 'b0', 'LLLL', 'flatten_pvt_v2_b0'),
    'flatten/flatten-pvt-v2-b1_8xb128_in1k.py': ('pvt_v2', 'b1', 'LLLL', 'flatten_pvt_v2_b1'),
    'flatten/flatten-pvt-v2-b2_8xb128_in1k.py': ('pvt_v2', 'b2', 'LLLL', 'flatten_pvt_v2_b2'),
    'flatten/flatten-pvt-v2-b3_8xb128_in1k.py': ('pvt_v2', 'b3', 'LLLL', 'flatten_pvt_v2_b3'),
    'flatten/flatten-pvt-v2-b4_8xb64_in1k.py': ('pvt_v2', 'b4', 'LLLL', 'flatten_pvt_v2_b4'),
    'flatten/flatten-cswin-t_8xb256_in1k.py': ('cswin', 'tiny', 'LLSS', 'flatten_cswin_tiny'),
    'flatten/flatten-cswin-s_8xb128_in1k.py': ('cswin', 'small', 'LLSS', 'flatten_cswin_small'),
    'flatten/flatten-cswin-b_8xb64_in1k.py': ('cswin', 'base', 'LLSS', 'flatten_cswin_base'),
    'flatten/flatten-cswin-b_8xb32_in1k-384px.py': ('cswin', 'base_384', 'LLSS', 'flatten_cswin_base_384'),
    'inline/inline-cswin-t_8xb128_in1k.py': ('cswin', 'tiny', 'IISS', 'inline_cswin_tiny'),
    'inline/inline-cswin-s_8xb128_in1k.py': ('cswin', 'small', 'IISS', 'inline_cswin_small'),
    'inline/inline-cswin-b_8xb64_in1k.py': ('cswin', 'base', 'IISS', 'inline_cswin_base'),
    'inline/inline-cswin-b_8xb32_in1k-384px.py': ('cswin', 'base_384', 'IISS', 'inline_cswin_base_384'),
    'inline/inline-deit-t_8xb512_in1k.py': ('vit', 'tiny', 'I' * 12, 'inline_deit_tiny'),
    'inline/inline-deit-s_8xb128_in1k-288px.py': ('vit', 'small', 'I' * 12, 'inline_deit_small'),
    'inline/inline-deit-b_8xb64_in1k-448px.py': ('vit', 'base', 'I' * 12, 'inline_deit_base'),
}


@pytest.mark.parametrize('name', list(MACRO))
def test_macro_recipes_build_the_released_models(name):
    """The recipe models are the released architectures (the parameter count of the released state dict), at
    their pretraining size (the timm entry's evaluation size), with their EMA where the release used one."""
    import json

    import timm
    family, arch, layout, entry = MACRO[name]
    cfg = _load(name)
    with torch.device('meta'):
        model = _build(cfg.model)
        reference = timm.create_model(entry)
    assert (model.family, model.backbone.arch_name, model.backbone.attn_type) == (family, arch, layout)
    with open(osp.join(DATA, 'macro_key_manifest.json')) as f:
        assert sum(t.numel() for t in model.state_dict().values()) == json.load(f)[entry]['params_total']
    size = reference.pretrained_cfg['input_size'][-1]
    for loader in ('train_dataloader', 'test_dataloader'):
        transform = next(t for t in cfg[loader].dataset.pipeline if t.type == 'TimmTransform')
        assert transform.input_size == size
    ema = [h for h in cfg.custom_hooks if h.type == 'SwitchableEMAHook' and h.enabled]
    assert bool(ema) == (family == 'cswin')  # main_ema.py trains the CSWin models


MINI_MACRO = {'pvt_v2': MINI_PVT, 'cswin': dict(MINI_SWIN, num_heads=[2, 2, 2, 2], split_size=[1, 2, 7, 7]),
              'vit': dict(embed_dims=16, depth=2, num_heads=2, img_size=64)}


@pytest.mark.parametrize('name', ['flatten/flatten-pvt-v2-b3_8xb128_in1k.py', 'inline/inline-cswin-t_8xb128_in1k.py',
                                  'inline/inline-deit-s_8xb128_in1k-288px.py'])
def test_macro_recipe_model_trains_one_step(name):
    """One step of the recipe's optimizer (the mini arch) with a gradient for every parameter; InLine-DeiT's
    position embedding and class token are not decayed (its no_weight_decay), CSWin's and PVTv2's encodings are."""
    from mmengine.optim import build_optim_wrapper
    cfg = _load(name)
    family = MACRO[name][0]
    torch.manual_seed(0)
    model = _build(dict(cfg.model, arch=MINI_MACRO[family], num_classes=5))
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    loss = model(torch.randn(2, 3, 64, 64), dict(gt_label=torch.tensor([0, 3])), mode='loss')['loss']
    optim.backward(loss)
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    optim.step()
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)]: g['weight_decay'] for g in optim.optimizer.param_groups for p in g['params']}
    for key, wd in decay.items():
        param = model.get_parameter(key)
        no_decay = param.ndim == 1 or (family == 'vit' and key.endswith(('pos_embed', 'cls_token')))
        assert wd == (0 if no_decay else cfg.optim_wrapper.optimizer.weight_decay), key


def test_cswin_384_finetune_starts_from_official_224_weights(golden_data):
    """The CSWin-B-384 recipe's model (the golden mini arch) initialises from an official 224 FLatten-CSWin file:
    the linear stages' positional encodings are resized to the 384 grids (56x56 -> 96x96, bicubic), every other
    tensor is the file's; the 384 model runs at 384."""
    from mmpola.checkpoint.reading import safe_torch_load
    from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
    expected, ckpt = golden_data('flatten_cswin')
    kwargs = official_kwargs_to_classifier_kwargs(expected['constructor'], 'cswin')
    cfg = _load('flatten/flatten-cswin-b_8xb32_in1k-384px.py')
    arch = dict(kwargs['arch'], split_size=[1, 2, 12, 12])
    model = _build(dict(cfg.model, arch=arch, num_classes=10, attn=kwargs['attn'],
                        init_cfg=dict(cfg.model.init_cfg, checkpoint=ckpt)))
    model.init_weights()
    official = safe_torch_load(ckpt)['model']
    ours = {k[len('backbone.'):] if k.startswith('backbone.') else k: v for k, v in model.state_dict().items()}
    resized = sorted(k for k, v in ours.items() if v.shape != official[k].shape)
    assert resized == ['stage1.0.attns.0.positional_encoding', 'stage2.0.attns.0.positional_encoding',
                       'stage2.1.attns.0.positional_encoding']
    assert ours[resized[0]].shape == (1, 96 * 96, 16)
    assert all(torch.equal(v, official[k]) for k, v in ours.items() if k not in resized)
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 384, 384), mode='tensor')).all()
