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
