"""Every detection config builds, computes its losses (with a backward pass) and predicts on a
small input; the recipes hold the numbers the configs promise (schedule, no-decay keys, init)."""
import glob
import os.path as osp

import mmdet  # noqa: E402,F401  (required: a broken install fails here)
import pytest

from tests.fixtures.detection import build_detector as _build_detector  # noqa: F401
from tests.fixtures.detection import check_trains_one_step_and_predicts
from tests.fixtures.detection import config_names as _names
from tests.fixtures.detection import load_config as _load
from tests.fixtures.paths import REPO

DETECTION_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', 'detection', '*_pola-*.py')))
DEMO_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', 'demo', '*coco*.py')))
NO_DECAY_KEYS = {'norm', 'pos_embed', 'positional_encoding', 'relative_position_bias_table', 'attn.power',
                 'attn.scale'}


def test_the_configs_the_issue_lists_exist():
    names = set(_names(DETECTION_CONFIGS))
    for algo, backbones, schedule in (
            ('retinanet', ('pvt-t', 'pvt-s', 'swin-t'), '1x'),
            ('mask-rcnn', ('pvt-t', 'pvt-s', 'swin-t', 'swin-s'), '1x'),
            ('mask-rcnn', ('pvt-s', 'swin-t', 'swin-s'), 'ms-crop-3x'),
            ('cascade-mask-rcnn', ('swin-t', 'swin-s'), 'ms-crop-3x')):
        for backbone in backbones:
            assert f'{algo}_pola-{backbone}_fpn_{schedule}_coco' in names


@pytest.mark.parametrize('path', DETECTION_CONFIGS + DEMO_CONFIGS, ids=_names(DETECTION_CONFIGS + DEMO_CONFIGS))
def test_config_trains_one_step_and_predicts(path):
    cfg, model, optim_wrapper = check_trains_one_step_and_predicts(path)
    # weight decay: none for norms, position parameters and Pola's power/scale logits; decayed
    # for everything else (e.g. every projection and conv weight)
    decay = cfg.optim_wrapper.optimizer.weight_decay
    params = dict(model.named_parameters())
    for group in optim_wrapper.optimizer.param_groups:
        for param in group['params']:
            name = next(n for n, p in params.items() if p is param)
            exempt = any(key in name for key in NO_DECAY_KEYS)
            assert group['weight_decay'] == (0 if exempt else decay), name
    names = params.keys()
    assert any(n.endswith('attn.power') for n in names) and any(n.endswith('attn.scale') for n in names)


@pytest.mark.parametrize('path', DETECTION_CONFIGS, ids=_names(DETECTION_CONFIGS))
def test_config_recipe(path):
    cfg = _load(path)
    name = osp.basename(path)
    backbone = cfg.model.backbone
    assert backbone.type in ('PolaPVT', 'PolaSwin')
    assert cfg.custom_imports.imports == ['mmpola']
    init = backbone.init_cfg
    assert init.type == 'Pretrained' and init.checkpoint.startswith('checkpoints/pola_')
    size = {'-t_': 'tiny', '-s_': 'small'}[next(k for k in ('-t_', '-s_') if k in name)]
    assert backbone.arch == size and init.checkpoint.endswith(f'_{size}.pth')

    optimizer = cfg.optim_wrapper.optimizer
    assert optimizer.type == 'AdamW' and optimizer.lr == 1e-4
    assert optimizer.weight_decay == (0.05 if backbone.type == 'PolaSwin' else 1e-4)
    assert NO_DECAY_KEYS <= set(cfg.optim_wrapper.paramwise_cfg.custom_keys)
    assert all(v == dict(decay_mult=0.) for v in cfg.optim_wrapper.paramwise_cfg.custom_keys.values())
    assert cfg.optim_wrapper.type == 'OptimWrapper'  # AMP with tools/train.py --amp
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)
    assert cfg.train_dataloader.batch_size == 2

    warmup, steps = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and not warmup.by_epoch
    assert steps.type == 'MultiStepLR'
    if '3x' in name:
        assert cfg.train_cfg.max_epochs == 36 and steps.milestones == [27, 33]
        assert 'RandomChoice' in [t.type for t in cfg.train_dataloader.dataset.pipeline]
    else:
        assert cfg.train_cfg.max_epochs == 12 and steps.milestones == [8, 11]
    low, high = {'tiny': (0.1, 0.2), 'small': (0.2, 0.3)}[size]
    assert low <= backbone.drop_path_rate <= high
    if name.startswith('cascade'):
        heads = cfg.model.roi_head.bbox_head
        assert len(heads) == 3 and all(h.type == 'Shared4Conv1FCBBoxHead' for h in heads)
        assert all(h.loss_bbox.type == 'GIoULoss' and h.reg_decoded_bbox for h in heads)
    channels = {'PolaPVT': [64, 128, 320, 512], 'PolaSwin': [96, 192, 384, 768]}[backbone.type]
    assert cfg.model.neck.in_channels == [channels[i] for i in backbone.out_indices]
