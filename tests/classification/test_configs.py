"""The ImageNet recipes (configs/classification) and the official-weights path through the tools."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from tests.fixtures.paths import REPO as REPO_ROOT  # noqa: E402
from tests.fixtures.tools import load_tool

CONFIG_DIR = osp.join(REPO_ROOT, 'configs', 'classification')
TOL = 1e-5
# file -> (family, arch, drop_path_rate, batch per GPU, clip_grad max_norm, warm-up epochs, epochs)
RECIPES = {
    'pola-pvt-t_8xb128_in1k.py': ('pvt', 'tiny', 0.1, 128, None, 5, 310),
    'pola-pvt-s_8xb64_in1k.py': ('pvt', 'small', 0.1, 64, None, 5, 310),
    'pola-pvt-m_8xb64_in1k.py': ('pvt', 'medium', 0.3, 64, 1.0, 5, 310),
    'pola-pvt-l_8xb32_in1k.py': ('pvt', 'large', 0.3, 32, 1.0, 5, 310),
    'pola-swin-t_8xb128_in1k.py': ('swin', 'tiny', 0.2, 128, 5.0, 20, 300),
    'pola-swin-s_8xb128_in1k.py': ('swin', 'small', 0.3, 128, 5.0, 20, 300),
    'pola-swin-b_8xb128_in1k.py': ('swin', 'base', 0.5, 128, 5.0, 20, 300),
}


def test_every_size_has_a_recipe():
    found = {osp.basename(p) for p in glob.glob(osp.join(CONFIG_DIR, 'pola-*.py'))}
    assert found == set(RECIPES)


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_recipe_values(name):
    family, arch, dpr, batch, clip, warmup, epochs = RECIPES[name]
    cfg = Config.fromfile(osp.join(CONFIG_DIR, name))
    assert cfg.default_scope == 'mmengine'
    assert 'mmpola.classification' in cfg.custom_imports['imports']
    model = cfg.model
    assert (model.type, model.family, model.arch, model.drop_path_rate) == \
        ('PolaImageClassifier', family, arch, dpr)
    assert model.num_classes == 1000 and model.label_smoothing == 0.1
    assert cfg.train_dataloader.batch_size == batch and cfg.train_dataloader.drop_last
    # lr 5e-4 per 512 images, always scaled like the official main.py
    assert cfg.optim_wrapper.optimizer.lr == 5e-4
    assert cfg.auto_scale_lr == dict(enable=True, base_batch_size=512)
    assert cfg.optim_wrapper.optimizer.weight_decay == 0.05
    assert cfg.optim_wrapper.paramwise_cfg.flat_decay_mult == 0.0
    assert cfg.optim_wrapper.get('clip_grad', {}).get('max_norm') == clip
    warm, cosine = cfg.param_scheduler
    assert (warm.type, warm.end, cosine.type, cosine.begin, cosine.end) == \
        ('LinearLR', warmup, 'CosineAnnealingLR', warmup, 300)
    warmup_lr, min_lr = (1e-6, 1e-5) if family == 'pvt' else (5e-7, 5e-6)
    assert warm.start_factor == pytest.approx(warmup_lr / 5e-4)
    assert cosine.eta_min_ratio == pytest.approx(min_lr / 5e-4)
    assert cfg.train_cfg.max_epochs == epochs
    mixup = cfg.data_preprocessor.mixup
    assert (mixup.mixup_alpha, mixup.cutmix_alpha, mixup.label_smoothing) == (0.8, 1.0, 0.1)
    assert cfg.data_preprocessor.random_erasing.probability == 0.25
    train_tf, test_tf = cfg.train_pipeline[1], cfg.test_pipeline[1]
    assert train_tf.auto_augment == 'rand-m9-mstd0.5-inc1' and train_tf.interpolation == 'bicubic'
    assert (test_tf.crop_pct, test_tf.crop_mode, test_tf.interpolation) == (224 / 256, 'squash', 'bicubic')
    assert cfg.custom_hooks[0].type == 'SwitchableEMAHook' and not cfg.custom_hooks[0].enabled


def test_weight_decay_groups_follow_the_official_set():
    """No decay for 1-D parameters and Swin's relative position bias; Pola's power, scale,
    positional encodings (and PVT's pos_embed) are decayed (as the official training configs)."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS
    cfg = Config.fromfile(osp.join(CONFIG_DIR, 'pola-swin-t_8xb128_in1k.py'))
    cfg.model.arch = dict(embed_dims=8, depths=[1, 1, 2, 1], num_heads=[1, 1, 2, 2])
    model = MODELS.build(cfg.model)
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)]: g['weight_decay'] for g in optim.optimizer.param_groups for p in g['params']}
    for name, wd in decay.items():
        param = model.get_parameter(name)
        if param.ndim == 1 or 'relative_position_bias_table' in name:
            assert wd == 0, name
        else:
            assert wd == 0.05, name
    assert any('attn.power' in n for n in decay) and any('positional_encoding' in n for n in decay)


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_recipe_model_reproduces_official_logits(golden, family):
    """The model of a classification config, built for the golden mini arch and initialised
    through init_cfg=Pretrained from the official file, gives the official logits."""
    from mmengine.registry import MODELS

    from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
    expected, ckpt = golden[family]
    cfg = Config.fromfile(osp.join(CONFIG_DIR, f'pola-{family}-t_8xb128_in1k.py'))
    cfg.model.update(official_kwargs_to_classifier_kwargs(expected['constructor']))
    cfg.model.init_cfg = dict(type='Pretrained', checkpoint=ckpt)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.eval()
    with torch.no_grad():
        logits = model(expected['input'], mode='tensor')
    assert (logits - expected['logits']).abs().max() <= TOL


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_tools_test_loads_official_checkpoint(golden, tiny_imagenet, tmp_path, family):
    """tools/test.py CONFIG OFFICIAL.pth: the Runner's load_from path (mmengine hands over the
    whole {'model': ..., 'config': ...} container) loads the official weights: official logits."""
    test_tool = load_tool('test')
    from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
    expected, ckpt = golden[family]
    kwargs = official_kwargs_to_classifier_kwargs(expected['constructor'])
    config = tmp_path / 'mini.py'
    config.write_text(
        f"_base_ = [{osp.join(CONFIG_DIR, f'pola-{family}-t_8xb128_in1k.py')!r}]\n"
        f"model = dict(arch=dict(_delete_=True, **{kwargs.pop('arch')!r}), **{kwargs!r})\n"
        f"test_dataloader = dict(num_workers=0, persistent_workers=False, "
        f"dataset=dict(data_root={tiny_imagenet!r}))\n")
    args = test_tool.parse_args([str(config), ckpt, '--work-dir', str(tmp_path / 'work')])
    runner = test_tool.build_runner(args)
    runner.load_or_resume()
    model = runner.model.eval()
    with torch.no_grad():
        logits = model(expected['input'], mode='tensor')
    assert (logits - expected['logits']).abs().max() <= TOL
