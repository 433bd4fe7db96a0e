"""CheckpointFitHook (mmpola.runtime.fit_check): a checkpoint that fits (almost) none of the model (a
classification file, a segmentor for a detector) is refused when it is loaded, through tools/test.py
and tools/train.py, with the counts and what the file looks like, instead of training from scratch
or testing random weights with exit status 0; the files stay as they were."""
import os.path as osp

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MMLogger

from mmpola.checkpoint import describe_checkpoint
from mmpola.runtime.fit_check import checkpoint_fit
from tests.fixtures.paths import DATA, REPO
from tests.fixtures.tools import load_tool, refused

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN, TEST = load_tool('train'), load_tool('test')


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    from mmpola.datasets import make_demo_coco
    root = tmp_path_factory.mktemp('coco')
    make_demo_coco(str(root), num_train=2, num_val=2, seed=1, image_shapes=((64, 64),), verbose=False)
    return root


def _opts(root):
    return ['--cfg-options'] + [f'{key}.dataset.data_root={root}/' for key in
                                ('train_dataloader', 'val_dataloader', 'test_dataloader')] + [
        f'val_evaluator.ann_file={root}/annotations/instances_val.json',
        f'test_evaluator.ann_file={root}/annotations/instances_val.json',
        'train_dataloader.batch_size=1',
        'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']


def test_test_tool_refuses_a_classification_checkpoint(coco, tmp_path, capsys):
    official = osp.join(DATA, 'pola_pvt_mini_official.pth')
    work = tmp_path / 'work'
    opts = [o for o in _opts(coco) if not o.startswith('val')]
    err = refused(TEST, [DET_DEMO, official, '--work-dir', str(work)] + opts, capsys, [official])
    assert err.startswith(f"checkpoint '{official}' does not fit the MaskRCNN (PolaPVT backbone): only 0 of its ")
    assert '(0.0% of ' in err and 'less than the 50% required, so the run would use random weights' in err
    assert 'The file looks like an official classification checkpoint, 10-class head (PolaFormer PVT).' in err
    assert "Fix: a classification or backbone checkpoint holds the backbone only: train with it as the backbone's " \
           'pretrained weights (--cfg-options model.backbone.init_cfg.type=Pretrained' in err
    assert err.endswith('To load it anyway: --cfg-options checkpoint_min_loaded=0')


def test_load_from_a_segmentor_checkpoint_is_refused_before_training(coco, tmp_path, capsys):
    segmentor = tmp_path / 'upernet.pth'
    torch.save({'meta': {}, 'state_dict': {'backbone.layers.0.blocks.0.attn.power': torch.zeros(1, 3, 1, 32),
                                           'backbone.layers.0.blocks.0.attn.qkvg.weight': torch.zeros(4, 4),
                                           'decode_head.conv_seg.weight': torch.zeros(8, 64, 1, 1)}}, segmentor)
    work = tmp_path / 'work'
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _opts(coco) + [f'load_from={segmentor}'],
                  capsys, unchanged=[segmentor], work_dir=work)
    assert 'does not fit the MaskRCNN (PolaPVT backbone): only 0 of its' in err
    assert 'looks like an mmseg segmentor checkpoint (PolaFormer Swin). Fix: use a checkpoint of this MaskRCNN' in err


def test_describe_checkpoint_and_fit_counts():
    z = torch.zeros(2, 2)
    flatten = {'model': {'block1.0.attn.scale': z, 'block1.0.attn.dwc.weight': z, 'head.weight': torch.zeros(5, 2)},
               'config': {}}
    assert describe_checkpoint(flatten) == \
        'an official classification checkpoint, 5-class head (FLatten Transformer PVT)'
    inline = {'layers.0.blocks.0.attn.residual.0.weight': z, 'head.weight': torch.zeros(3, 2)}
    assert describe_checkpoint(inline) == 'a classification checkpoint, 3-class head (InLine Swin)'
    polapp = {'model': {'layers.0.blocks.0.attn.qkvg.weight': z, 'layers.0.blocks.0.attn.s1': z}}
    assert describe_checkpoint(polapp) == 'a backbone-only checkpoint (PolaFormer++)'
    detector = {'state_dict': {'backbone.block1.0.attn.power': z, 'roi_head.bbox_head.fc_cls.weight': z}}
    assert describe_checkpoint(detector) == 'an mmdet detector checkpoint (PolaFormer PVT)'
    assert describe_checkpoint({'epoch': 3}) == "no weights (top-level keys ['epoch'])"

    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))  # 15 + 8 weights
    state = {'module.0.weight': torch.zeros(3, 4), '0.bias': torch.zeros(3), '1.weight': torch.zeros(5, 3)}
    assert checkpoint_fit(model, {'state_dict': state}) == (15, 23, 2, 4)  # wrong shape of 1.weight: not loaded
