"""configs/_base_/models: one backbone dict per size that builds, that task configs move into their
model, and that leaves nothing else behind in the configs that use it."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

from tests.fixtures.paths import CONFIGS
from tests.fixtures.recipes import load, shipped_configs

BASES = sorted(p for p in glob.glob(osp.join(CONFIGS, '_base_', 'models', '*.py'))
               if not p.endswith('pola_common.py'))  # shared settings only
# top-level variables of mmpola's own base files that no run reads (each task config moves or drops them)
HELPERS = {'backbone', 'backbone_out_channels', 'backbone_no_decay_keys', 'tta_ms_pipeline', 'head_norm_cfg'}
# top-level variables mmdet / mmseg bases leave behind that would mislead a reader of the dumped config
# (another model's checkpoint, an optimizer the run does not use)
UPSTREAM = {'pretrained', 'checkpoint_file', 'optimizer', 'backbone_norm_cfg'}


@pytest.mark.parametrize('path', BASES, ids=lambda p: osp.basename(p)[:-3])
def test_base_builds(path):
    cfg = Config.fromfile(path)
    backbone = dict(cfg.backbone, init_cfg=None)
    with torch.device('meta'):
        model = MODELS.build(backbone)
    assert model.out_channels == list(cfg.backbone_out_channels)
    assert cfg.custom_imports['imports'] == ['mmpola']


@pytest.mark.parametrize('size, layout', [('small', 'IISS'), ('base', 'IIMS2')])
def test_inline_swin_bases_build_the_released_layouts(size, layout):
    """InLine-Swin-S/B were released with other attention layouts than the tiny model ('IIIS')."""
    cfg = Config.fromfile(osp.join(CONFIGS, '_base_', 'models', f'inline_swin_{size}.py'))
    assert cfg.backbone.attn_type == layout


def test_task_config_moves_the_backbone_in(tmp_path):
    """The documented pattern: a second base may define ``model``; ``_base_.pop`` moves the backbone
    in, and the dumped config holds it only there."""
    (tmp_path / 'detector.py').write_text(
        "model = dict(type='Det', backbone=dict(type='ResNet', depth=50), "
        "neck=dict(in_channels=[256, 512, 1024, 2048]))\n")
    base = osp.join(CONFIGS, '_base_', 'models', 'pola_swin_tiny.py')
    (tmp_path / 'task.py').write_text(
        f"_base_ = ['./detector.py', {base!r}]\n"
        "model = dict(backbone=dict(_base_.pop('backbone'), _delete_=True),\n"
        "             neck=dict(in_channels=_base_.pop('backbone_out_channels')))\n")
    cfg = Config.fromfile(str(tmp_path / 'task.py'))
    assert cfg.model.backbone.type == 'PolaSwin' and 'depth' not in cfg.model.backbone
    assert cfg.model.neck.in_channels == [96, 192, 384, 768]
    assert set(cfg.keys()) == {'model', 'custom_imports'}


def test_dumped_configs_hold_only_what_the_run_uses(tmp_path):
    left = {name: sorted((HELPERS | UPSTREAM) & set(load(name).keys())) for name in shipped_configs()}
    left = {name: keys for name, keys in left.items() if keys}
    assert not left, f'top-level variables no run reads: {left}'
    # what tools/train.py writes to the work dir (one config: yapf formatting takes seconds each)
    load('detection/mask-rcnn_pola-pvt-t_fpn_1x_coco.py').dump(str(tmp_path / 'dumped.py'))
    dumped = Config.fromfile(str(tmp_path / 'dumped.py'))
    assert not (HELPERS | UPSTREAM) & set(dumped.keys()) and dumped.model.backbone.type == 'PolaPVT'
