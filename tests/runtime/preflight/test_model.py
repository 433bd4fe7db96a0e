"""Pre-flight checks of the model config against itself and its data (mmpola.runtime.preflight.model),
through tools/train.py: heads' num_classes against the dataset's classes (and the classes against the
COCO file's categories), necks' and decode heads' in_channels against the backbone. Each mistake
stops the tool before anything is built, with one ``error:`` line naming the entry and the fix
(exit status 2); the data and the work dir stay untouched. (No false alarm on the shipped configs:
tests/runtime/test_config_check.py.)"""
import os.path as osp

from mmengine.logging import MMLogger

from tests.fixtures.paths import REPO
from tests.fixtures.tools import load_tool, refused

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
RETINANET = osp.join(REPO, 'configs', 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py')
SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN, TEST = load_tool('train'), load_tool('test')


def _det_opts(root, ann='annotations/instances_train.json'):
    return ['--cfg-options', f'train_dataloader.dataset.data_root={root}/', f'train_dataloader.dataset.ann_file={ann}',
            'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']


def test_head_num_classes_against_dataset_classes(coco, tmp_path, capsys):
    work = tmp_path / 'work'
    # Mask R-CNN left at COCO's 80 classes on a 3-class set (today: an epoch, then the metric crashes)
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco) + [
        'model.roi_head.bbox_head.num_classes=80', 'model.roi_head.mask_head.num_classes=80'],
                  capsys, [coco], work, one_line=False)
    assert err.startswith("train_dataloader: the dataset has 3 classes ('circle', 'rectangle', 'triangle') "
                          '(from its metainfo) but the model predicts another number: '
                          'model.roi_head.bbox_head.num_classes=80, model.roi_head.mask_head.num_classes=80.')
    assert 'Fix: set num_classes=3 in every head, e.g. --cfg-options model.roi_head.bbox_head.num_classes=3 ' \
           'model.roi_head.mask_head.num_classes=3' in err

    # RetinaNet with 2 classes on the 3-class set (today: trains to the end, exit 0, a class learned as background)
    config = tmp_path / 'retina.py'
    config.write_text(f"_base_ = [{RETINANET!r}]\nmodel = dict(backbone=dict(init_cfg=None), "
                      "bbox_head=dict(num_classes=2))\n"
                      "train_dataloader = dict(dataset=dict(metainfo=dict(classes=('circle', 'rectangle', "
                      "'triangle')), data_prefix=dict(img='train/')))\n")
    err = refused(TRAIN, [str(config), '--work-dir', str(work)] + _det_opts(coco), capsys, [coco], work, one_line=False)
    assert 'the model predicts another number: model.bbox_head.num_classes=2.' in err
    assert '--cfg-options model.bbox_head.num_classes=3' in err

    # no metainfo: mmdet's 80 COCO class names, none of which is a category of the file
    config.write_text(f"_base_ = [{RETINANET!r}]\nmodel = dict(backbone=dict(init_cfg=None), "
                      "bbox_head=dict(num_classes=3))\n"
                      "train_dataloader = dict(dataset=dict(data_prefix=dict(img='train/')))\n")
    err = refused(TRAIN, [str(config), '--work-dir', str(work)] + _det_opts(coco), capsys, [coco], work, one_line=False)
    assert "none of the dataset's 80 classes ('person', 'bicycle'" in err
    assert "(from CocoDataset's default METAINFO (no metainfo=dict(classes=...) in the config))" in err
    assert "whose categories are ('circle', 'rectangle', 'triangle'): every annotation would be dropped. Fix: set " \
           "train_dataloader.dataset.metainfo=dict(classes=('circle', 'rectangle', 'triangle'))" in err

    # a class name that is not a category: mmdet would train without it (and shift the labels)
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco) + [
        'train_dataloader.dataset.metainfo.classes=circle,rectangel,triangle'],
                  capsys, [coco], work, one_line=False)
    assert "1 of the dataset's classes (from its metainfo) are not categories of" in err
    assert "instances_train.json': 'rectangel'" in err


def test_neck_channels_against_the_backbone(coco, ade, tmp_path, capsys):
    work = tmp_path / 'work'
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work), '--skip-data-check'] + _det_opts(coco) + [
        'model.neck.in_channels=[64,128,256,512]'],
                  capsys, [coco], work, one_line=False)
    assert err == ('model.neck.in_channels=[64, 128, 256, 512] does not match the channels of the maps '
                   'model.backbone (PolaPVT, out_indices (0, 1, 2, 3)) returns: [64, 128, 320, 512]. '
                   'Fix: --cfg-options model.neck.in_channels=[64,128,320,512]')
    # mmseg: heads read the backbone through in_index
    err = refused(TRAIN, [SEG_DEMO, '--work-dir', str(work), '--cfg-options',
                           f'train_dataloader.dataset.data_root={ade}', 'val_cfg=None', 'val_dataloader=None',
                           'val_evaluator=None', 'model.auxiliary_head.in_channels=320'],
                  capsys, [ade], work, one_line=False)
    assert err.startswith('model.auxiliary_head.in_channels=320 does not match the channels of the maps '
                          'model.backbone (PolaSwin, out_indices (0, 1, 2, 3)) returns at in_index 2: 384.')
