"""configs/_base_/models: one backbone dict per size that builds and that task configs inherit."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

from tests.fixtures.paths import REPO as ROOT  # noqa: E402

BASES = sorted(glob.glob(osp.join(ROOT, 'configs', '_base_', 'models', '*.py')))
BASES = [p for p in BASES if not p.endswith('pola_common.py')]  # shared settings only


def test_every_size_has_a_base():
    names = {osp.basename(p)[:-3] for p in BASES}
    assert {'pola_pvt_tiny', 'pola_pvt_small', 'pola_pvt_medium', 'pola_pvt_large',
            'pola_swin_tiny', 'pola_swin_small', 'pola_swin_base', 'pola_swin_base_384'} <= names


@pytest.mark.parametrize('path', BASES, ids=lambda p: osp.basename(p)[:-3])
def test_base_builds(path):
    cfg = Config.fromfile(path)
    backbone = dict(cfg.backbone, init_cfg=None)
    with torch.device('meta'):
        model = MODELS.build(backbone)
    assert model.out_channels == list(cfg.backbone_out_channels)
    assert cfg.custom_imports['imports'] == ['mmpola']


def test_task_config_inherits_a_base(tmp_path):
    """The documented pattern: a second base may define ``model``; ``_base_.backbone`` swaps in."""
    (tmp_path / 'detector.py').write_text(
        "model = dict(type='Det', backbone=dict(type='ResNet', depth=50), "
        "neck=dict(in_channels=[256, 512, 1024, 2048]))\n")
    base = osp.join(ROOT, 'configs', '_base_', 'models', 'pola_swin_tiny.py')
    (tmp_path / 'task.py').write_text(
        f"_base_ = ['./detector.py', {base!r}]\n"
        "model = dict(backbone=dict(_delete_=True, **_base_.backbone),\n"
        "             neck=dict(in_channels=_base_.backbone_out_channels))\n")
    cfg = Config.fromfile(str(tmp_path / 'task.py'))
    assert cfg.model.backbone.type == 'PolaSwin' and 'depth' not in cfg.model.backbone
    assert cfg.model.neck.in_channels == [96, 192, 384, 768]
