"""Bad data that is not the pre-flight's to refuse: each case is mmdet/mmseg's documented behaviour or a
clear error naming the file, never a silent mistake.

* corrupted JPEG (random bytes, truncated): the pre-flight names both (mmpola.runtime.preflight.files);
  without it mmcv's ``LoadImageFromFile`` raises ``AssertionError: failed to load image: <path>``, also
  through a DataLoader worker;
* zero-area / out-of-image boxes, images without annotations: mmdet's ``CocoDataset`` drops
  degenerate and fully-outside boxes, ``Resize`` clips partly-outside ones, ``filter_empty_gt``
  drops images without annotations from training only; a train step on such a batch is finite;
* a segmentation map with labels the model has no class for: ``CheckSegLabels``
  (mmpola.datasets.transforms, in the segmentation configs' train pipelines) raises ``ValueError``
  naming the map, the values, the valid range and the fix, instead of ``IndexError: Target ... is
  out of bounds`` in the loss.
"""
import copy
import os
import os.path as osp

import cv2
import mmdet  # noqa: F401  (required: a broken install fails here)
import mmseg  # noqa: F401  (required: a broken install fails here)
import numpy as np
import pytest
import torch
from mmengine.dataset import pseudo_collate

from mmpola.runtime import UserError, check_data_files
from tests.fixtures.bad_data import coco_dataset_cfg, config, make_bad_coco, scoped
from tests.fixtures.paths import REPO

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')
SEG_ADE = osp.join(REPO, 'configs', 'segmentation', 'upernet_pola-pvt-t_8xb2-160k_ade20k-512x512.py')


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp('bad_coco'))


def _loader_error(dataset):
    """The exception a DataLoader worker (num_workers=1) re-raises in the main process."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=1, collate_fn=pseudo_collate)
    with pytest.raises(Exception) as exc:
        next(iter(loader))
    return exc


def test_corrupted_jpeg_error_names_the_file_also_from_a_worker(coco, tmp_path):
    cfg = config(DET_DEMO, 'mmdet')
    root = tmp_path / 'coco'
    os.makedirs(root / 'img')
    (root / 'ann.json').write_bytes((coco / 'ann.json').read_bytes())
    good = (coco / 'img' / '1.jpg').read_bytes()
    (root / 'img' / '1.jpg').write_bytes(good[:len(good) // 2])            # truncated
    (root / 'img' / '2.jpg').write_bytes(np.random.default_rng(0).bytes(4000))  # not an image at all
    for name in ('3.jpg', '4.jpg', '5.jpg'):
        (root / 'img' / name).write_bytes((coco / 'img' / name).read_bytes())
    cfg.train_dataloader.dataset = coco_dataset_cfg(cfg, root)
    # the pre-flight reads each file's ends and names both before anything is built ...
    with pytest.raises(UserError, match=r'2 of 5 images .* cannot be decoded .*\n  .*/img/1\.jpg: cut off: a JPEG '
                                        r'file without its end marker.*\n  .*/img/2\.jpg: not an image file'):
        check_data_files(cfg, ['train_dataloader'])
    # ... which the pipeline, without it, reports at the first batch that holds them
    with scoped('mmdet'):
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
    cfg = config(DET_DEMO, 'mmdet')
    with scoped('mmdet'):
        from mmdet.registry import DATASETS
        train = DATASETS.build(coco_dataset_cfg(cfg, coco))
        test = DATASETS.build(dict(coco_dataset_cfg(cfg, coco, 'val_dataloader'), test_mode=True))
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
    cfg = config(DET_DEMO, 'mmdet')
    with scoped('mmdet'):
        from mmdet.registry import DATASETS, MODELS
        dataset = DATASETS.build(coco_dataset_cfg(cfg, coco))
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
    with scoped('mmseg'):
        from mmseg.registry import DATASETS
        return DATASETS.build(dataset)


def test_segmentation_configs_check_labels_right_after_loading():
    for path in (SEG_ADE, SEG_DEMO):
        cfg = config(path, 'mmseg')
        steps = [step.type for step in cfg.train_dataloader.dataset.pipeline]
        check = cfg.train_dataloader.dataset.pipeline[steps.index('LoadAnnotations') + 1]
        assert check == dict(type='CheckSegLabels', num_classes=cfg.model.decode_head.num_classes)
        for head in (cfg.model.decode_head, cfg.model.auxiliary_head):  # mmseg's default ignore_index
            assert head.get('ignore_index', 255) == 255


def test_unexpected_segmentation_labels_name_the_file(tmp_path):
    cfg = config(SEG_ADE, 'mmseg')  # ADE20K: 150 classes, reduce_zero_label=True

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


def test_dense_configs_check_test_images_right_after_loading():
    """CheckImage follows LoadImageFromFile in the validation and test pipeline of every detection and
    segmentation config: the inferencers replace only the loader, so the arrays given to them pass it."""
    from tests.fixtures.recipes import load, shipped_configs
    checked = 0
    for name in shipped_configs():
        cfg = load(name)
        if cfg.get('default_scope') not in ('mmdet', 'mmseg'):
            continue
        for key in ('val_dataloader', 'test_dataloader'):
            steps = [step.type for step in cfg[key].dataset.pipeline]
            assert steps[:2] == ['LoadImageFromFile', 'CheckImage'] and steps.count('CheckImage') == 1, (name, key)
        checked += 1
    assert checked > 40


def test_check_image_converts_grayscale_and_unit_range_once(monkeypatch):
    from mmpola.datasets import CheckImage, transforms
    said = []
    monkeypatch.setattr(transforms, 'print_log', lambda message, **kwargs: said.append(message))
    check = CheckImage()
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4)
    out = check(dict(img=gray, img_shape=(3, 4)))
    assert out['img'].shape == (3, 4, 3) and (out['img'] == gray[..., None]).all()
    unit = np.full((3, 4, 3), 0.5, np.float32)
    unit[0, 0, 0] = np.nan  # left to NonFinitePixelsHook; the others decide the range
    out = check(dict(img=unit, img_path='x.tiff'))
    assert out['img'][1, 1, 1] == 127.5 and np.isnan(out['img'][0, 0, 0])
    check(dict(img=gray))
    check(dict(img=unit.copy()))
    assert len(said) == 2  # once per kind
    assert said[0].startswith('[mmpola] CheckImage: an image given as an array has one channel (shape (3, 4))')
    assert said[1].startswith('[mmpola] CheckImage: x.tiff is a float image with values in 0..1; it is scaled to '
                              '0..255')
    image = np.full((3, 4, 3), 200.0, np.float32)  # 0..255 floats, uint8 colour images: unchanged
    assert check(dict(img=image))['img'] is image
    colour = np.zeros((3, 4, 3), np.uint8)
    assert check(dict(img=colour))['img'] is colour
