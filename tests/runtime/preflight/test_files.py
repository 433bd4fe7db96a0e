"""The data files a run reads (mmpola.runtime.preflight.files): a missing or empty (0-byte) image or
segmentation map, a missing dataset root, annotation file or image folder is reported before
anything is built, with the count, the first paths and the fix (through tools/train.py: one
``error:`` line, exit status 2), instead of an exception inside a DataLoader worker."""
import os
import os.path as osp

import cv2
import pytest
from mmengine.config import Config
from mmengine.logging import MMLogger

from mmpola.runtime import UserError, check_data_files
from tests.fixtures.bad_data import coco_dataset_cfg, config, make_bad_coco, scoped
from tests.fixtures.paths import REPO
from tests.fixtures.tools import live_logger, load_tool, refused, run_main

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN = load_tool('train')


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp('bad_coco'))


def test_check_data_files_names_the_missing_path_and_the_hint(tmp_path):
    cfg = Config(dict(
        data_hint='generate it with: python tools/make_demo_x.py',
        train_dataloader=dict(dataset=dict(type='RepeatDataset', times=2, dataset=dict(
            type='CocoDataset', data_root=str(tmp_path) + '/', ann_file='ann.json', data_prefix=dict(img='img/'))))))
    with pytest.raises(UserError, match=r'ann_file .*ann\.json.*Generate it with: python tools/make_demo_x.py'):
        check_data_files(cfg, ['train_dataloader'])
    (tmp_path / 'ann.json').write_text('{}')
    with pytest.raises(UserError, match=r"data_prefix.img .*img/'"):
        check_data_files(cfg, ['train_dataloader'])
    (tmp_path / 'img').mkdir()
    check_data_files(cfg, ['train_dataloader', 'val_dataloader'])  # absent loaders are skipped


def test_missing_and_empty_images_are_reported_before_training(coco, tmp_path, capsys):
    live_logger()  # the dataset built below logs; stderr is checked at the end
    cfg = config(DET_DEMO, 'mmdet')
    root = tmp_path / 'coco'
    os.makedirs(root / 'img')
    (root / 'ann.json').write_bytes((coco / 'ann.json').read_bytes())
    for name in ('1.jpg', '2.jpg', '3.jpg'):
        (root / 'img' / name).write_bytes((coco / 'img' / name).read_bytes())
    (root / 'img' / '4.jpg').write_bytes(b'')  # 5.jpg missing, 4.jpg empty
    cfg.train_dataloader.dataset = coco_dataset_cfg(cfg, root)

    with pytest.raises(UserError) as exc:
        check_data_files(cfg, ['train_dataloader'])
    msg = str(exc.value)
    assert msg.startswith(f"train_dataloader: 1 of 5 images listed in '{root}/ann.json' do not exist:\n"
                          f'  {root}/img/5.jpg\n')
    assert f"Fix: restore them, or remove their entries from '{root}/ann.json'" in msg

    # what the check prevents: mmcv's LoadImageFromFile raising inside a worker (it does name the file)
    with scoped('mmdet'):
        from mmdet.registry import DATASETS
        dataset = DATASETS.build(cfg.train_dataloader.dataset)
    missing = next(i for i in range(len(dataset)) if dataset.get_data_info(i)['img_id'] == 5)
    with pytest.raises(FileNotFoundError, match='5.jpg'):
        dataset.prepare_data(missing)

    (root / 'img' / '5.jpg').write_bytes((coco / 'img' / '5.jpg').read_bytes())
    with pytest.raises(UserError, match=r'1 of 5 images listed in .* are empty \(0 bytes: an interrupted '
                                        r'download or copy\):\n  .*/img/4\.jpg\nFix: replace them'):
        check_data_files(cfg, ['train_dataloader'])
    # without the check an empty file fails in OpenCV, without its name
    from mmcv.transforms import LoadImageFromFile
    with pytest.raises(cv2.error, match=r'!buf\.empty\(\)'):
        LoadImageFromFile()(dict(img_path=str(root / 'img' / '4.jpg')))

    # through tools/train.py: one line on stderr, exit status 2, before any model is built
    (root / 'img' / '5.jpg').unlink()
    with pytest.raises(SystemExit) as exit_info:
        run_main(TRAIN, [DET_DEMO, '--work-dir', str(tmp_path / 'work'), '--cfg-options',
                         f'train_dataloader.dataset.data_root={root}/', 'train_dataloader.dataset.ann_file=ann.json',
                         'train_dataloader.dataset.data_prefix.img=img/', 'val_cfg=None'])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: train_dataloader: 1 of 5 images listed in') and f'{root}/img/5.jpg' in err
    assert 'Traceback' not in err


def test_missing_segmentation_maps_and_empty_image_folders_are_reported(tmp_path):
    from mmpola.datasets.demo_ade import make_demo_ade
    cfg = config(SEG_DEMO, 'mmseg')
    make_demo_ade(str(tmp_path), num_train=3, num_val=1, size=32, seed=0)
    for key in ('train_dataloader', 'val_dataloader'):
        cfg[key].dataset.data_root = str(tmp_path)
    check_data_files(cfg, ['train_dataloader', 'val_dataloader'])  # complete: passes

    os.remove(tmp_path / 'annotations' / 'training' / 'demo_ade_00001.png')
    with pytest.raises(UserError) as exc:
        check_data_files(cfg, ['train_dataloader'])
    assert str(exc.value).startswith(
        "train_dataloader: 1 of 3 segmentation maps of the images under 'images/training' (one per image, "
        f"same name) do not exist:\n  {tmp_path}/annotations/training/demo_ade_00001.png\n"
        'Fix: add the missing maps, or move the images that have none out of the image folder.')

    for name in os.listdir(tmp_path / 'images' / 'validation'):
        os.remove(tmp_path / 'images' / 'validation' / name)
    with pytest.raises(UserError, match=r"no '\.jpg' images under '.*/images/validation'"):
        check_data_files(cfg, ['val_dataloader'])


def test_missing_coco_and_demo_data_say_where_to_get_them(capsys, tmp_path):
    path = osp.join(REPO, 'configs', 'detection', 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py')
    err = refused(TRAIN, [path, '--work-dir', str(tmp_path), '--cfg-options', 'model.backbone.init_cfg=None',
                                'train_dataloader.dataset.data_root=/nonexistent/coco/'], capsys, one_line=False)
    assert '/nonexistent/coco/' in err and 'COCO' in err
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(tmp_path), '--cfg-options',
                          'train_dataloader.dataset.data_root=/nonexistent/demo/'], capsys, one_line=False)
    assert 'tools/make_demo_coco.py' in err


def test_cut_off_and_undecodable_images_and_maps_are_reported_before_training(coco, tmp_path, capsys):
    """A JPEG cut off mid-file (an interrupted copy) and a .jpg holding no image: named, with the fix,
    before anything is built. Without the check: PIL's 'image file is truncated' naming no file (mmcv's
    pillow backend), or cv2 filling the lost part with gray and training on it; mmcv's bare assertion
    at the first batch for the file that is no image."""
    root = tmp_path / 'coco'
    os.makedirs(root / 'img')
    (root / 'ann.json').write_bytes((coco / 'ann.json').read_bytes())
    for name in ('1.jpg', '2.jpg', '3.jpg', '4.jpg', '5.jpg'):
        (root / 'img' / name).write_bytes((coco / 'img' / name).read_bytes())
    whole = (coco / 'img' / '2.jpg').read_bytes()
    (root / 'img' / '2.jpg').write_bytes(whole[:len(whole) // 2])
    (root / 'img' / '4.jpg').write_bytes(b'PK\x03\x04' + bytes(range(256)) * 8)  # a zip archive's first bytes
    opts = [DET_DEMO, '--work-dir', str(tmp_path / 'work'), '--cfg-options',
            f'train_dataloader.dataset.data_root={root}/', 'train_dataloader.dataset.ann_file=ann.json',
            'train_dataloader.dataset.data_prefix.img=img/', 'val_cfg=None', 'val_dataloader=None',
            'val_evaluator=None']
    err = refused(TRAIN, opts, capsys, [root], str(tmp_path / 'work'), one_line=False)
    assert err.startswith(f"train_dataloader: 2 of 5 images listed in '{root}/ann.json' cannot be decoded "
                          f'(an interrupted download or copy, or a damaged file):\n'
                          f'  {root}/img/2.jpg: cut off: a JPEG file without its end marker (FF D9), '
                          f'{len(whole) // 2} bytes (OSError: image file is truncated'), err
    assert f'\n  {root}/img/4.jpg: not an image file: no image format starts with the bytes 50 4b 03 04 00 01 02 03' \
        in err
    assert f"\nFix: replace them with the original files (download or copy them again), or remove their entries " \
           f"from '{root}/ann.json'. Generate the demo dataset" in err
    # what the check prevents: PIL's message names no file
    from mmcv.transforms import LoadImageFromFile
    with pytest.raises(OSError) as exc:
        LoadImageFromFile(imdecode_backend='pillow')(dict(img_path=str(root / 'img' / '2.jpg')))
    assert 'image file is truncated' in str(exc.value) and '2.jpg' not in str(exc.value)

    # the whole files pass
    for name in ('2.jpg', '4.jpg'):
        (root / 'img' / name).write_bytes((coco / 'img' / name).read_bytes())
    cfg = config(DET_DEMO, 'mmdet')
    cfg.train_dataloader.dataset = coco_dataset_cfg(cfg, root)
    check_data_files(cfg, ['train_dataloader'])


def test_a_cut_off_segmentation_map_is_reported(tmp_path):
    from mmpola.datasets.demo_ade import make_demo_ade
    cfg = config(SEG_DEMO, 'mmseg')
    make_demo_ade(str(tmp_path), num_train=2, num_val=1, size=32, seed=0)
    cfg.train_dataloader.dataset.data_root = str(tmp_path)
    check_data_files(cfg, ['train_dataloader'])
    path = tmp_path / 'annotations' / 'training' / 'demo_ade_00001.png'
    data = path.read_bytes()
    path.write_bytes(data[:-30])
    with pytest.raises(UserError) as exc:
        check_data_files(cfg, ['train_dataloader'])
    assert str(exc.value).startswith(
        "train_dataloader: 1 of 2 segmentation maps of the images under 'images/training' (one per image, same "
        f"name) cannot be decoded (an interrupted download or copy, or a damaged file):\n  {path}: cut off: a PNG "
        'file without its IEND chunk'), str(exc.value)
    assert 'Fix: replace them with the original files (download or copy them again).' in str(exc.value)
