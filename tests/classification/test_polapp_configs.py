"""The PolaFormer++ ImageNet recipes (configs/classification/polapp-*): the official yaml settings with
EMA on; the recipe model reproduces the official logits and trains one step on the CPU."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from tests.fixtures.paths import REPO as REPO_ROOT  # noqa: E402

CONFIG_DIR = osp.join(REPO_ROOT, 'configs', 'classification')
DATA = osp.join(REPO_ROOT, 'tests', 'data')
# file -> (arch, drop path, batch per GPU, lr per 512, weight decay, warm-up epochs, warm-up lr, min lr,
#          clip max_norm, epochs incl. cool-down)
RECIPES = {
    'polapp-b0_8xb256_in1k.py': ('b0', 0.1, 256, 5e-4, 0.05, 20, 5e-7, 1e-7, 5.0, 300),
    'polapp-b1_8xb256_in1k.py': ('b1', 0.1, 256, 5e-4, 0.05, 20, 5e-7, 1e-7, 5.0, 300),
    'polapp-b2_8xb256_in1k.py': ('b2', 0.1, 256, 5e-4, 0.05, 20, 5e-7, 1e-7, 5.0, 300),
    'polapp-b3_8xb128_in1k.py': ('b3', 0.15, 128, 5e-4, 0.05, 20, 5e-7, 1e-7, 5.0, 300),
    'polapp-b4_8xb128_in1k.py': ('b4', 0.4, 128, 5e-4, 0.05, 5, 1e-7, 1e-5, 1.0, 310),
    'polapp-b5_8xb64_in1k.py': ('b5', 0.55, 64, 2e-5, 1e-8, 1, 5e-7, 5e-6, None, 305),
}


def test_every_size_has_a_recipe():
    assert {osp.basename(p) for p in glob.glob(osp.join(CONFIG_DIR, 'polapp-*.py'))} == set(RECIPES)


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_recipe_values(name):
    arch, dpr, batch, lr, wd, warmup, warmup_lr, min_lr, clip, epochs = RECIPES[name]
    cfg = Config.fromfile(osp.join(CONFIG_DIR, name))
    model = cfg.model
    assert (model.type, model.arch, model.drop_path_rate, model.num_classes) == \
        ('PolaPPImageClassifier', arch, dpr, 1000)
    assert cfg.train_dataloader.batch_size == batch
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.lr, optimizer.weight_decay) == ('AdamW', lr, wd)
    assert cfg.optim_wrapper.paramwise_cfg.flat_decay_mult == 0.0
    assert cfg.auto_scale_lr == dict(enable=True, base_batch_size=512)
    assert cfg.optim_wrapper.get('clip_grad', {}).get('max_norm') == clip
    warm, cosine = cfg.param_scheduler
    assert (warm.type, warm.end, cosine.type, cosine.begin, cosine.end) == \
        ('LinearLR', warmup, 'CosineAnnealingLR', warmup, 300)
    assert warm.start_factor == pytest.approx(warmup_lr / lr)
    assert cosine.eta_min_ratio == pytest.approx(min_lr / lr)
    assert cfg.train_cfg.max_epochs == epochs
    ema = cfg.custom_hooks[0]
    assert ema.type == 'SwitchableEMAHook' and ema.enabled and ema.momentum == pytest.approx(1 - 0.99982)
    assert cfg.data_preprocessor.mixup.mixup_alpha == 0.8


def test_recipe_model_reproduces_official_logits_and_trains_one_step():
    """The b0 recipe's model, built for the golden mini arch, loads the official file through
    init_cfg=Pretrained (official logits), then one optimizer step of the recipe runs on the CPU with
    a gradient for every parameter."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS

    import mmpola.classification  # noqa: F401
    from mmpola.checkpoint.reading import safe_torch_load
    from mmpola.models import PolaPPClassifier
    expected = safe_torch_load(osp.join(DATA, 'polapp_mini_expected.pth'))
    cfg = Config.fromfile(osp.join(CONFIG_DIR, 'polapp-b0_8xb256_in1k.py'))
    reference = PolaPPClassifier.from_official_kwargs(expected['constructor'])
    cfg.model.update(arch=reference.backbone.arch, projection=reference.num_features, num_classes=10,
                     drop_path_rate=0.0,
                     init_cfg=dict(type='Pretrained', checkpoint=osp.join(DATA, 'polapp_mini_official.pth')))
    model = MODELS.build(cfg.model)
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
    # s1 / s2 and the layer scales are decayed, as the official set (only 1-D parameters are not)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)]: g['weight_decay'] for g in optim_wrapper.optimizer.param_groups for p in g['params']}
    assert decay['backbone.layers.0.blocks.0.attn.s1'] == 0.05 and decay['backbone.layers.0.blocks.0.gamma_1'] == 0.05
    assert decay['backbone.layers.0.blocks.0.norm1.norm.weight'] == 0.0
