"""ImageNet in its folder layout as an mmengine dataset.

``<data_root>/<data_prefix.img_path>/<class name>/<image>`` (``data/imagenet/train/n01440764/
n01440764_10026.JPEG``, ``val/n01440764/ILSVRC2012_val_00000293.JPEG``), the layout
torchvision's ``ImageFolder`` and the official PolaFormer code read.
"""
import os.path as osp

from mmengine.dataset import BaseDataset
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from mmpola.registry import DATASETS

__all__ = ['ImageNetFolderDataset', 'class_source']


def class_source(data_root, classes_from):
    """The folder whose class sub-folders number the classes (``classes_from`` under ``data_root``)."""
    return classes_from if osp.isabs(classes_from) or not data_root else osp.join(data_root, classes_from)


@DATASETS.register_module()
class ImageNetFolderDataset(BaseDataset):
    """Images in class sub-folders; labels are class indices.

    Class indices follow ``metainfo=dict(classes=[...])`` when given, else the sorted class folders
    (as ``ImageFolder``) of ``classes_from`` (the shipped configs: ``'train'`` for every split), else
    those of the split's own folder. Numbering every split from the training split keeps a validation
    split that lacks a class folder on the training indices (numbered from its own folders, every
    label after the missing class would be shifted by one). Every sample is
    ``dict(img_path=..., gt_label=int)``; the pipeline (see :mod:`mmpola.classification.transforms`)
    reads and transforms it.

    Args:
        data_root: dataset root, e.g. ``'data/imagenet'``.
        data_prefix: ``dict(img_path='train')``: the split folder under ``data_root``.
        classes_from: the folder (under ``data_root``) whose class sub-folders number the classes,
            e.g. ``'train'``; None: the split's own folder.
        extensions: accepted file name endings (case-insensitive; torchvision's list).
        **kwargs: :class:`mmengine.dataset.BaseDataset` arguments (``pipeline``, ``metainfo``,
            ``test_mode``, ``indices``, ``lazy_init`` ...).
    """

    METAINFO = dict(classes=None)

    def __init__(self, data_root='', data_prefix=dict(img_path=''), classes_from=None, extensions=IMG_EXTENSIONS,
                 **kwargs):
        self.extensions = tuple(e.lower() for e in extensions)
        self.classes_from = None if classes_from is None else class_source(data_root, classes_from)
        super().__init__(data_root=data_root, data_prefix=data_prefix, **kwargs)

    @property
    def folder(self):
        return self.data_prefix['img_path']

    def load_data_list(self):
        folder = self.folder
        if not osp.isdir(folder):
            raise FileNotFoundError(
                f'image folder {folder!r} does not exist; expected the ImageNet layout '
                '<data_root>/<split>/<class>/<image> (set data_root / data_prefix.img_path)')
        found, _ = find_classes(folder)
        classes = self._metainfo.get('classes')
        source = 'metainfo.classes'
        if classes is None and self.classes_from is not None:
            source = f'the class folders of {self.classes_from}'
            classes = find_classes(self.classes_from)[0]
            self._metainfo['classes'] = tuple(classes)
        if classes is None:
            classes = found
            self._metainfo['classes'] = tuple(found)
        else:
            unknown = sorted(set(found) - set(classes))
            if unknown:
                raise ValueError(f'{folder} has class folders missing from {source}: '
                                 f'{unknown[:5]}{" ..." if len(unknown) > 5 else ""}')
        class_to_idx = {name: i for i, name in enumerate(classes)}
        # make_dataset wants only the classes present here (it errors on empty ones)
        present = {name: class_to_idx[name] for name in found}
        samples = make_dataset(folder, present, extensions=self.extensions, allow_empty=True)
        if not samples:
            raise FileNotFoundError(f'no images with extensions {self.extensions} under {folder}')
        return [dict(img_path=path, gt_label=label) for path, label in samples]

    def get_gt_labels(self):
        return [self.get_data_info(i)['gt_label'] for i in range(len(self))]
