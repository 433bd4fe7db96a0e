"""ImageNet in its folder layout as an mmengine dataset.

``<data_root>/<data_prefix.img_path>/<class name>/<image>`` (``data/imagenet/train/n01440764/
n01440764_10026.JPEG``, ``val/n01440764/ILSVRC2012_val_00000293.JPEG``), the layout
torchvision's ``ImageFolder`` and the official PolaFormer code read.
"""
import os.path as osp

from mmengine.dataset import BaseDataset
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from mmpola.registry import DATASETS

__all__ = ['ImageNetFolderDataset']


@DATASETS.register_module()
class ImageNetFolderDataset(BaseDataset):
    """Images in class sub-folders; labels are class indices.

    Class indices follow the sorted folder names (as ``ImageFolder``), or
    ``metainfo=dict(classes=[...])`` when given, so a split that lacks some classes keeps the
    training indices. Every sample is ``dict(img_path=..., gt_label=int)``; the pipeline (see
    :mod:`mmpola.classification.transforms`) reads and transforms it.

    Args:
        data_root: dataset root, e.g. ``'data/imagenet'``.
        data_prefix: ``dict(img_path='train')``: the split folder under ``data_root``.
        extensions: accepted file name endings (case-insensitive; torchvision's list).
        **kwargs: :class:`mmengine.dataset.BaseDataset` arguments (``pipeline``, ``metainfo``,
            ``test_mode``, ``indices``, ``lazy_init`` ...).
    """

    METAINFO = dict(classes=None)

    def __init__(self, data_root='', data_prefix=dict(img_path=''), extensions=IMG_EXTENSIONS,
                 **kwargs):
        self.extensions = tuple(e.lower() for e in extensions)
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
        if classes is None:
            classes = found
            self._metainfo['classes'] = tuple(found)
        else:
            unknown = sorted(set(found) - set(classes))
            if unknown:
                raise ValueError(f'{folder} has class folders missing from metainfo.classes: '
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
