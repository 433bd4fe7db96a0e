"""Segmentation maps against their images (mmpola.runtime.preflight.seg_maps): another size or
several channels are named, through tools/test.py; EXIF-rotated images are compared as decoded."""
import os
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from mmengine.logging import MMLogger

from mmpola.errors import UserError
from tests.fixtures.paths import REPO
from tests.fixtures.tools import load_tool, refused

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
RETINANET = osp.join(REPO, 'configs', 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py')
SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN, TEST = load_tool('train'), load_tool('test')


def test_segmentation_maps_of_another_size_or_in_colour_are_named(ade, tmp_path, capsys):
    work = tmp_path / 'work'
    root = tmp_path / 'ade'
    os.makedirs(root)
    for sub in ('images', 'annotations'):
        (root / sub).mkdir()
        for name in os.listdir(ade / sub / 'validation'):
            (root / sub / name).write_bytes((ade / sub / 'validation' / name).read_bytes())
    maps = sorted(os.listdir(root / 'annotations'))
    first = cv2.imread(str(root / 'annotations' / maps[0]), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(root / 'annotations' / maps[0]), first[:, :-3])                      # 3 columns short
    second = cv2.imread(str(root / 'annotations' / maps[1]), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(root / 'annotations' / maps[1]), np.repeat(second[..., None], 3, 2))  # an RGB map
    h, w = first.shape
    opts = ['--cfg-options', f'test_dataloader.dataset.data_root={root}',
            'test_dataloader.dataset.data_prefix.img_path=images',
            'test_dataloader.dataset.data_prefix.seg_map_path=annotations']
    checkpoint = tmp_path / 'unused.pth'
    torch.save({'state_dict': {}}, checkpoint)  # never loaded: the data check comes first
    err = refused(TEST, [SEG_DEMO, str(checkpoint), '--work-dir', str(work)] + opts,
                  capsys, [root], work, one_line=False)
    image = maps[0].replace('.png', '.jpg')
    assert err.startswith('test_dataloader: 1 of 2 segmentation maps differ in size (width x height) from their '
                          f'image:\n  annotations/{maps[0]}: {w - 3}x{h}, its image images/{image}: {w}x{h}\n'
                          'Fix: give each map the size of its image')
    assert f'1 of 2 segmentation maps have several channels; a map holds one class index per pixel:\n' \
           f'  annotations/{maps[1]}: 3 channels (RGB)\nFix: save them as single-channel PNGs' in err


def test_rotated_jpeg_with_a_map_of_the_decoded_size_passes(tmp_path):
    """Decoders apply the EXIF orientation: a map of the *decoded* (transposed) size is right."""
    from PIL import Image

    from mmpola.runtime.preflight.seg_maps import check_seg_maps
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on decoding
    Image.new('RGB', (48, 32)).save(tmp_path / 'a.jpg', exif=exif)
    Image.new('L', (32, 48)).save(tmp_path / 'a.png')
    check_seg_maps([str(tmp_path / 'a.jpg')], [str(tmp_path / 'a.png')])
    Image.new('L', (40, 48)).save(tmp_path / 'a.png')
    with pytest.raises(UserError, match=r'a\.png: 40x48, its image .*a\.jpg: 48x32'):
        check_seg_maps([str(tmp_path / 'a.jpg')], [str(tmp_path / 'a.png')])


def test_zero_based_maps_read_with_reduce_zero_label_are_named(ade, tmp_path, capsys):
    """0-based maps (255 = ignored) with reduce_zero_label=True would train silently with class 0
    ignored and every class shifted; the fix the message names passes the check, and the right
    (1-based) maps pass as they are."""
    root = tmp_path / 'ade'
    for sub in ('images', 'annotations'):
        os.makedirs(root / sub)
        for name in os.listdir(ade / sub / 'training'):
            data = (ade / sub / 'training' / name).read_bytes()
            (root / sub / name).write_bytes(data)
            if sub == 'annotations':  # ADE's 1..K with 0 = other  ->  0..K-1 with 255 = ignored
                labels = cv2.imread(str(root / sub / name), cv2.IMREAD_UNCHANGED)
                cv2.imwrite(str(root / sub / name), np.where(labels == 0, 255, labels - 1).astype(np.uint8))
    work = tmp_path / 'work'
    opts = ['--cfg-options', f'train_dataloader.dataset.data_root={root}',
            'train_dataloader.dataset.data_prefix.img_path=images',
            'train_dataloader.dataset.data_prefix.seg_map_path=annotations',
            'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']
    err = refused(TRAIN, [SEG_DEMO, '--work-dir', str(work)] + opts, capsys, [root], work)
    assert err.startswith("train_dataloader: the segmentation maps under 'annotations' look 0-based (values 0..")
    assert ', 255: classes 0..7, 255 = ignored), but the dataset has reduce_zero_label=True' in err
    assert "class 0 ('sky') would never be trained or evaluated" in err
    assert "the last class ('car', value 7 after the shift) would never occur" in err
    fix = 'train_dataloader.dataset.reduce_zero_label=False train_dataloader.dataset.pipeline.1.reduce_zero_label=False'
    assert f'Fix: reduce_zero_label=False for maps whose classes start at 0; --cfg-options {fix} (and' in err
    args = TRAIN.parse_args([SEG_DEMO, '--work-dir', str(work)] + opts + fix.split())
    TRAIN.build_train_config(args)  # the named fix passes

    # the original ADE-style maps (0 = other, classes 1..8) pass with reduce_zero_label=True
    args = TRAIN.parse_args([SEG_DEMO, '--work-dir', str(work)] + opts[:1] + [
        f'train_dataloader.dataset.data_root={ade}'] + opts[2:])
    TRAIN.build_train_config(args)


def test_label_convention_and_zero_label_setting_directly():
    from mmpola.runtime.preflight.seg_maps import check_zero_label_setting, label_convention_problem
    classes = ('a', 'b', 'c')

    def counts(*values):
        return [(f'm{i}.png', np.bincount(np.asarray(v), minlength=256)) for i, v in enumerate(values)]
    one_based = counts([0, 1, 1, 2, 3], [1, 2, 2])              # 0 = unlabelled, classes 1..3
    assert label_convention_problem(one_based, True, classes) is None
    assert label_convention_problem(counts([0, 0, 1, 2]), False, classes) is None  # no shift: nothing to judge
    assert label_convention_problem(counts([0, 1, 2, 255]), True, classes).startswith('look 0-based')
    assert 'most frequent value of 2 of 2' in label_convention_problem(counts([0, 0, 1], [0, 0, 2]), True, classes)
    assert label_convention_problem(counts([0, 0, 1], [1, 2, 2]), True, classes) is None  # not most of the maps
    assert label_convention_problem(counts([0, 0, 1, 3]), True, classes) is None  # the value N occurs
    with pytest.raises(UserError, match=r'train_dataloader.dataset.pipeline.1.reduce_zero_label=True but the '
                                        r'dataset has reduce_zero_label=False; mmseg stops'):
        check_zero_label_setting('train_dataloader', False, dict(type='LoadAnnotations', reduce_zero_label=True),
                                 'train_dataloader.dataset.pipeline.1')
    check_zero_label_setting('train_dataloader', False, dict(type='LoadAnnotations'), 'x')


def test_blank_maps_read_with_reduce_zero_label_are_not_called_0_based(ade, tmp_path, capsys):
    """Maps that are 0 everywhere (labels lost in a conversion) with reduce_zero_label=True: the message says
    the maps hold no class, not that they look 0-based (whose fix, reduce_zero_label=False, would make every
    pixel class 0)."""
    root = tmp_path / 'ade'
    for sub in ('images', 'annotations'):
        os.makedirs(root / sub)
        for name in os.listdir(ade / sub / 'training'):
            if sub == 'images':
                (root / sub / name).write_bytes((ade / sub / 'training' / name).read_bytes())
            else:  # the same size, every value 0
                shape = cv2.imread(str(ade / sub / 'training' / name), cv2.IMREAD_UNCHANGED).shape
                cv2.imwrite(str(root / sub / name), np.zeros(shape, np.uint8))
    work = tmp_path / 'work'
    opts = ['--cfg-options', f'train_dataloader.dataset.data_root={root}',
            'train_dataloader.dataset.data_prefix.img_path=images',
            'train_dataloader.dataset.data_prefix.seg_map_path=annotations',
            'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']
    err = refused(TRAIN, [SEG_DEMO, '--work-dir', str(work)] + opts, capsys, [root], work)
    assert err.startswith("train_dataloader: the segmentation maps under 'annotations' hold no class at all: all 3 "
                          'sampled maps are 0 everywhere, and reduce_zero_label=True ignores 0, so no pixel would be '
                          'trained or evaluated (reduce_zero_label=False would not help'), err
    assert 'Fix: write the maps again from the source annotations' in err and '0-based' not in err
