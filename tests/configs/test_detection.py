"""Every detection config builds, trains one step (every parameter gets a gradient: multi-GPU runs need
no find_unused_parameters) and predicts on a small input. Configs with the same model share one run
(tests/fixtures/config_groups.py). The numbers of the recipes: test_recipes_doc.py."""
import os
import os.path as osp
import re

import mmdet  # noqa: F401  (required: a broken install fails here)
import pytest

from mmpola.checkpoint.sources import pretrained_url
from tests.fixtures.config_groups import build_groups, group_id, representative
from tests.fixtures.detection import check_trains_one_step_and_predicts
from tests.fixtures.detection import load_config as _load
from tests.fixtures.paths import CONFIGS

GROUPS = build_groups(('detection', 'demo' + osp.sep + 'mask-rcnn'))


@pytest.mark.parametrize('paths', GROUPS, ids=[group_id(paths) for paths in GROUPS])
def test_config_trains_one_step_and_predicts(paths):
    check_trains_one_step_and_predicts(representative(paths))


def test_a_group_of_configs_with_two_models_is_refused():
    """The groups come from the configs' names; the group's test checks that its configs build one model."""
    paths = [osp.join(CONFIGS, 'detection', n) for n in ('mask-rcnn_pola-pvt-s_fpn_1x_coco.py',
                                                          'retinanet_pola-pvt-t_fpn_1x_coco.py')]
    with pytest.raises(AssertionError, match=r"\['detection/retinanet_pola-pvt-t_fpn_1x_coco.py'\] build another "
                       r'model than detection/mask-rcnn_pola-pvt-s_fpn_1x_coco.py'):
        representative(paths)
    # the smallest backbone of a group trains
    smallest = representative([paths[0], paths[0].replace('-pvt-s_', '-pvt-t_')])
    assert smallest.endswith('mask-rcnn_pola-pvt-t_fpn_1x_coco.py')


# the FLatten / InLine configs of the PVT and Swin backbones, which have a Pola config of the same name (those
# of PVTv2 and CSWin, architectures PolaFormer was not released on, follow their own recipes: recipes.md)
LINEAGE = sorted(osp.join(kind, n) for kind in ('flatten', 'inline')
                 for n in os.listdir(osp.join(CONFIGS, 'detection', kind)) if re.search(r'_\w+-(pvt|swin)-t_', n))


@pytest.mark.parametrize('name', LINEAGE)
def test_lineage_config_is_the_pola_config_with_another_attention(name):
    """FLatten / InLine configs compare the attention alone: only the backbone type (and its
    checkpoint) differ from the Pola config of the same name."""
    kind = osp.dirname(name)
    cfg = _load(osp.join(CONFIGS, 'detection', name))
    pola = _load(osp.join(CONFIGS, 'detection', osp.basename(name).replace(f'_{kind}-', '_pola-')))
    family = 'PVT' if '-pvt-' in name else 'Swin'
    assert cfg.model.backbone.type == {'flatten': 'FLatten', 'inline': 'InLine'}[kind] + family
    # the official weights of that backbone, downloaded from its release
    assert cfg.model.backbone.init_cfg.checkpoint == pretrained_url(f'{kind}_{family.lower()}_tiny')
    ours, theirs = cfg.to_dict(), pola.to_dict()
    for d in (ours, theirs):
        del d['model']['backbone']['type'], d['model']['backbone']['init_cfg']
    assert ours == theirs
