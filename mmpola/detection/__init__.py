"""mmdet extensions the detection configs use.

* ``PolaCocoMetric``: mmdet's ``CocoMetric`` that also evaluates annotation files without an
  ``info`` entry (pycocotools >= 2.0.8 needs one in ``COCO.loadRes``).
* ``PolaDetTTAModel``: mmdet's ``DetTTAModel`` (``tools/test.py --tta``) that also merges instance
  masks.

Both are registered in mmengine's root registries (visible from the ``mmdet`` scope) as builders
that import mmdet when a config builds them, so ``import mmpola`` does not load mmdet.
"""
from mmengine.registry import METRICS, MODELS

__all__ = ['build_coco_metric', 'build_det_tta_model']


@METRICS.register_module(name='PolaCocoMetric')
def build_coco_metric(**kwargs):
    """mmdet's ``CocoMetric(**kwargs)``; see :func:`mmpola.detection.coco.coco_metric`."""
    from .coco import coco_metric
    return coco_metric(**kwargs)


@MODELS.register_module(name='PolaDetTTAModel')
def build_det_tta_model(**kwargs):
    """:class:`mmpola.detection.tta.PolaDetTTAModel` ``(**kwargs)``."""
    from .tta import PolaDetTTAModel
    return PolaDetTTAModel(**kwargs)
