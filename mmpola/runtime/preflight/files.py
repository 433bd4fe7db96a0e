"""The data files a run reads exist and are not empty, checked before anything is built.

A missing dataset root, annotation file, image or segmentation map is reported up front, with the
files and the fix, instead of as an exception inside a DataLoader worker hours into a run.
"""
import os
import os.path as osp

from mmpola.errors import UserError

from ..config import is_url
from .datasets import coco_image_file_names, defining_class, leaf_datasets, listing, seg_dataset_files

__all__ = ['check_data_files', 'check_dataset_images']


_DATA_HINTS = {
    'CocoDataset': 'for COCO 2017, put annotations/instances_{train,val}2017.json, train2017/ and '
                   'val2017/ under data/coco/ (or symlink data/coco to your copy)',
    'ADE20KDataset': 'for ADE20K put ADEChallengeData2016/ (images/ and annotations/) under data/ade/',
}


def check_data_files(cfg, dataloader_keys, check_images=True):
    """Fail early with a hint when a dataset root, annotation file, image folder or image is missing.

    A config may carry ``data_hint='...'`` (e.g. the command that generates its demo data); it
    is shown first. With ``check_images`` (the default) every file the dataset will read is
    stat'ed too (:func:`check_dataset_images`), so that a missing or empty image is reported here,
    naming the files, rather than as an exception inside a DataLoader worker hours into a run.
    """
    for key in dataloader_keys:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for dataset in leaf_datasets(loader.get('dataset')):
            root = dataset.get('data_root') or ''
            paths = [('data_root', root)] if root else []
            ann_file = dataset.get('ann_file')
            if ann_file:
                paths.append(('ann_file', ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)))
            prefix = dataset.get('data_prefix') or {}
            for name, value in (prefix.items() if isinstance(prefix, dict) else []):
                if isinstance(value, str) and value and not is_url(value):
                    paths.append((f'data_prefix.{name}', value if osp.isabs(value) else osp.join(root, value)))
            for name, path in paths:
                if is_url(path) or osp.exists(path):
                    continue
                # the tools move every dataset with a config's top-level data_root (docs/training.md)
                option = ('data_root=DIR' if isinstance(cfg.get('data_root'), str) and cfg.data_root.strip('/')
                          else f'{key}.dataset.data_root=DIR')
                raise UserError(
                    f'{key}: {name} {path!r} does not exist. ' + _data_hint(cfg, dataset)
                    + f'Or point the config at your copy: --cfg-options {option}')
            if check_images:
                check_dataset_images(dataset, key, hint=_data_hint(cfg, dataset))


def _data_hint(cfg, dataset):
    hint = cfg.get('data_hint') or _DATA_HINTS.get(dataset.get('type'), '')
    return f'{hint[0].upper()}{hint[1:]}. ' if hint else ''


def _missing_and_empty(paths):
    missing, empty = [], []
    for path in paths:
        try:
            if os.stat(path).st_size == 0:
                empty.append(path)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(path)
    return missing, empty


def check_dataset_images(dataset, key='dataset', hint=''):
    """Stat every image (and segmentation map) a dataset config will read; raise :class:`UserError`
    with the count, the first paths and the fix when some are missing or empty (0 bytes).

    Understood: mmdet's COCO-format datasets (``images[*].file_name`` of ``ann_file`` under
    ``data_prefix.img``) and mmseg's folder datasets (images by suffix under
    ``data_prefix.img_path``, maps under ``seg_map_path``). Other datasets, and files read through
    a remote ``backend_args``, are left to the dataset. One ``stat`` per file; no file is opened.
    """
    if dataset.get('backend_args') or is_url(dataset.get('data_root')):
        return
    root = dataset.get('data_root') or ''
    prefix = dataset.get('data_prefix') or {}
    if not isinstance(prefix, dict):
        return
    dataset_type = dataset.get('type')
    loader_owner = defining_class(dataset_type, 'parse_data_info')
    if loader_owner == 'CocoDataset' or (loader_owner is None and dataset_type == 'CocoDataset'):
        ann_file = dataset.get('ann_file')
        if not ann_file or is_url(prefix.get('img', '')):
            return
        ann_file = ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)
        img_dir = prefix.get('img', '') or ''
        img_dir = img_dir if osp.isabs(img_dir) else osp.join(root, img_dir)
        images = [osp.join(img_dir, name) for name in coco_image_file_names(ann_file)]
        groups = [('images', images, f'listed in {ann_file!r}',
                   f'restore them, or remove their entries from {ann_file!r}')]
    elif defining_class(dataset_type, 'load_data_list') == 'BaseSegDataset':
        if any(is_url(v) for v in prefix.values()):
            return
        images, seg_maps = seg_dataset_files(dataset, root)
        groups = [('images', images, 'the dataset lists', 'restore them')]
        if seg_maps:
            groups.append(('segmentation maps', seg_maps, 'of the images under '
                           f"{dataset['data_prefix']['img_path']!r} (one per image, same name)",
                           'add the missing maps, or move the images that have none out of the image folder'))
    else:
        return
    for what, paths, source, fix in groups:
        missing, empty = _missing_and_empty(paths)
        if missing:
            raise UserError(
                f'{key}: {len(missing)} of {len(paths)} {what} {source} do not exist:{listing(missing)}'
                f'\nFix: {fix}. {hint}'.rstrip())
        if empty:
            raise UserError(
                f'{key}: {len(empty)} of {len(paths)} {what} {source} are empty (0 bytes: an interrupted '
                f'download or copy):{listing(empty)}\nFix: replace them with the original files. {hint}'.rstrip())
