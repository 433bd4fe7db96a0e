"""SimpleFeaturePyramid (ViTDet's simple feature pyramid, mmpola.detection): strides 4-64 from a plain
ViT's stride-16 map at any size, and a detector with InLine-DeiT and the pyramid trains one step and
predicts."""
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS

import mmpola  # noqa: F401  (registers the backbones and the pyramid)
from tests.fixtures.detection import check_config_trains_one_step_and_predicts, load_config
from tests.fixtures.paths import CONFIGS

DEIT = dict(type='InLineDeiT', arch=dict(embed_dims=64, depth=4, num_heads=2, img_size=64), out_indices=(3,))


def test_strides_from_the_vit_map_at_an_odd_size():
    torch.manual_seed(0)
    backbone = MODELS.build(DEIT)
    neck = MODELS.build(dict(type='SimpleFeaturePyramid', backbone_channel=64, in_channels=[16, 32, 64, 64],
                             out_channels=32, num_outs=5))
    x = torch.randn(2, 3, 97, 131)
    outs = neck(backbone(x))
    grid = (7, 9)  # ceil(97 / 16), ceil(131 / 16)
    assert [tuple(o.shape[-2:]) for o in outs] == [(28, 36), (14, 18), grid, (3, 4), (2, 2)]
    assert all(o.shape[:2] == (2, 32) for o in outs)
    sum(o.square().mean() for o in outs).backward()
    assert not [n for n, p in neck.named_parameters() if p.grad is None]
    with pytest.raises(ValueError, match=r'in_channels must be \[16, 32, 64, 64\] for backbone_channel=64'):
        MODELS.build(dict(type='SimpleFeaturePyramid', backbone_channel=64, in_channels=[64] * 4, out_channels=32))


def test_detector_with_the_simple_pyramid_trains_one_step():
    """A RetinaNet config with its backbone and neck replaced by InLine-DeiT and the simple pyramid."""
    cfg = load_config(osp.join(CONFIGS, 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py'))
    cfg.model.backbone = dict(DEIT, init_cfg=None)
    cfg.model.neck = dict(type='SimpleFeaturePyramid', backbone_channel=64, in_channels=[16, 32, 64, 64],
                          out_channels=256, num_outs=5)
    _, model, _ = check_config_trains_one_step_and_predicts(cfg)
    assert type(model.neck).__name__ == 'SimpleFeaturePyramid'


def test_preflight_checks_the_pyramid_against_the_last_map():
    """tools/train.py's channel check reads the pyramid's backbone_channel (its in_channels are its own levels)."""
    from mmengine.config import Config

    from mmpola.errors import UserError
    from mmpola.runtime.preflight import check_model_channels
    neck = dict(type='SimpleFeaturePyramid', backbone_channel=64, in_channels=[16, 32, 64, 64], out_channels=32)
    check_model_channels(Config(dict(model=dict(backbone=DEIT, neck=neck))))
    with pytest.raises(UserError, match=r'model.neck.backbone_channel=96 does not match .* at in_index -1: 64'):
        check_model_channels(Config(dict(model=dict(backbone=DEIT, neck=dict(neck, backbone_channel=96)))))
