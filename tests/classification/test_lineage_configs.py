"""FLatten / InLine ImageNet recipes (configs/classification/{flatten,inline}): the official yaml
settings, i.e. the Pola recipe of the same size with the other attention (and the official batch
per GPU where it differs); each builds and trains one step."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

CONFIG_DIR = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'configs', 'classification')
# file -> batch per GPU (cfgs/*.yaml of the official repositories)
RECIPES = {
    'flatten/flatten-pvt-t_8xb128_in1k.py': 128, 'flatten/flatten-pvt-s_8xb64_in1k.py': 64,
    'flatten/flatten-pvt-m_8xb64_in1k.py': 64, 'flatten/flatten-pvt-l_8xb32_in1k.py': 32,
    'flatten/flatten-swin-t_8xb128_in1k.py': 128, 'flatten/flatten-swin-s_8xb128_in1k.py': 128,
    'flatten/flatten-swin-b_8xb64_in1k.py': 64,
    'inline/inline-pvt-t_8xb128_in1k.py': 128, 'inline/inline-pvt-s_8xb128_in1k.py': 128,
    'inline/inline-pvt-m_8xb128_in1k.py': 128, 'inline/inline-pvt-l_8xb64_in1k.py': 64,
    'inline/inline-swin-t_8xb128_in1k.py': 128, 'inline/inline-swin-s_8xb128_in1k.py': 128,
    'inline/inline-swin-b_8xb64_in1k.py': 64,
}


def test_every_size_has_a_recipe():
    found = {osp.relpath(p, CONFIG_DIR) for p in glob.glob(osp.join(CONFIG_DIR, '*', '*.py'))
             if not p.startswith(osp.join(CONFIG_DIR, '_base_'))}
    assert found == set(RECIPES)


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_recipe_is_the_pola_recipe_with_another_attention(name):
    kind = name.split('/')[0]
    cfg = Config.fromfile(osp.join(CONFIG_DIR, name))
    stem = osp.basename(name).split('_')[0].replace(kind, 'pola')  # e.g. pola-pvt-t
    (pola_path,) = glob.glob(osp.join(CONFIG_DIR, f'{stem}_*.py'))
    pola = Config.fromfile(pola_path)
    assert cfg.model.kind == kind and cfg.train_dataloader.batch_size == RECIPES[name]
    ours, theirs = cfg.to_dict(), pola.to_dict()
    for d in (ours, theirs):
        d['model'].pop('kind', None)
        d['train_dataloader'].pop('batch_size')
    assert ours == theirs


@pytest.mark.parametrize('name', ['flatten/flatten-swin-t_8xb128_in1k.py', 'inline/inline-pvt-t_8xb128_in1k.py'])
def test_recipe_model_trains_one_step(name):
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS

    import mmpola.classification  # noqa: F401
    cfg = Config.fromfile(osp.join(CONFIG_DIR, name))
    cfg.model.arch = (dict(embed_dims=8, depths=[1, 1, 2, 1], num_heads=[1, 1, 2, 2]) if 'swin' in name else
                      dict(embed_dims=[8, 16, 24, 32], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2],
                           depths=[1, 1, 1, 1]))
    cfg.model.num_classes = 5
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    assert model.kind == name.split('/')[0]
    loss = model(torch.randn(2, 3, 64, 64), dict(gt_label=torch.tensor([0, 3])), mode='loss')['loss']
    assert torch.isfinite(loss)
    qkv = model.backbone.layers[0].blocks[0].attn.qkv if 'swin' in name else model.backbone.block1[0].attn.q
    before = qkv.weight.detach().clone()
    optim.update_params(loss)
    assert not torch.equal(qkv.weight, before)
