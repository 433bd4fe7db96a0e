"""COCO-format annotation files as users write them.

pycocotools 2.0.8 - 2.0.10 copy the ground truth's ``info`` entry in ``COCO.loadRes`` (2.0.11
falls back to an empty one), so an
annotation file without ``info`` (optional in practice, and missing from most converted or
hand-made datasets) fails with ``KeyError: 'info'`` at the first evaluation, after the whole
first training interval. mmdet's CocoMetric loads its ``ann_file`` once, when it is built; an
empty ``info`` is added to that in-memory copy (the file is left as it is).
"""
from mmengine.logging import print_log

__all__ = ['coco_metric']


def coco_metric(**kwargs):
    """Build mmdet's ``CocoMetric(**kwargs)``; an ``ann_file`` without ``info`` gets an empty one."""
    from mmdet.evaluation import CocoMetric
    metric = CocoMetric(**kwargs)
    # None without ann_file: CocoMetric then writes its own file from the dataset, with `info`
    coco = metric._coco_api
    if coco is not None and 'info' not in coco.dataset:
        coco.dataset['info'] = {}
        print_log(f"[mmpola] {kwargs.get('ann_file')}: no 'info' entry (pycocotools 2.0.8 - 2.0.10 need one to "
                  'evaluate); using an empty one (the file is not changed)', logger='current')
    return metric
