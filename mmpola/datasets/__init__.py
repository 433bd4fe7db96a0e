"""Dataset helpers: the synthetic demo datasets (tools/make_demo_coco.py, tools/make_demo_ade.py) and
pipeline checks: images in the form the models take (:class:`CheckImage`), labels that name the bad
file (:class:`CheckSegLabels`), JPEGs with a damaged body refused where they are decoded
(:class:`LoadCheckedImage`)."""
from mmpola.registry import TRANSFORMS

from .decoding import DamagedImageError
from .demo_ade import DEMO_ADE_CLASSES, DEMO_ADE_PALETTE, demo_ade_is_complete, make_demo_ade  # noqa: F401
from .demo_coco import DEMO_CLASSES, demo_coco_files, demo_coco_is_complete, make_demo_coco
from .transforms import CheckImage, CheckSegLabels

__all__ = ['DEMO_CLASSES', 'make_demo_coco', 'demo_coco_is_complete', 'demo_coco_files', 'CheckImage', 'CheckSegLabels',
           'LoadCheckedImage', 'DamagedImageError']


@TRANSFORMS.register_module(name='LoadCheckedImage')
def build_load_checked_image(**kwargs):
    """:class:`mmpola.datasets.checked_loading.LoadCheckedImage` ``(**kwargs)``: registered as a builder that
    imports mmcv when a pipeline builds it, so ``import mmpola`` does not need mmcv (the backbones and the
    timm entries do not)."""
    from .checked_loading import LoadCheckedImage
    return LoadCheckedImage(**kwargs)


def __getattr__(name):
    if name == 'LoadCheckedImage':  # imports mmcv: made on first use (``import mmpola`` needs no mmcv)
        from .checked_loading import LoadCheckedImage
        return LoadCheckedImage
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
