"""PolaDetTTAModel (test-time augmentation that keeps instance masks, mmpola.detection.tta) on small
synthetic inputs, and every detection config's evaluation and TTA settings (the evaluation of COCO files
without `info`: test_coco_metric.py)."""
import glob
import os.path as osp

import numpy as np
import pytest
import torch
from torch import nn

from tests.fixtures.detection import mmdet_scope
from tests.fixtures.paths import REPO  # noqa: E402


class _Views(nn.Module):
    """Stands for a detector in PolaDetTTAModel: only merge_preds is exercised."""

    def test_step(self, data):
        raise AssertionError('not called')


def _view(boxes, scores, labels, masks, flip):
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    sample = DetDataSample(metainfo=dict(ori_shape=(20, 30), img_shape=(20, 30), flip=flip,
                                         flip_direction='horizontal' if flip else None))
    sample.pred_instances = InstanceData(bboxes=torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                                         scores=torch.tensor(scores, dtype=torch.float32),
                                         labels=torch.tensor(labels, dtype=torch.long), masks=masks)
    return sample


def _tta_model():
    from mmdet.registry import MODELS
    mmdet_scope()
    return MODELS.build(dict(type='PolaDetTTAModel', module=_Views(),
                             tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100)))


def test_tta_model_merges_boxes_and_masks_of_flipped_views():
    mask = torch.zeros(20, 30, dtype=torch.bool)
    mask[4:12, 3:9] = True  # the object, left of centre, in the original image
    plain = _view([[3, 4, 9, 12]], [0.6], [1], mask[None], flip=False)
    # the flipped view saw it mirrored, more confidently: its detection is the one kept
    flipped = _view([[21, 4, 27, 12]], [0.9], [1], mask.flip(-1)[None], flip=True)
    other = _view([[0, 0, 5, 5]], [0.3], [2], torch.zeros(1, 20, 30, dtype=torch.bool), flip=False)

    merged, = _tta_model().merge_preds([[plain, flipped, other]])
    pred = merged.pred_instances
    assert pred.scores.tolist() == pytest.approx([0.9, 0.3])
    assert pred.labels.tolist() == [1, 2]
    assert torch.allclose(pred.bboxes[0], torch.tensor([3., 4., 9., 12.]))
    assert pred.masks.shape == (2, 20, 30) and torch.equal(pred.masks[0], mask)  # flipped back


def test_tta_model_without_detections_gives_an_empty_prediction():
    from mmdet.structures import DetDataSample
    empty = [_view([], [], [], torch.zeros(0, 20, 30, dtype=torch.bool), flip=flip) for flip in (False, True)]
    merged, = _tta_model().merge_preds([empty])
    assert isinstance(merged, DetDataSample)
    assert merged.pred_instances.bboxes.shape == (0, 4) and merged.pred_instances.masks.shape == (0, 20, 30)


@pytest.mark.parametrize('name', sorted(osp.basename(p)[:-3] for p in glob.glob(osp.join(
    REPO, 'configs', 'detection', '*.py'))))
def test_detection_configs_evaluate_any_coco_file_and_have_tta(name, tmp_path):
    """Every detection config: mmdet's CocoMetric for val and test, and --tta with the flip (single-scale
    training) or the flip at three scales (ms-crop: multi-scale training); the TTA pipeline gives one
    input per view."""
    import cv2
    from mmcv.transforms import Compose
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'detection', f'{name}.py'))
    assert cfg.val_evaluator.type == cfg.test_evaluator.type == 'CocoMetric'
    assert cfg.test_evaluator.ann_file == 'data/coco/annotations/instances_val2017.json'
    assert cfg.tta_model.type == 'PolaDetTTAModel'
    augment = next(t for t in cfg.tta_pipeline if t.type == 'TestTimeAug').transforms
    scales = [t.scale for t in augment[0]]
    assert scales == ([(1333, 800), (666, 400), (2000, 1200)] if 'ms-crop' in name else [(1333, 800)])
    assert [t.prob for t in augment[1]] == [1., 0.]
    assert 'flip' in augment[-1][0].meta_keys and 'flip_direction' in augment[-1][0].meta_keys

    mmdet_scope()
    cv2.imwrite(str(tmp_path / 'image.jpg'), np.full((60, 90, 3), 127, np.uint8))
    views = Compose(cfg.tta_pipeline)(dict(img_path=str(tmp_path / 'image.jpg'), img_id=0))
    assert len(views['inputs']) == len(views['data_samples']) == 2 * len(scales)
    assert [s.flip for s in views['data_samples']] == [True, False] * len(scales)
