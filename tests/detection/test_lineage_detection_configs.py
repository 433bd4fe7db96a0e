"""FLatten / InLine detection configs: thin deltas on the Pola configs (the backbone type and its
checkpoint differ, nothing else); each builds, trains one step (every parameter gets a gradient)
and predicts."""
import glob
import os.path as osp

import pytest

from mmpola.checkpoint.sources import pretrained_url
from tests.fixtures.detection import check_trains_one_step_and_predicts
from tests.fixtures.detection import config_names as _names
from tests.fixtures.detection import load_config as _load
from tests.fixtures.paths import REPO

LINEAGE_CONFIGS = sorted(p for kind in ('flatten', 'inline')
                         for p in glob.glob(osp.join(REPO, 'configs', 'detection', kind, '*.py')))


def _pola_base(path):
    kind = osp.basename(osp.dirname(path))
    return osp.join(REPO, 'configs', 'detection', osp.basename(path).replace(f'_{kind}-', '_pola-'))


def test_the_listed_configs_exist():
    assert set(_names(LINEAGE_CONFIGS)) == {
        f'{algo}_{kind}-{backbone}_fpn_1x_coco' for kind in ('flatten', 'inline')
        for algo, backbone in (('mask-rcnn', 'pvt-t'), ('mask-rcnn', 'swin-t'), ('retinanet', 'pvt-t'))}


@pytest.mark.parametrize('path', LINEAGE_CONFIGS, ids=_names(LINEAGE_CONFIGS))
def test_config_is_the_pola_config_with_another_attention(path):
    cfg, pola = _load(path), _load(_pola_base(path))
    kind, family = osp.basename(path).split('_')[1].split('-')[:2]
    title = {'flatten': 'FLatten', 'inline': 'InLine'}[kind]
    backbone = cfg.model.backbone
    assert backbone.type == f'{title}{"PVT" if family == "pvt" else "Swin"}'
    # the official weights of that backbone, downloaded from its release
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=pretrained_url(f'{kind}_{family}_tiny'))
    ours, theirs = cfg.to_dict(), pola.to_dict()
    for d in (ours, theirs):
        del d['model']['backbone']['type'], d['model']['backbone']['init_cfg']
    assert ours == theirs


@pytest.mark.parametrize('path', LINEAGE_CONFIGS, ids=_names(LINEAGE_CONFIGS))
def test_config_trains_one_step_and_predicts(path):
    check_trains_one_step_and_predicts(path)
