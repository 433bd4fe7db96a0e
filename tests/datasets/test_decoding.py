"""A JPEG whose body is damaged (mmpola.datasets.decoding): a valid header and end marker, bytes overwritten
in the middle of its entropy-coded data. mmcv's loader decodes it to an image with gray or noise where the
data were lost (libjpeg's warning on stderr names no file); ``LoadCheckedImage`` refuses it, naming the
file, where the image is decoded; through tools/train.py: one ``error:`` line, exit status 2."""
import shutil

import cv2
import numpy as np
import pytest
from mmcv.transforms import LoadImageFromFile

from mmpola.datasets import DamagedImageError, LoadCheckedImage
from tests.fixtures.bad_data import damage_jpeg_body
from tests.fixtures.tools import load_tool, refused


def _photo(path, size=160):
    """A textured JPEG (smooth noise, as photos compress), written with OpenCV."""
    rng = np.random.default_rng(0)
    pixels = cv2.GaussianBlur(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), (0, 0), 3)
    cv2.imwrite(str(path), np.clip(pixels.astype(int) * 4 - 380, 0, 255).astype(np.uint8))
    return path


def test_damaged_body_is_refused_where_it_is_decoded(tmp_path, capfd):
    good = _photo(tmp_path / 'good.jpg')
    shutil.copy(good, tmp_path / 'bad.jpg')
    bad = damage_jpeg_body(tmp_path / 'bad.jpg', 512)
    assert bad.read_bytes()[:2] == b'\xff\xd8' and bad.read_bytes()[-2:] == b'\xff\xd9'

    # before: mmcv's loader returns an image whose lost part is filled in, and raises nothing
    clean = LoadImageFromFile()(dict(img_path=str(good)))['img']
    loaded = LoadImageFromFile()(dict(img_path=str(bad)))['img']
    assert loaded.shape == clean.shape and np.abs(loaded.astype(int) - clean).mean() > 5
    capfd.readouterr()

    # a clean file loads as with mmcv's loader, and nothing is written to stderr
    assert np.array_equal(LoadCheckedImage()(dict(img_path=str(good)))['img'], clean)
    with pytest.raises(DamagedImageError) as exc:
        LoadCheckedImage()(dict(img_path=str(bad)))
    msg = str(exc.value)
    assert msg.startswith(f'image {bad}: the file is damaged: its JPEG data are corrupt (libjpeg: Corrupt JPEG data')
    assert 'Fix: replace the file with the original' in msg and '\n' not in msg
    assert 'Corrupt JPEG' not in capfd.readouterr().err  # said in the error, not on stderr again

    # mmcv's ignore_empty=True: left out with a warning (mmengine's dataset takes another image)
    assert LoadCheckedImage(ignore_empty=True)(dict(img_path=str(bad))) is None


def test_train_stops_with_one_line_naming_the_damaged_image(tiny, tmp_path, capsys):
    root = tmp_path / 'data'
    shutil.copytree(tiny['root'], root, ignore=shutil.ignore_patterns('*.py'))
    first = sorted((root / 'train').iterdir())[0]
    _photo(first, size=64)  # a 64 px picture with enough image data to damage
    damage_jpeg_body(first, 256)
    config = tmp_path / 'checked.py'
    config.write_text(f"""_base_ = [{tiny['config']!r}]
train_dataloader = dict(num_workers=1, dataset=dict(data_root={str(root) + '/'!r}, pipeline=[
    dict(type='LoadCheckedImage'), *_base_.train_pipeline[1:]]))
train_cfg = dict(max_epochs=1)
""")
    err = refused(load_tool('train'), [str(config), '--work-dir', str(tmp_path / 'work'), '--cfg-options',
                                       'val_dataloader=None', 'val_cfg=None', 'val_evaluator=None'],
                  capsys, work_dir=tmp_path / 'work')
    assert err.startswith(f'image {first}: the file is damaged: its JPEG data are corrupt'), err
