"""The PolaFormer++ detection configs: each builds, trains one step on the CPU (every parameter gets a
gradient) and predicts; the recipes hold the official numbers."""
import glob
import os.path as osp

import pytest

from tests.fixtures.detection import check_trains_one_step_and_predicts
from tests.fixtures.detection import config_names as _names
from tests.fixtures.detection import load_config as _load
from tests.fixtures.paths import REPO

POLAPP_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', 'detection', '*_polapp-*.py')))


def test_the_listed_configs_exist():
    assert set(_names(POLAPP_CONFIGS)) == {
        'mask-rcnn_polapp-b2_fpn_1x_coco', 'mask-rcnn_polapp-b3_fpn_1x_coco',
        'mask-rcnn_polapp-b2_fpn_ms-crop-3x_coco', 'mask-rcnn_polapp-b3_fpn_ms-crop-3x_coco',
        'retinanet_polapp-b2_fpn_1x_coco', 'retinanet_polapp-b3_fpn_1x_coco'}


@pytest.mark.parametrize('path', POLAPP_CONFIGS, ids=_names(POLAPP_CONFIGS))
def test_config_trains_one_step_and_predicts(path):
    check_trains_one_step_and_predicts(path)


@pytest.mark.parametrize('path', POLAPP_CONFIGS, ids=_names(POLAPP_CONFIGS))
def test_config_recipe(path):
    cfg = _load(path)
    name = osp.basename(path)
    arch = 'b3' if '-b3_' in name else 'b2'
    backbone = cfg.model.backbone
    assert (backbone.type, backbone.arch) == ('PolaPP', arch)
    assert backbone.drop_path_rate == {'b2': 0.1, 'b3': 0.15}[arch]
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=f'checkpoints/polapp_{arch}.pth')
    channels = {'b2': [64, 128, 256, 512], 'b3': [64, 128, 320, 512]}[arch]
    assert cfg.model.neck.in_channels == [channels[i] for i in backbone.out_indices]
    optimizer = cfg.optim_wrapper.optimizer
    assert optimizer.type == 'AdamW' and optimizer.lr == 1e-4
    assert cfg.train_dataloader.batch_size == 2 and cfg.auto_scale_lr.base_batch_size == 16
    warmup, steps = cfg.param_scheduler
    assert (warmup.type, warmup.end, warmup.start_factor) == ('LinearLR', 500, 0.001)
    if name.startswith('retinanet'):
        # official: weight decay 1e-4 on everything; the FPN reads stages 2-4 plus two extra levels
        assert optimizer.weight_decay == 1e-4 and 'paramwise_cfg' not in cfg.optim_wrapper
        assert tuple(backbone.out_indices) == (1, 2, 3) and cfg.model.neck.start_level == 0
        assert cfg.model.neck.add_extra_convs == 'on_input' and cfg.model.neck.num_outs == 5
    else:
        assert optimizer.weight_decay == 0.05
        assert cfg.optim_wrapper.paramwise_cfg.custom_keys['norm'] == dict(decay_mult=0.)
    if '3x' in name:
        assert cfg.train_cfg.max_epochs == 36 and steps.milestones == [27, 33]
        assert 'RandomChoice' in [t.type for t in cfg.train_dataloader.dataset.pipeline]
    else:
        assert cfg.train_cfg.max_epochs == 12 and steps.milestones == [8, 11]
