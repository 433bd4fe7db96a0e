"""ImageNet classification with the Pola models on mmengine: what mmengine and timm do not ship.

Importing this package registers, in mmengine's root registries (classification configs use
``default_scope='mmengine'`` and list ``mmpola.classification`` in ``custom_imports``):

* ``ImageNetFolderDataset``: ``<root>/<split>/<class>/<image>`` folders;
* ``LoadPILImage`` / ``TimmTransform`` / ``PackClsInputs``: per-image pipeline with timm's
  ImageNet transforms (RandAugment, random resized crop, colour jitter; official eval resize);
* ``TimmClsDataPreprocessor``: normalisation, random erasing and Mixup/CutMix batch-wise;
* ``ClassificationModel``: the classifier of every architecture and kind (Pola, FLatten, InLine,
  PolaFormer++ ...) with loss and predictions (checkpoints keep the ``backbone.*`` names the dense
  configs load);
* ``TopKAccuracy``: top-1 / top-5 accuracy;
* ``SwitchableEMAHook``: EMA of the weights, off unless ``custom_hooks.0.enabled=True``.
"""
import mmpola  # noqa: F401  (backbones, timm entries, safe checkpoint loading)

from .data_preprocessor import TimmClsDataPreprocessor
from .datasets import ImageNetFolderDataset
from .hooks import SwitchableEMAHook
from .metrics import TopKAccuracy
from .model import ClassificationModel
from .transforms import LoadPILImage, PackClsInputs, TimmTransform

__all__ = ['ImageNetFolderDataset', 'LoadPILImage', 'TimmTransform', 'PackClsInputs',
           'TimmClsDataPreprocessor', 'ClassificationModel', 'TopKAccuracy',
           'SwitchableEMAHook']
