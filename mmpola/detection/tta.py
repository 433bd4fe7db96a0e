"""Test-time augmentation of detectors and instance segmenters (``tools/test.py --tta``)."""
import torch
from mmcv.ops import batched_nms
from mmdet.models.test_time_augs import DetTTAModel
from mmengine.structures import InstanceData

__all__ = ['PolaDetTTAModel']

_FLIP_DIMS = {'horizontal': (-1, ), 'vertical': (-2, ), 'diagonal': (-2, -1)}


class PolaDetTTAModel(DetTTAModel):
    """mmdet's ``DetTTAModel``, also for instance segmentation and for images without detections.

    As mmdet: the boxes of every view (scales, flips) are mapped back to the original image,
    pooled and reduced with ``tta_cfg.nms``, keeping at most ``tta_cfg.max_per_img``. mmdet 3.3
    drops the masks there (Mask R-CNN's ``segm`` metric then has no results) and returns a bare
    tuple instead of a data sample when no view detects anything. Here each kept detection keeps
    the mask its own view predicted, flipped back like its box (the detectors predict masks at
    the original image size), and an image without detections gets an empty prediction.
    """

    def _merge_single_sample(self, data_samples):
        views = [sample.pred_instances for sample in data_samples]
        metas = [sample.metainfo for sample in data_samples]
        bboxes, scores = self.merge_aug_bboxes([v.bboxes for v in views], [v.scores for v in views], metas)
        labels = torch.cat([v.labels for v in views])
        if bboxes.numel():
            dets, keep = batched_nms(bboxes, scores, labels, self.tta_cfg['nms'])
            max_per_img = self.tta_cfg['max_per_img']
            keep, dets = keep[:max_per_img], dets[:max_per_img]
            bboxes, scores = dets[:, :-1], dets[:, -1]
        else:
            keep = labels.new_zeros(0)
        results = InstanceData(bboxes=bboxes, scores=scores, labels=labels[keep])
        if all('masks' in v for v in views):
            masks = [_unflip(v.masks, meta) for v, meta in zip(views, metas)]
            results.masks = torch.cat(masks)[keep]
        merged = data_samples[0]
        merged.pred_instances = results
        return merged


def _unflip(masks, meta):
    """Masks of a flipped view, in the original image's orientation."""
    if not meta.get('flip', False):
        return masks
    return masks.flip(_FLIP_DIMS[meta['flip_direction']])
