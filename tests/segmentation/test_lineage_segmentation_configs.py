"""FLatten / InLine segmentation configs: thin deltas on the Pola UperNet config (the backbone type
and its checkpoint differ, nothing else); each trains one step and predicts an ADE-sized image."""
import glob
import os.path as osp

import pytest

from mmpola.checkpoint.sources import pretrained_url
from tests.fixtures.segmentation import REPO, check_trains_one_step_and_predicts, load_config

LINEAGE_CONFIGS = sorted(p for kind in ('flatten', 'inline')
                         for p in glob.glob(osp.join(REPO, 'configs', 'segmentation', kind, '*.py')))


def test_the_listed_configs_exist():
    assert [osp.basename(p) for p in LINEAGE_CONFIGS] == [
        f'upernet_{kind}-swin-t_8xb2-160k_ade20k-512x512.py' for kind in ('flatten', 'inline')]


@pytest.mark.parametrize('path', LINEAGE_CONFIGS, ids=lambda p: osp.basename(p)[:-3])
def test_config_trains_one_step_and_predicts(path):

    kind = osp.basename(osp.dirname(path))
    cfg = load_config(path)
    pola = load_config(osp.join(REPO, 'configs', 'segmentation', osp.basename(path).replace(kind, 'pola')))
    title = {'flatten': 'FLatten', 'inline': 'InLine'}[kind]
    assert cfg.model.backbone.type == f'{title}Swin'
    assert cfg.model.backbone.init_cfg.checkpoint == pretrained_url(f'{kind}_swin_tiny')  # from its release
    ours, theirs = cfg.to_dict(), pola.to_dict()
    for d in (ours, theirs):
        del d['model']['backbone']['type'], d['model']['backbone']['init_cfg']['checkpoint']
    assert ours == theirs

    check_trains_one_step_and_predicts(cfg, (32, 64), (128, 171))
