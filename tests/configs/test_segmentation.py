"""Every segmentation config builds, trains one step (every parameter gets a gradient) and predicts the
whole image at a size that is no multiple of the backbone strides; configs with the same model share one
run (tests/fixtures/config_groups.py). The numbers of the recipes: test_recipes_doc.py."""
import os
import os.path as osp
import re

import mmseg  # noqa: F401  (required: a broken install fails here)
import pytest
import torch

from mmpola.checkpoint.sources import pretrained_url
from tests.fixtures.config_groups import build_groups, group_id, representative
from tests.fixtures.paths import CONFIGS
from tests.fixtures.segmentation import build_segmentor, check_trains_one_step_and_predicts, load_config, seg_batch

GROUPS = build_groups(('segmentation', 'demo' + osp.sep + 'upernet'))
DEMO_CONFIG = osp.join(CONFIGS, 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')


def _predict_size(path):
    # ADE's whole-image test size (short side 512, 4:3) for the cheapest head; the same odd kind, smaller,
    # for the others (a UperNet head alone costs ~0.3 TFLOP at 512x683)
    if osp.basename(path).startswith('fpn_pola-pvt-t_'):
        return (512, 683)
    return (128, 171) if 'demo' in path else (96, 131)


@pytest.mark.parametrize('paths', GROUPS, ids=[group_id(paths) for paths in GROUPS])
def test_config_trains_one_step_and_predicts(paths):
    # the only thing shrunk: the training crops (two 32 x 64 crops instead of 512 x 512)
    path = representative(paths)
    check_trains_one_step_and_predicts(load_config(path), (32, 64), _predict_size(path))


def test_slide_inference_covers_non_multiple_sizes():
    """The documented sliding-window test (crop 512, stride 341 on ADE), scaled down."""
    cfg = load_config(DEMO_CONFIG)
    cfg.model.test_cfg = dict(mode='slide', crop_size=(64, 64), stride=(43, 43))
    torch.manual_seed(0)
    model = build_segmentor(cfg.model).eval()
    with torch.no_grad():
        batch = model.data_preprocessor(seg_batch([(128, 171)], 8), False)
        slide = model(**batch, mode='predict')[0]
    assert slide.pred_sem_seg.data.shape == (1, 128, 171)


# the FLatten / InLine configs of the PVT and Swin backbones, which have a Pola config of the same name (those
# of CSWin and DeiT follow their own recipes: recipes.md)
LINEAGE = sorted(osp.join(kind, n) for kind in ('flatten', 'inline')
                 for n in os.listdir(osp.join(CONFIGS, 'segmentation', kind)) if re.search(r'_\w+-(pvt|swin)-t_', n))


@pytest.mark.parametrize('name', LINEAGE)
def test_lineage_config_is_the_pola_config_with_another_attention(name):
    kind = osp.dirname(name)
    cfg = load_config(osp.join(CONFIGS, 'segmentation', name))
    pola = load_config(osp.join(CONFIGS, 'segmentation', osp.basename(name).replace(f'_{kind}-', '_pola-')))
    family = 'PVT' if '-pvt-' in name else 'Swin'
    assert cfg.model.backbone.type == {'flatten': 'FLatten', 'inline': 'InLine'}[kind] + family
    # the official weights of that backbone, downloaded from its release
    assert cfg.model.backbone.init_cfg.checkpoint == pretrained_url(f'{kind}_{family.lower()}_tiny')
    ours, theirs = cfg.to_dict(), pola.to_dict()
    for d in (ours, theirs):
        del d['model']['backbone']['type'], d['model']['backbone']['init_cfg']
    assert ours == theirs
