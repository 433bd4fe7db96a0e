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
from tests.fixtures.detection import coco_options, make_tool_coco
from tests.fixtures.paths import DATA, REPO
from tests.fixtures.tools import load_tool, refused

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN, TEST = load_tool('train'), load_tool('test')


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    return make_tool_coco(tmp_path_factory)


def test_test_tool_refuses_a_classification_checkpoint(coco, tmp_path, capsys):
    official = osp.join(DATA, 'pola_pvt_mini_official.pth')
    work = tmp_path / 'work'
    opts = [o for o in coco_options(coco) if not o.startswith('val')]
    err = refused(TEST, [DET_DEMO, official, '--work-dir', str(work)] + opts, capsys, [official])
    assert err.startswith(f"checkpoint '{official}' does not fit the MaskRCNN (PolaPVT backbone): only 0 of its ")
    assert '(0.0% of ' in err and 'less than the 50% required, so the run would use random weights' in err
    assert 'The file looks like an official classification checkpoint, 10-class head (PolaFormer PVT).' in err
    assert ("Fix: a classification or backbone checkpoint holds the backbone only: train with it as the backbone's "
            'pretrained weights (--cfg-options model.backbone.init_cfg._delete_=True model.backbone.init_cfg.type='
            f'Pretrained model.backbone.init_cfg.checkpoint={official}) instead of load_from') in err
    assert err.endswith('To load it anyway: --cfg-options checkpoint_min_loaded=0')


def test_load_from_a_segmentor_checkpoint_is_refused_before_training(coco, tmp_path, capsys):
    segmentor = tmp_path / 'upernet.pth'
    torch.save({'meta': {}, 'state_dict': {'backbone.layers.0.blocks.0.attn.power': torch.zeros(1, 3, 1, 32),
                                           'backbone.layers.0.blocks.0.attn.qkvg.weight': torch.zeros(4, 4),
                                           'decode_head.conv_seg.weight': torch.zeros(8, 64, 1, 1)}}, segmentor)
    work = tmp_path / 'work'
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + coco_options(coco) + [f'load_from={segmentor}'],
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


RETINANET = osp.join(REPO, 'configs', 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py')


def test_test_tool_refuses_a_mask_rcnn_checkpoint_for_a_retinanet_of_the_same_backbone(coco, tmp_path, capsys):
    """The backbone loads completely (more than half the weights), the neck has other shapes and the head is
    missing: evaluating would score a random neck and head (mAP 0.000, exit status 0)."""
    from tests.fixtures.detection import build_detector
    from tests.fixtures.detection import load_config as load_det_config
    mask_rcnn = build_detector(load_det_config(DET_DEMO))
    checkpoint = tmp_path / 'mask_rcnn.pth'
    torch.save({'meta': {}, 'state_dict': mask_rcnn.state_dict()}, checkpoint)
    work = tmp_path / 'work'
    opts = ['--cfg-options', f'test_dataloader.dataset.data_root={coco}/',
            'test_dataloader.dataset.ann_file=annotations/instances_val.json',
            'test_dataloader.dataset.data_prefix.img=val/',
            "test_dataloader.dataset.metainfo.classes=['circle','rectangle','triangle']",
            f'test_evaluator.ann_file={coco}/annotations/instances_val.json',
            'model.backbone.init_cfg=None', 'model.bbox_head.num_classes=3']
    err = refused(TEST, [RETINANET, str(checkpoint), '--work-dir', str(work)] + opts, capsys, [checkpoint])
    assert err.startswith(f"checkpoint '{checkpoint}' does not fit the RetinaNet (PolaPVT backbone): model.neck: "
                          'only 0 of its 16 parameter tensors load (14 have another shape')
    assert 'have another shape, e.g. neck.lateral_convs.0.conv.weight: [64, 64, 1, 1] in the file, [256, 128, 1, 1] ' \
           'in the model)' in err
    assert '; model.bbox_head is missing from the file (0 of its ' in err
    assert 'Evaluating it would run these parts with random weights, although ' in err
    assert 'The file holds backbone, neck, rpn_head, roi_head (the model: backbone, neck, bbox_head) and looks like ' \
           'an mmdet detector checkpoint (PolaFormer PVT). Fix: use a checkpoint of this RetinaNet' in err


def test_part_fit_leaves_out_training_only_parts():
    from mmpola.runtime.fit_check import part_fit
    model = nn.Module()
    model.backbone, model.decode_head, model.auxiliary_head = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 3)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith('auxiliary_head')}
    state['decode_head.weight'] = torch.zeros(5, 4)
    assert part_fit(model, {'state_dict': state}, skip=('auxiliary_head',)) == [
        ('decode_head', 1, 2, [('decode_head.weight', (5, 4), (2, 4))])]
    assert [p[0] for p in part_fit(model, {'state_dict': state})] == ['decode_head', 'auxiliary_head']


def test_a_file_of_other_head_widths_is_told_its_number_of_classes():
    """A checkpoint of this model trained on another number of classes (every head tensor there, some of another
    shape; its meta names the classes): the fix is the run's num_classes, not "a checkpoint of this model"."""
    from mmengine.config import Config

    from mmpola.runtime.fit_check import _other_classes_fix
    cfg = Config(dict(model=dict(type='ClassificationModel', num_classes=1000)))
    checkpoint = dict(meta=dict(dataset_meta=dict(classes=('a', 'b', 'c', 'd'))))
    head_only = [('head', 0, 2, [('head.weight', (4, 512), (1000, 512)), ('head.bias', (4,), (1000,))])]
    assert _other_classes_fix(cfg, checkpoint, head_only) == (
        'the file was trained on 4 classes: run with as many, --cfg-options model.num_classes=4')
    assert _other_classes_fix(cfg, checkpoint, [('head', 0, 2, [])]) is None  # missing, not another width
    assert _other_classes_fix(cfg, {}, head_only) is None  # the file does not say its classes
