"""COCO evaluation of annotation files without `info` (mmdet's CocoMetric with pycocotools >= 2.0.11), as
the detection configs evaluate (PolaDetTTAModel: test_tta.py)."""
import json

import numpy as np
import pytest
import torch

from tests.fixtures.detection import mmdet_scope


def test_coco_metric_evaluates_a_file_without_info_or_licenses(tmp_path):
    """Perfect predictions of a user-style annotation file (no `info`, no `licenses`) give mAP 1 with
    mmdet's own CocoMetric, as the detection configs use it."""
    from importlib.metadata import version

    from mmdet.registry import METRICS
    from pycocotools import mask as mask_utils

    installed = version('pycocotools')
    assert tuple(int(x) for x in installed.split('.')[:3]) >= (2, 0, 11), (
        f'pycocotools {installed} cannot evaluate files without `info`; requirements/pins.txt pins 2.0.11: run '
        'tools/setup_env.py')

    from mmpola.datasets import DEMO_CLASSES, demo_coco_files, make_demo_coco
    make_demo_coco(str(tmp_path), num_train=1, num_val=3, seed=2, image_shapes=((64, 64), ), crowd_prob=0.0,
                   verbose=False)
    ann_file = demo_coco_files(str(tmp_path))['val']
    with open(ann_file) as f:
        data = json.load(f)
    del data['info'], data['licenses']
    with open(ann_file, 'w') as f:
        json.dump(data, f)

    mmdet_scope()
    metric = METRICS.build(dict(type='CocoMetric', ann_file=ann_file, metric=['bbox', 'segm']))
    metric.dataset_meta = dict(classes=DEMO_CLASSES)
    with open(ann_file) as f:
        assert 'info' not in json.load(f)  # the file itself is left as it is
    for image in data['images']:
        anns = [a for a in data['annotations'] if a['image_id'] == image['id']]
        masks = [mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(a['segmentation'], 64, 64)))
                 for a in anns]
        boxes = [[x, y, x + w, y + h] for x, y, w, h in (a['bbox'] for a in anns)]
        pred = dict(bboxes=torch.tensor(boxes, dtype=torch.float32), scores=torch.ones(len(anns)),
                    labels=torch.tensor([a['category_id'] - 1 for a in anns]),
                    masks=torch.from_numpy(np.stack(masks)).bool())
        metric.process({}, [dict(img_id=image['id'], ori_shape=(64, 64), pred_instances=pred)])
    results = metric.evaluate(size=len(data['images']))
    assert results['coco/bbox_mAP'] == pytest.approx(1.0) and results['coco/segm_mAP'] == pytest.approx(1.0)

