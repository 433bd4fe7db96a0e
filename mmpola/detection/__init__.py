"""mmdet extensions the detection configs use.

* ``PolaDetTTAModel``: mmdet's ``DetTTAModel`` (``tools/test.py --tta``) that also merges instance
  masks.
* ``SimpleFeaturePyramid``: ViTDet's simple feature pyramid, the neck of the plain ViT backbones
  (``InLineDeiT``, ``ViTBackbone``), which mmdet ships only as a project outside its package.

(COCO evaluation is mmdet's own ``CocoMetric``: pycocotools >= 2.0.11 evaluates annotation files
without an ``info`` entry.) Registered in mmengine's root registry (visible from the ``mmdet`` scope)
as a builder that imports mmdet when a config builds it, so ``import mmpola`` does not load mmdet.
"""
from mmpola.registry import MODELS

from .simple_fpn import SimpleFeaturePyramid

__all__ = ['build_det_tta_model', 'SimpleFeaturePyramid']


@MODELS.register_module(name='PolaDetTTAModel')
def build_det_tta_model(**kwargs):
    """:class:`mmpola.detection.tta.PolaDetTTAModel` ``(**kwargs)``."""
    from .tta import PolaDetTTAModel
    return PolaDetTTAModel(**kwargs)
