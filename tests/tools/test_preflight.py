"""Pre-flight checks of what the model will consume (tools/train.py, tools/test.py): each mistake
stops the tool before anything is built, with one ``error:`` line naming the file or entry, the
problem and the fix (exit status 2), and nothing on disk changes (no checkpoint, data untouched).

Tiny generated data: the demo COCO set (3 classes, 64 px) and the demo ADE set (32 px).
"""
import hashlib
import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from mmengine.logging import MMLogger

from mmpola.errors import UserError
from tests.fixtures.paths import REPO  # noqa: E402
from tests.fixtures.tools import load_tool

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
RETINANET = osp.join(REPO, 'configs', 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py')
SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    """Verdicts on annotation files are cached; keep each test's cache to itself."""
    monkeypatch.setenv('MMPOLA_CACHE_DIR', str(tmp_path / 'cache'))


TRAIN, TEST = load_tool('train'), load_tool('test')


def _digest(root):
    """Content hash of every file under root (the data must come out of a refused run unchanged)."""
    h = hashlib.sha1()
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = osp.join(dirpath, name)
            h.update(path.encode())
            with open(path, 'rb') as f:
                h.update(f.read())
    return h.hexdigest()


def _refused(tool, argv, capsys, data_root, work_dir):
    """Run tool.main(argv); it must exit with status 2 and one error line, before writing anything."""
    before = _digest(data_root)
    with pytest.raises(SystemExit) as exc:
        tool.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err[-3000:]
    assert err.startswith('error: ') and 'Traceback' not in err, err[-3000:]
    assert _digest(data_root) == before, 'the refused run changed the data'
    assert not any(name.endswith('.pth') for _, _, files in os.walk(work_dir) for name in files)
    return err[len('error: '):]


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    from mmpola.datasets import make_demo_coco
    root = tmp_path_factory.mktemp('preflight_coco')
    make_demo_coco(str(root), num_train=4, num_val=2, seed=1, image_shapes=((64, 64),), verbose=False)
    return root


def _det_opts(root, ann='annotations/instances_train.json'):
    return ['--cfg-options', f'train_dataloader.dataset.data_root={root}/', f'train_dataloader.dataset.ann_file={ann}',
            'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']


def test_head_num_classes_against_dataset_classes(coco, tmp_path, capsys):
    work = tmp_path / 'work'
    # Mask R-CNN left at COCO's 80 classes on a 3-class set (today: an epoch, then the metric crashes)
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco) + [
        'model.roi_head.bbox_head.num_classes=80', 'model.roi_head.mask_head.num_classes=80'], capsys, coco, work)
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
    err = _refused(TRAIN, [str(config), '--work-dir', str(work)] + _det_opts(coco), capsys, coco, work)
    assert 'the model predicts another number: model.bbox_head.num_classes=2.' in err
    assert '--cfg-options model.bbox_head.num_classes=3' in err

    # no metainfo: mmdet's 80 COCO class names, none of which is a category of the file
    config.write_text(f"_base_ = [{RETINANET!r}]\nmodel = dict(backbone=dict(init_cfg=None), "
                      "bbox_head=dict(num_classes=3))\n"
                      "train_dataloader = dict(dataset=dict(data_prefix=dict(img='train/')))\n")
    err = _refused(TRAIN, [str(config), '--work-dir', str(work)] + _det_opts(coco), capsys, coco, work)
    assert "none of the dataset's 80 classes ('person', 'bicycle'" in err
    assert "(from CocoDataset's default METAINFO (no metainfo=dict(classes=...) in the config))" in err
    assert "whose categories are ('circle', 'rectangle', 'triangle'): every annotation would be dropped. Fix: set " \
           "train_dataloader.dataset.metainfo=dict(classes=('circle', 'rectangle', 'triangle'))" in err

    # a class name that is not a category: mmdet would train without it (and shift the labels)
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco) + [
        'train_dataloader.dataset.metainfo.classes=circle,rectangel,triangle'], capsys, coco, work)
    assert "1 of the dataset's classes (from its metainfo) are not categories of" in err
    assert "instances_train.json': 'rectangel'" in err


def _bad_annotations(coco, path):
    data = json.loads((coco / 'annotations' / 'instances_train.json').read_text())
    anns = [a for a in data['annotations'] if not a['iscrowd']]
    anns[0]['segmentation'] = [[1, 1, 10, 10]]              # a polygon of 2 points
    anns[1]['bbox'] = [1.0, 2.0, float('nan'), 5.0]         # NaN (Python's json writes it as NaN)
    anns[2]['bbox'] = [10, 10, -4, 6]                       # negative width
    del anns[3]['segmentation']                             # no mask, but masks are trained
    extra = [dict(anns[4], id=900 + i, category_id=cat) for i, cat in enumerate((7, 7, 9))]
    data['annotations'] += extra                            # category ids 'categories' lacks
    path.write_text(json.dumps(data))
    return anns, data


def test_unusable_coco_annotations_are_listed(coco, tmp_path, capsys):
    work = tmp_path / 'work'
    ann = coco / 'annotations' / 'bad_train.json'
    anns, data = _bad_annotations(coco, ann)
    files = {img['id']: img['file_name'] for img in data['images']}
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco, 'annotations/bad_train.json'),
                   capsys, coco, work)
    assert err.startswith(f"train_dataloader: '{ann}' has annotations the model cannot use:\n")
    lines = err.splitlines()[1:]
    assert f"  1 annotation(s) with segmentation with a polygon with fewer than 3 points: ids {anns[0]['id']} " \
           f"(images {files[anns[0]['image_id']]}); fix: delete those polygons" in err
    assert f"  1 annotation(s) with bbox with NaN/inf: ids {anns[1]['id']} (images {files[anns[1]['image_id']]})" in err
    assert f"  1 annotation(s) with bbox with negative width/height: ids {anns[2]['id']}" in err
    assert f"  1 annotation(s) with no segmentation: ids {anns[3]['id']}" in err
    assert "fix: add their masks, or train boxes only (LoadAnnotations(with_mask=False)" in err
    assert lines[-1].startswith("  3 annotation(s) whose category_id is not in 'categories' (ids 1, 2, 3), which "
                                'mmdet drops silently: category_id 7: 2, category_id 9: 1; fix: add')

    # boxes only (no masks trained or evaluated): a missing or short polygon is no problem
    config = tmp_path / 'boxes.py'
    config.write_text(f"_base_ = [{DET_DEMO!r}]\ntrain_dataloader = dict(dataset=dict(pipeline=["
                      "dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True), "
                      "dict(type='PackDetInputs')]))\n")
    err = _refused(TRAIN, [str(config), '--work-dir', str(work)] + _det_opts(coco, 'annotations/bad_train.json'),
                   capsys, coco, work)
    assert 'segmentation' not in err and 'with bbox with NaN/inf' in err

    # --skip-data-check: who insists gets past the check (the config is built, nothing checked)
    args = TRAIN.parse_args([DET_DEMO, '--work-dir', str(work), '--skip-data-check']
                            + _det_opts(coco, 'annotations/bad_train.json'))
    cfg, _, _ = TRAIN.build_train_config(args)
    assert cfg.train_dataloader.dataset.ann_file == 'annotations/bad_train.json'


@pytest.fixture(scope='module')
def ade(tmp_path_factory):
    from mmpola.datasets.demo_ade import make_demo_ade
    root = tmp_path_factory.mktemp('preflight_ade')
    make_demo_ade(str(root), num_train=3, num_val=2, size=32, seed=0)
    return root


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
    err = _refused(TEST, [SEG_DEMO, str(checkpoint), '--work-dir', str(work)] + opts, capsys, root, work)
    image = maps[0].replace('.png', '.jpg')
    assert err.startswith('test_dataloader: 1 of 2 segmentation maps differ in size (width x height) from their '
                          f'image:\n  annotations/{maps[0]}: {w - 3}x{h}, its image images/{image}: {w}x{h}\n'
                          'Fix: give each map the size of its image')
    assert f'1 of 2 segmentation maps have several channels; a map holds one class index per pixel:\n' \
           f'  annotations/{maps[1]}: 3 channels (RGB)\nFix: save them as single-channel PNGs' in err


def test_neck_channels_against_the_backbone(coco, ade, tmp_path, capsys):
    work = tmp_path / 'work'
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', str(work), '--skip-data-check'] + _det_opts(coco) + [
        'model.neck.in_channels=[64,128,256,512]'], capsys, coco, work)
    assert err == ('model.neck.in_channels=[64, 128, 256, 512] does not match the channels of the maps '
                   'model.backbone (PolaPVT, out_indices (0, 1, 2, 3)) returns: [64, 128, 320, 512]. '
                   'Fix: --cfg-options model.neck.in_channels=[64,128,320,512]\n')
    # mmseg: heads read the backbone through in_index
    err = _refused(TRAIN, [SEG_DEMO, '--work-dir', str(work), '--cfg-options',
                           f'train_dataloader.dataset.data_root={ade}', 'val_cfg=None', 'val_dataloader=None',
                           'val_evaluator=None', 'model.auxiliary_head.in_channels=320'], capsys, ade, work)
    assert err.startswith('model.auxiliary_head.in_channels=320 does not match the channels of the maps '
                          'model.backbone (PolaSwin, out_indices (0, 1, 2, 3)) returns at in_index 2: 384.')


def test_only_rank_zero_checks(coco, monkeypatch):
    """With a process group only rank 0 runs the checks (the verdict is shared by
    launch.run_on_rank0_and_share; two real processes: tests/runtime/test_launch.py)."""
    from mmpola.runtime import data_checks, launch, load_config, register_task_modules
    cfg = load_config(DET_DEMO, {'train_dataloader.dataset.data_root': f'{coco}/'})
    register_task_modules(cfg)
    shared = []
    monkeypatch.setattr(launch, 'run_on_rank0_and_share', lambda fn, *a, **k: shared.append(fn))
    monkeypatch.setattr(data_checks, 'check_data_files', lambda *a: pytest.fail('checked outside the rank-0 call'))
    data_checks.run_preflight(cfg, ['train_dataloader'])
    assert len(shared) == 1


def test_a_checked_annotation_file_is_not_parsed_again_until_it_changes(coco, tmp_path, monkeypatch):
    from mmpola.runtime import preflight
    ann = tmp_path / 'ann.json'
    ann.write_bytes((coco / 'annotations' / 'instances_train.json').read_bytes())
    names = preflight.checked_coco_categories(str(ann), needs_masks=True)
    assert names == ['circle', 'rectangle', 'triangle']
    monkeypatch.setattr(preflight, 'load_coco_json', lambda path: pytest.fail('parsed a second time'))
    assert preflight.checked_coco_categories(str(ann), needs_masks=True) == names
    monkeypatch.undo()
    monkeypatch.setenv('MMPOLA_CACHE_DIR', str(tmp_path / 'cache'))
    _bad_annotations(coco, ann)  # changed: checked again
    with pytest.raises(UserError, match='has annotations the model cannot use'):
        preflight.checked_coco_categories(str(ann), needs_masks=True)


def test_rotated_jpeg_with_a_map_of_the_decoded_size_passes(tmp_path):
    """Decoders apply the EXIF orientation: a map of the *decoded* (transposed) size is right."""
    from PIL import Image

    from mmpola.runtime.preflight import check_seg_maps
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on decoding
    Image.new('RGB', (48, 32)).save(tmp_path / 'a.jpg', exif=exif)
    Image.new('L', (32, 48)).save(tmp_path / 'a.png')
    check_seg_maps([str(tmp_path / 'a.jpg')], [str(tmp_path / 'a.png')])
    Image.new('L', (40, 48)).save(tmp_path / 'a.png')
    with pytest.raises(UserError, match=r'a\.png: 40x48, its image .*a\.jpg: 48x32'):
        check_seg_maps([str(tmp_path / 'a.jpg')], [str(tmp_path / 'a.png')])


def test_the_shipped_configs_pass_the_model_checks(monkeypatch):
    """No false alarm on the repository's configs (classes vs num_classes, channels); the channel
    check really sees every dense backbone's outputs."""
    import glob

    from mmengine.registry import DefaultScope

    from mmpola.runtime import load_config, preflight, register_task_modules
    seen = []
    build = preflight._backbone_out_channels
    monkeypatch.setattr(preflight, '_backbone_out_channels', lambda cfg: seen.append(build(cfg)) or seen[-1])
    paths = sorted(glob.glob(osp.join(REPO, 'configs', '*', '*.py')))
    assert len(paths) > 20
    for path in paths:
        cfg = load_config(path)
        seen.clear()
        with DefaultScope.overwrite_default_scope(register_task_modules(cfg)):
            preflight.check_num_classes(cfg, ['train_dataloader', 'val_dataloader', 'test_dataloader'])
            preflight.check_model_channels(cfg)
        if 'backbone' in cfg.model:
            assert len(seen) == 1 and seen[0] is not None, path
