"""Bad data: each case is either mmdet/mmseg's documented behaviour or a clear error naming
the file, never a crash deep in a DataLoader worker.

* missing / empty (0-byte) image or segmentation map: ``check_data_files`` (tools/train.py,
  tools/test.py, the demos) stats every file up front and raises ``UserError`` with the count,
  the first paths and the fix;
* corrupted JPEG (random bytes, truncated): mmcv's ``LoadImageFromFile`` raises
  ``AssertionError: failed to load image: <path>``, also through a DataLoader worker;
* zero-area / out-of-image boxes, images without annotations: mmdet's ``CocoDataset`` drops
  degenerate and fully-outside boxes, ``Resize`` clips partly-outside ones, ``filter_empty_gt``
  drops images without annotations from training only; a train step on such a batch is finite;
* a segmentation map with labels the model has no class for: ``CheckSegLabels`` (in the
  segmentation configs' train pipelines) raises ``ValueError`` naming the map, the values, the
  valid range and the fix, instead of ``IndexError: Target ... is out of bounds`` in the loss.
"""
import copy
import json
import os
import os.path as osp

import cv2
import mmdet  # noqa: E402,F401  (required: a broken install fails here)
import mmseg  # noqa: E402,F401  (required: a broken install fails here)
import numpy as np
import pytest
import torch
from mmengine.dataset import pseudo_collate  # noqa: E402
from mmengine.logging import MMLogger  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402

from mmpola.runtime import UserError, check_data_files, load_config, register_task_modules  # noqa: E402
from tests.fixtures.paths import REPO  # noqa: E402
from tests.fixtures.tools import load_tool

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')
SEG_ADE = osp.join(REPO, 'configs', 'segmentation', 'upernet_pola-pvt-t_8xb2-160k_ade20k-512x512.py')

# mmengine's logger keeps the stream it first sees: create it now, not under a test's capsys
MMLogger.get_current_instance()


def _config(path, scope):
    cfg = load_config(path)
    register_task_modules(cfg)
    assert cfg.default_scope == scope
    return cfg


def _scoped(scope):
    return DefaultScope.overwrite_default_scope(scope)


def _loader_error(dataset):
    """The exception a DataLoader worker (num_workers=1) re-raises in the main process."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=1, collate_fn=pseudo_collate)
    with pytest.raises(Exception) as exc:
        next(iter(loader))
    return exc


# ----------------------------------------------------------------------------------------------
# a tiny COCO-format dataset with the bad cases, read with the detection demo's dataset config

def _box(ann_id, image_id, bbox, area=None):
    x, y, w, h = bbox
    return dict(id=ann_id, image_id=image_id, category_id=1, bbox=bbox, area=w * h if area is None else area,
                iscrowd=0, segmentation=[[x, y, x + w, y, x + w, y + h, x, y + h]])


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp('bad_coco')
    (root / 'img').mkdir()
    rng = np.random.default_rng(0)
    images = [dict(id=k, file_name=f'{k}.jpg', height=128, width=128) for k in range(1, 6)]
    for info in images:
        cv2.imwrite(str(root / 'img' / info['file_name']), rng.integers(0, 256, (128, 128, 3), dtype=np.uint8))
    annotations = [
        _box(1, 1, [10, 10, 40, 30]),               # image 1: one good box and three degenerate ones:
        _box(2, 1, [50, 50, 0, 20]),                # zero width
        _box(3, 1, [60, 60, 20, 20], area=0),       # zero area
        _box(4, 1, [70, 70, 0.5, 10]),              # narrower than a pixel
        _box(5, 2, [-20, 100, 60, 50]),             # image 2: partly outside (x < 0, y + h > 128)
        _box(6, 3, [200, 200, 30, 30]),             # image 3: one box entirely outside, one good
        _box(7, 3, [5, 5, 30, 30]),
        _box(8, 5, [50, 50, 0, 0]),                 # image 5: only a degenerate box; image 4: none
    ]
    categories = [dict(id=i + 1, name=n) for i, n in enumerate(('circle', 'rectangle', 'triangle'))]
    (root / 'ann.json').write_text(json.dumps(dict(images=images, annotations=annotations, categories=categories)))
    return root


def _coco_dataset_cfg(cfg, root, key='train_dataloader'):
    dataset = copy.deepcopy(cfg[key].dataset)
    dataset.update(data_root=str(root) + '/', ann_file='ann.json', data_prefix=dict(img='img/'))
    for step in dataset.pipeline:
        if step.type == 'RandomFlip':
            step.prob = 0.0  # deterministic boxes
    return dataset


def test_missing_and_empty_images_are_reported_before_training(coco, tmp_path, capsys):
    cfg = _config(DET_DEMO, 'mmdet')
    root = tmp_path / 'coco'
    os.makedirs(root / 'img')
    (root / 'ann.json').write_bytes((coco / 'ann.json').read_bytes())
    for name in ('1.jpg', '2.jpg', '3.jpg'):
        (root / 'img' / name).write_bytes((coco / 'img' / name).read_bytes())
    (root / 'img' / '4.jpg').write_bytes(b'')  # 5.jpg missing, 4.jpg empty
    cfg.train_dataloader.dataset = _coco_dataset_cfg(cfg, root)

    with pytest.raises(UserError) as exc:
        check_data_files(cfg, ['train_dataloader'])
    msg = str(exc.value)
    assert msg.startswith(f"train_dataloader: 1 of 5 images listed in '{root}/ann.json' do not exist:\n"
                          f'  {root}/img/5.jpg\n')
    assert f"Fix: restore them, or remove their entries from '{root}/ann.json'" in msg

    # what the check prevents: mmcv's LoadImageFromFile raising inside a worker (it does name the file)
    with _scoped('mmdet'):
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
    train = load_tool('train')
    with pytest.raises(SystemExit) as exit_info:
        train.main([DET_DEMO, '--work-dir', str(tmp_path / 'work'), '--cfg-options',
                    f'train_dataloader.dataset.data_root={root}/', 'train_dataloader.dataset.ann_file=ann.json',
                    'train_dataloader.dataset.data_prefix.img=img/', 'val_cfg=None'])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: train_dataloader: 1 of 5 images listed in') and f'{root}/img/5.jpg' in err
    assert 'Traceback' not in err


def test_missing_segmentation_maps_and_empty_image_folders_are_reported(tmp_path):
    from mmpola.datasets.demo_ade import make_demo_ade
    cfg = _config(SEG_DEMO, 'mmseg')
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


def test_corrupted_jpeg_error_names_the_file_also_from_a_worker(coco, tmp_path):
    cfg = _config(DET_DEMO, 'mmdet')
    root = tmp_path / 'coco'
    os.makedirs(root / 'img')
    (root / 'ann.json').write_bytes((coco / 'ann.json').read_bytes())
    good = (coco / 'img' / '1.jpg').read_bytes()
    (root / 'img' / '1.jpg').write_bytes(good[:len(good) // 2])            # truncated
    (root / 'img' / '2.jpg').write_bytes(np.random.default_rng(0).bytes(4000))  # not an image at all
    for name in ('3.jpg', '4.jpg', '5.jpg'):
        (root / 'img' / name).write_bytes((coco / 'img' / name).read_bytes())
    cfg.train_dataloader.dataset = _coco_dataset_cfg(cfg, root)
    check_data_files(cfg, ['train_dataloader'])  # present and not empty: decoding is the pipeline's job
    with _scoped('mmdet'):
        from mmdet.registry import DATASETS
        dataset = DATASETS.build(cfg.train_dataloader.dataset)
    paths = [dataset.get_data_info(i)['img_path'] for i in range(len(dataset))]
    for name in ('1.jpg', '2.jpg'):
        index = paths.index(str(root / 'img' / name))
        with pytest.raises(AssertionError, match=f'^failed to load image: {root}/img/{name}$'):
            dataset[index]

    # DataLoader worker: torch re-raises the exception type with the worker's traceback as text
    subset = torch.utils.data.Subset(dataset, [paths.index(str(root / 'img' / '2.jpg'))])
    exc = _loader_error(subset)
    assert exc.type is AssertionError
    assert 'Caught AssertionError in DataLoader worker process 0' in str(exc.value)
    assert f'AssertionError: failed to load image: {root}/img/2.jpg' in str(exc.value)


def test_degenerate_outside_boxes_and_images_without_annotations(coco):
    cfg = _config(DET_DEMO, 'mmdet')
    with _scoped('mmdet'):
        from mmdet.registry import DATASETS
        train = DATASETS.build(_coco_dataset_cfg(cfg, coco))
        test = DATASETS.build(dict(_coco_dataset_cfg(cfg, coco, 'val_dataloader'), test_mode=True))
    assert train.filter_cfg == dict(filter_empty_gt=True, min_size=32)  # mmdet's COCO recipe
    boxes = {train.get_data_info(i)['img_id']: [inst['bbox'] for inst in train.get_data_info(i)['instances']]
             for i in range(len(train))}
    assert boxes == {
        1: [[10, 10, 50, 40]],    # zero-width, zero-area and sub-pixel boxes are dropped
        2: [[-20, 100, 40, 150]],  # partly outside: kept as annotated ...
        3: [[5, 5, 35, 35]],      # entirely outside: dropped
        5: [],                    # only a degenerate box: kept, without instances (mmdet filters on raw anns)
    }                             # image 4 (no annotations): not in the training set
    item = train[list(boxes).index(2)]
    assert item['data_samples'].gt_instances.bboxes.tensor.tolist() == [[0, 100, 40, 128]]  # ... clipped by Resize
    assert sorted(test.get_data_info(i)['img_id'] for i in range(len(test))) == [1, 2, 3, 4, 5]  # testing keeps all


def test_train_step_on_degenerate_and_empty_annotations_is_finite(coco):
    cfg = _config(DET_DEMO, 'mmdet')
    with _scoped('mmdet'):
        from mmdet.registry import DATASETS, MODELS
        dataset = DATASETS.build(_coco_dataset_cfg(cfg, coco))
        torch.manual_seed(0)
        model = MODELS.build(cfg.model)
    model.init_weights()
    ids = [dataset.get_data_info(i)['img_id'] for i in range(len(dataset))]
    batch = pseudo_collate([dataset[ids.index(k)] for k in (2, 5)])  # clipped box + no instances
    assert len(batch['data_samples'][1].gt_instances) == 0
    model.train()
    data = model.data_preprocessor(batch, True)
    losses = model(**data, mode='loss')
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss) and all(torch.isfinite(v).all() for v in log_vars.values()), log_vars
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ----------------------------------------------------------------------------------------------
# segmentation maps with labels the model has no class for

def _ade_like(root, labels):
    for sub in ('images/training', 'annotations/training'):
        os.makedirs(root / sub, exist_ok=True)
    cv2.imwrite(str(root / 'images' / 'training' / 'a.jpg'), np.full((32, 48, 3), 128, np.uint8))
    seg = np.zeros((32, 48), np.uint8)
    for i, value in enumerate(labels):
        seg[:, i * 4:(i + 1) * 4] = value
    cv2.imwrite(str(root / 'annotations' / 'training' / 'a.png'), seg)


def _ade_dataset(cfg, root):
    dataset = copy.deepcopy(cfg.train_dataloader.dataset)
    dataset.data_root = str(root)
    with _scoped('mmseg'):
        from mmseg.registry import DATASETS
        return DATASETS.build(dataset)


def test_segmentation_configs_check_labels_right_after_loading():
    for path in (SEG_ADE, SEG_DEMO):
        cfg = _config(path, 'mmseg')
        steps = [step.type for step in cfg.train_dataloader.dataset.pipeline]
        check = cfg.train_dataloader.dataset.pipeline[steps.index('LoadAnnotations') + 1]
        assert check == dict(type='CheckSegLabels', num_classes=cfg.model.decode_head.num_classes)
        for head in (cfg.model.decode_head, cfg.model.auxiliary_head):  # mmseg's default ignore_index
            assert head.get('ignore_index', 255) == 255


def test_unexpected_segmentation_labels_name_the_file(tmp_path):
    cfg = _config(SEG_ADE, 'mmseg')  # ADE20K: 150 classes, reduce_zero_label=True

    valid = tmp_path / 'valid'
    _ade_like(valid, [0, 1, 150])  # 0 (other -> 255), first and last class
    item = _ade_dataset(cfg, valid)[0]
    assert set(item['data_samples'].gt_sem_seg.data.unique().tolist()) <= {0, 149, 255}

    bad = tmp_path / 'bad'
    _ade_like(bad, [0, 1, 200, 151])
    dataset = _ade_dataset(cfg, bad)
    path = f'{bad}/annotations/training/a.png'
    with pytest.raises(ValueError) as exc:
        dataset[0]
    assert str(exc.value).startswith(
        f'segmentation map {path}: label values [150, 199] are not classes of this model (valid: 0..149 for '
        'num_classes=150, plus ignore_index=255). The dataset has reduce_zero_label=True (file value v becomes '
        'v - 1, 0 becomes 255), so the file holds [151, 200]; valid file values are 0 (ignored) and 1..150. '
        "Fix: convert the maps to the dataset's label convention")
    exc = _loader_error(dataset)
    assert exc.type is ValueError and f'ValueError: segmentation map {path}: label values [150, 199]' in str(exc.value)

    # what CheckSegLabels prevents: mmseg's cross-entropy on the CPU, without the file's name
    from mmseg.models.losses import CrossEntropyLoss
    target = torch.tensor([[[0, 199]]])
    with pytest.raises(IndexError, match='Target 199 is out of bounds'):
        CrossEntropyLoss()(torch.zeros(1, 150, 1, 2), target, ignore_index=255)


def test_evaluation_ignores_unexpected_labels():
    """At test time (no CheckSegLabels in the test pipelines) mmseg's IoUMetric counts only labels
    in [0, num_classes): an out-of-range label is left out of every class' area, like 255."""
    from mmseg.evaluation import IoUMetric
    pred = torch.tensor([[0, 1, 1, 0]])
    label = torch.tensor([[0, 1, 199, 255]])
    intersect, union, pred_area, label_area = IoUMetric.intersect_and_union(pred, label, 2, 255)
    assert label_area.tolist() == [1, 1] and intersect.tolist() == [1, 1]
