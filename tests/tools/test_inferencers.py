"""One image through mmdet's DetInferencer and mmseg's MMSegInferencer from an mmpola config and a
checkpoint, as docs/training.md shows (demo configs: small heads; weights saved from a fresh model). Arrays
as numpy users make them pass through the configs' CheckImage: a float image in 0..1 is scaled to
0..255 (else the predictions change silently), a 2-D grayscale array becomes three channels (else an
IndexError in the data preprocessor), each with a warning."""
import json
import os.path as osp
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from mmpola.runtime.config import load_config, register_task_modules
from tests.fixtures.bad_data import damage_jpeg_body
from tests.fixtures.paths import REPO

DET_CONFIG = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
SEG_CONFIG = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')


def _checkpoint(config, path):
    """A checkpoint as tools/train.py writes one (state_dict + the dataset's classes and palette)."""
    cfg = load_config(config)
    register_task_modules(cfg)
    from mmengine.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    meta = dict(dataset_meta=dict(cfg.test_dataloader.dataset.metainfo))
    torch.save(dict(state_dict=model.state_dict(), meta=meta), path)
    return str(path), meta['dataset_meta']['classes']


def _image(path, height, width):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    cv2.rectangle(image, (20, 30), (70, 90), (255, 255, 255), -1)
    cv2.imwrite(str(path), image)
    return str(path)


def test_det_inferencer_one_image_and_arrays(tmp_path, capsys):
    from mmdet.apis import DetInferencer
    weights, classes = _checkpoint(DET_CONFIG, tmp_path / 'det.pth')
    image = _image(tmp_path / 'street.jpg', 96, 128)
    inferencer = DetInferencer(model=DET_CONFIG, weights=weights, device='cpu')
    assert inferencer.model.dataset_meta['classes'] == classes
    result = inferencer(image, out_dir=str(tmp_path / 'out'), no_save_pred=False)
    pred, = result['predictions']
    assert {'labels', 'scores', 'bboxes', 'masks'} <= set(pred)
    assert len(pred['labels']) == len(pred['scores']) == len(pred['bboxes']) == len(pred['masks'])
    drawn = cv2.imread(str(tmp_path / 'out' / 'vis' / 'street.jpg'))
    assert drawn is not None and drawn.shape == (96, 128, 3)
    with open(tmp_path / 'out' / 'preds' / 'street.json') as f:
        assert set(json.load(f)) >= {'labels', 'scores', 'bboxes', 'masks'}

    array = cv2.imread(image)
    gray = array[..., 1]
    expected = {name: inferencer(x)['predictions'][0] for name, x in (('uint8', array),
                                                                       ('gray3', np.repeat(gray[..., None], 3, 2)))}
    seen = {'float01': inferencer(array.astype(np.float32) / 255)['predictions'][0],
            'gray': inferencer(gray)['predictions'][0]}
    for name, reference in (('float01', 'uint8'), ('gray', 'gray3')):
        assert seen[name]['labels'] == expected[reference]['labels'], name
        assert np.allclose(seen[name]['scores'], expected[reference]['scores'], atol=1e-4), name
        assert np.allclose(seen[name]['bboxes'], expected[reference]['bboxes'], atol=1e-2), name


def test_mmseg_inferencer_one_image_and_arrays(tmp_path):
    from mmseg.apis import MMSegInferencer
    weights, classes = _checkpoint(SEG_CONFIG, tmp_path / 'seg.pth')
    image = _image(tmp_path / 'scene.jpg', 80, 112)
    inferencer = MMSegInferencer(model=SEG_CONFIG, weights=weights, device='cpu')
    assert tuple(inferencer.model.dataset_meta['classes']) == tuple(classes)
    result = inferencer(image, out_dir=str(tmp_path / 'out'))
    labels = result['predictions']
    assert labels.shape == (80, 112) and labels.min() >= 0 and labels.max() < len(classes)
    assert cv2.imread(str(tmp_path / 'out' / 'vis' / 'scene.jpg')).shape == (80, 112, 3)
    saved = cv2.imread(str(tmp_path / 'out' / 'pred' / '00000000_pred.png'), cv2.IMREAD_UNCHANGED)  # mmseg's name
    assert np.array_equal(saved, labels)

    array = cv2.imread(image)  # (x / 255) * 255 is x up to float rounding: a few border pixels may flip
    scaled = inferencer(array.astype(np.float32) / 255)['predictions']
    assert (scaled == inferencer(array)['predictions']).mean() > 0.99
    gray = array[..., 1]
    assert np.array_equal(inferencer(gray)['predictions'], inferencer(np.repeat(gray[..., None], 3, 2))['predictions'])


def _folder(tmp_path):
    """a.jpg, b.JPG (upper-case suffix), c.png (not an image: random bytes), d.jpg (a JPEG whose body is
    damaged: 1 KiB overwritten in the middle of its image data), notes.txt."""
    folder = tmp_path / 'photos'
    folder.mkdir()
    _image(folder / 'a.jpg', 96, 128)
    image = np.random.default_rng(1).integers(0, 256, (80, 112, 3), dtype=np.uint8)
    cv2.imwrite(str(folder / 'b.JPG'), image)
    (folder / 'c.png').write_bytes(np.random.default_rng(2).bytes(3000))
    (folder / 'notes.txt').write_text('taken on a sunny day')
    damage_jpeg_body(Path(_image(folder / 'd.jpg', 96, 128)), 1024)
    return folder


def _left_out_warning(capsys, who, folder):
    out = capsys.readouterr().out
    assert f"[mmpola] {who}: 3 of 5 files of folder '{folder}' left out: c.png (cannot be decoded as an image); " \
           'd.jpg (damaged: its JPEG data are corrupt (libjpeg: Corrupt JPEG data' in out, out
    assert 'notes.txt (not an image file name (suffixes: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp)). ' \
           'Predicting the other 2' in out, out


def test_folders_upper_case_suffixes_and_unreadable_files(tmp_path, capsys):
    """mmpola's inferencers (from mmpola.apis and the package, where OpenMMLab users look for them): a
    folder's b.JPG is predicted (mmdet's listing skipped it), an undecodable file, a JPEG with a damaged
    body (mmdet's loader predicted on its noise) and a text file are named and left out (one undecodable
    file stopped the whole folder), the rest is predicted as one image at a time; nothing left to predict
    is one clear error. Given paths leave nothing out (their results would no longer line up with them): a
    missing or undecodable one is one clear error."""
    from mmengine.logging import MMLogger

    from mmpola import SegInferencer
    from mmpola.apis import DetInferencer
    from mmpola.errors import UserError
    folder = _folder(tmp_path)
    MMLogger.get_instance('inferencer_folder')  # the log goes to this test's captured stdout
    det = DetInferencer(model=DET_CONFIG, weights=_checkpoint(DET_CONFIG, tmp_path / 'det.pth')[0], device='cpu')
    result = det(str(folder), out_dir=str(tmp_path / 'det'))
    _left_out_warning(capsys, 'DetInferencer', folder)
    assert sorted(p.name for p in (tmp_path / 'det' / 'vis').iterdir()) == ['a.jpg', 'b.JPG']
    for pred, name in zip(result['predictions'], ('a.jpg', 'b.JPG')):
        alone = det(str(folder / name))['predictions'][0]
        assert pred['labels'] == alone['labels'] and np.allclose(pred['bboxes'], alone['bboxes'], atol=1e-3)

    seg = SegInferencer(model=SEG_CONFIG, weights=_checkpoint(SEG_CONFIG, tmp_path / 'seg.pth')[0], device='cpu')
    labels = seg(str(folder))['predictions']
    _left_out_warning(capsys, 'SegInferencer', folder)
    assert [x.shape for x in labels] == [(96, 128), (80, 112)]
    assert np.array_equal(labels[1], seg(str(folder / 'b.JPG'))['predictions'])

    # given paths keep their order in the results: a path that does not exist or cannot be decoded is an error
    with pytest.raises(UserError, match=r"^DetInferencer: 1 of the 1 given file\(s\) cannot be predicted: "
                                        f"{folder}/c.png \\(cannot be decoded as an image\\)"):
        det(str(folder / 'c.png'))
    with pytest.raises(UserError, match=r"^SegInferencer: 2 of the 3 given file\(s\) cannot be predicted: "
                                        f"{folder}/nope.jpg \\(does not exist\\); {folder}/c.png \\(cannot be "
                                        r'decoded as an image\)\. Fix: correct or remove them \(the results follow '
                                        r'the order of the inputs\)'):
        seg([str(folder / 'a.jpg'), str(folder / 'c.png'), str(folder / 'nope.jpg')])


def test_weights_of_another_model_are_refused(tmp_path):
    """A segmentor's checkpoint given to the detection inferencer: one error naming what is missing, before the
    model takes the file's class names (mmdet's own predicts with random heads, under the segmentor's classes)."""
    from mmpola.apis import DetInferencer
    from mmpola.checkpoint import CheckpointMismatchError
    weights, _ = _checkpoint(SEG_CONFIG, tmp_path / 'seg.pth')
    with pytest.raises(CheckpointMismatchError, match=rf"^checkpoint '{weights}' does not fit the MaskRCNN: "
                                                      r'model\.backbone.*so the predictions would come from random '
                                                      r'weights\. The file holds .*decode_head.* Fix: give the '
                                                      r'checkpoint written by training this config'):
        DetInferencer(model=DET_CONFIG, weights=weights, device='cpu')


def test_arrays_with_saved_predictions_are_numbered(tmp_path):
    """Arrays have no file name: their saved predictions are numbered, as their drawings are (mmdet's own stops at
    the first with a TypeError, after drawing it)."""
    from mmpola.apis import DetInferencer
    det = DetInferencer(model=DET_CONFIG, weights=_checkpoint(DET_CONFIG, tmp_path / 'det.pth')[0], device='cpu')
    det([np.zeros((64, 80, 3), np.uint8)] * 2, out_dir=str(tmp_path / 'out'), no_save_pred=False)
    assert sorted(p.name for p in (tmp_path / 'out' / 'preds').iterdir()) == ['0.json', '1.json']
    assert sorted(p.name for p in (tmp_path / 'out' / 'vis').iterdir()) == ['00000000.jpg', '00000001.jpg']


def test_inputs_whose_outputs_would_share_a_name_are_refused(tmp_path):
    """out_dir keeps each image's drawing and prediction under its name without the suffix: x.jpg and x.png (in a
    folder or a list) would overwrite each other; without out_dir nothing is saved, so they are predicted."""
    from mmpola.apis import DetInferencer
    from mmpola.errors import UserError
    folder = tmp_path / 'images'
    folder.mkdir()
    first, second = _image(folder / 'x.jpg', 64, 80), _image(folder / 'x.png', 64, 80)
    det = DetInferencer(model=DET_CONFIG, weights=_checkpoint(DET_CONFIG, tmp_path / 'det.pth')[0], device='cpu')
    with pytest.raises(UserError, match=rf'^DetInferencer: 1 pair\(s\) of inputs share a file name \({first} and '
                                        rf'{second}\), under which out_dir keeps'):
        det(str(folder), out_dir=str(tmp_path / 'out'))
    assert not (tmp_path / 'out').exists()
    assert len(det([first, second])['predictions']) == 2
