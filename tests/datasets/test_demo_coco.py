"""The synthetic COCO dataset: deterministic, valid COCO, masks equal to the drawn shapes; and the
prediction-vs-ground-truth figure of the demo."""
import filecmp
import json

import numpy as np
import pytest
from pycocotools.coco import COCO

from mmpola.datasets import DEMO_CLASSES, demo_coco_files, demo_coco_is_complete, make_demo_coco


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp('demo_coco')
    make_demo_coco(str(root), num_train=12, num_val=6, seed=3, crowd_prob=0.5, verbose=False)
    return root


def test_same_seed_same_files(dataset, tmp_path):
    make_demo_coco(str(tmp_path), num_train=12, num_val=6, seed=3, crowd_prob=0.5, verbose=False)
    for split in ('train', 'val'):
        assert filecmp.cmp(demo_coco_files(dataset)[split], demo_coco_files(tmp_path)[split], shallow=False)
        names = sorted(p.name for p in (dataset / split).iterdir())
        assert len(names) == {'train': 12, 'val': 6}[split]
        assert all(filecmp.cmp(dataset / split / n, tmp_path / split / n, shallow=False) for n in names)
    other = tmp_path / 'other'
    make_demo_coco(str(other), num_train=12, num_val=6, seed=4, crowd_prob=0.5, verbose=False)
    assert not filecmp.cmp(demo_coco_files(dataset)['train'], demo_coco_files(other)['train'], shallow=False)


def test_valid_coco_with_polygons_and_crowd_rle(dataset):
    assert demo_coco_is_complete(str(dataset))
    coco = COCO(demo_coco_files(dataset)['train'])
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(DEMO_CLASSES)
    anns = coco.dataset['annotations']
    crowds = [a for a in anns if a['iscrowd']]
    assert crowds and all(isinstance(a['segmentation'], dict) for a in crowds)
    assert all(isinstance(a['segmentation'], list) for a in anns if not a['iscrowd'])
    for ann in anns:
        mask = coco.annToMask(ann)
        assert mask.sum() == ann['area'] > 0  # polygon/RLE, area and bbox agree
        ys, xs = np.nonzero(mask)
        assert ann['bbox'] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]


def test_objects_are_visible_in_the_pixels(dataset):
    """Each object's pixels differ from its surroundings: the dataset is learnable."""
    import cv2
    coco = COCO(demo_coco_files(dataset)['val'])
    for ann in coco.dataset['annotations']:
        if ann['iscrowd']:
            continue
        info = coco.imgs[ann['image_id']]
        img = cv2.imread(str(dataset / 'val' / info['file_name'])).astype(np.float32)
        mask = coco.annToMask(ann).astype(bool)
        ring = cv2.dilate(mask.astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool) & ~mask
        inside, outside = img[mask].mean(0), img[ring].mean(0)
        assert np.abs(inside - outside).mean() > 20


def test_detection_figure_shows_ground_truth_next_to_predictions(dataset, tmp_path):
    import cv2
    import torch
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import PolygonMasks
    from mmengine.structures import InstanceData

    from mmpola.runtime.visualization import save_detection_figure, upscale_det_sample

    coco = COCO(demo_coco_files(dataset)['val'])
    images, samples = [], []
    for image_id in sorted(coco.imgs)[:3]:
        info = coco.imgs[image_id]
        anns = [a for a in coco.imgToAnns[image_id] if not a['iscrowd']]
        sample = DetDataSample(metainfo=dict(img_shape=(info['height'], info['width'])))
        boxes = torch.tensor([[a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
                               a['bbox'][1] + a['bbox'][3]] for a in anns]).reshape(-1, 4)
        labels = torch.tensor([a['category_id'] - 1 for a in anns], dtype=torch.long)
        sample.gt_instances = InstanceData(bboxes=boxes, labels=labels, masks=PolygonMasks(
            [[np.array(p) for p in a['segmentation']] for a in anns], info['height'], info['width']))
        masks = torch.from_numpy(np.stack([coco.annToMask(a) for a in anns])).bool() if anns else \
            torch.zeros((0, info['height'], info['width']), dtype=torch.bool)
        sample.pred_instances = InstanceData(bboxes=boxes + 1, labels=labels, scores=torch.full((len(anns),), 0.9),
                                             masks=masks)
        images.append(cv2.imread(str(dataset / 'val' / info['file_name']))[..., ::-1].copy())
        samples.append(sample)

    big = upscale_det_sample(samples[0], 3)
    assert torch.equal(big.pred_instances.bboxes, (samples[0].pred_instances.bboxes) * 3)
    assert big.pred_instances.masks.shape[1:] == tuple(3 * s for s in samples[0].pred_instances.masks.shape[1:])

    path = str(tmp_path / 'figure.png')
    figure = save_detection_figure(path, images, samples, dict(classes=DEMO_CLASSES,
                                                               palette=[(220, 20, 60), (0, 128, 255), (60, 180, 75)]),
                                   caption='test caption', columns=2)
    written = cv2.imread(path)
    assert written.shape == figure.shape and written.shape[1] >= 2 * 2 * 3 * 128  # 2 pairs per row, x3
    # the right half of the first pair (predictions) has colour drawn on it
    assert figure.std() > 10
    json.dumps(samples[0].metainfo)  # the sample metainfo stays plain
