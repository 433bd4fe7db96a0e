"""The data files a run reads exist, are not empty and are not cut off, checked before anything is built.

A missing dataset root, annotation file, image or segmentation map is reported up front, with the
files and the fix, instead of as an exception inside a DataLoader worker hours into a run. Each image
and map is judged by its first bytes and its last KiB (one open, two small reads): a JPEG without its
end marker or a PNG without its IEND chunk (an interrupted download or copy), and a file that starts
as no image format does, is then decoded with PIL to be sure, and reported when that fails. (A body
damaged in the middle of a complete file is not seen: that would need every file decoded.)
"""
import os
import os.path as osp

from mmpola.errors import UserError

from ..config import is_url
from ..options import DATA_HINT
from .datasets import coco_image_file_names, defining_class, leaf_datasets, listing, seg_dataset_files

__all__ = ['check_data_files', 'check_dataset_images', 'check_image_files']


_DATA_HINTS = {
    'CocoDataset': 'for COCO 2017, put annotations/instances_{train,val}2017.json, train2017/ and '
                   'val2017/ under data/coco/ (or symlink data/coco to your copy)',
    'ADE20KDataset': 'for ADE20K put ADEChallengeData2016/ (images/ and annotations/) under data/ade/',
}


def check_data_files(cfg, dataloader_keys, check_images=True):
    """Fail early with a hint when a dataset root, annotation file, image folder or image is missing.

    A config may carry ``data_hint='...'`` (e.g. the command that generates its demo data); it
    is shown first. With ``check_images`` (the default) every file the dataset will read is
    stat'ed and its ends read (:func:`check_dataset_images`), so that a missing, empty or cut-off image
    is reported here, naming the files, rather than as an exception inside a DataLoader worker hours into a run.
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
    hint = cfg.get(DATA_HINT) or _DATA_HINTS.get(dataset.get('type'), '')
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


# the first bytes of the image formats the decoders read (cv2 and PIL sniff the content, not the suffix);
# Netpbm: P1-P6, PAM (P7) and PFM (PF, Pf); any other file that starts with 'P' (a zip: 'PK') is decoded
_SIGNATURES = ((b'\xff\xd8\xff', 'JPEG'), (b'\x89PNG\r\n\x1a\n', 'PNG'), (b'GIF8', 'GIF'), (b'BM', 'BMP'),
               (b'II*\x00', 'TIFF'), (b'MM\x00*', 'TIFF'), (b'RIFF', 'WEBP'),
               *((b'P' + c.encode(), 'PNM') for c in '1234567Ff'))
# where each format's complete file ends: the marker must lie in the last KiB (trailers after it are kept short)
_END_MARKERS = {'JPEG': (b'\xff\xd9', 'its end marker (FF D9)'), 'PNG': (b'IEND', 'its IEND chunk')}
_TAIL = 1024
_UNREADABLE = 'unreadable: '


def _damage(path):
    """Why the image file ``path`` cannot be decoded whole, or None (see the module doc)."""
    try:
        with open(path, 'rb') as f:
            head = f.read(8)
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _TAIL))
            tail = f.read()
    except OSError as exc:
        return f'{_UNREADABLE}{exc.strerror or exc}'
    kind = next((name for sig, name in _SIGNATURES if head.startswith(sig)), None)
    marker = _END_MARKERS.get(kind)
    if kind is not None and (marker is None or marker[0] in tail):
        return None
    from PIL import Image
    try:  # to be sure: a full decode (PIL raises for a cut-off file, cv2 would fill it with gray)
        with Image.open(path) as img:
            img.load()
    except Exception as exc:  # noqa: BLE001  (anything PIL cannot decode)
        why = f'{type(exc).__name__}: {exc}'
        if kind is None:  # PIL's UnidentifiedImageError says no more than that (and repeats the path)
            return f'not an image file: no image format starts with the bytes {head.hex(" ")}'
        return f'cut off: a {kind} file without {marker[1]}, {size} bytes ({why})'
    return None


def check_dataset_images(dataset, key='dataset', hint=''):
    """Stat every image (and segmentation map) a dataset config will read; raise :class:`UserError`
    with the count, the first paths and the fix when some are missing or empty (0 bytes).

    Understood: mmdet's COCO-format datasets (``images[*].file_name`` of ``ann_file`` under
    ``data_prefix.img``) and mmseg's folder datasets (images by suffix under
    ``data_prefix.img_path``, maps under ``seg_map_path``). Other datasets, and files read through
    a remote ``backend_args``, are left to the dataset. One ``stat`` and one open (two small reads) per file;
    a file that looks cut off or no image is decoded.
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
        drop = f', or remove their entries from {ann_file!r}'
        groups = [('images', images, f'listed in {ann_file!r}',
                   f'restore them, or remove their entries from {ann_file!r}')]
    elif defining_class(dataset_type, 'load_data_list') == 'BaseSegDataset':
        if any(is_url(v) for v in prefix.values()):
            return
        images, seg_maps = seg_dataset_files(dataset, root)
        drop = ''

        groups = [('images', images, 'the dataset lists', 'restore them')]
        if seg_maps:
            groups.append(('segmentation maps', seg_maps, 'of the images under '
                           f"{dataset['data_prefix']['img_path']!r} (one per image, same name)",
                           'add the missing maps, or move the images that have none out of the image folder'))
    else:
        return
    check_image_files(groups, key, drop, hint)


def check_image_files(groups, key, drop='', hint=''):
    """Raise :class:`UserError` for the first group of files with missing, empty, unreadable or
    undecodable ones, with the count, the first paths and the fix. ``groups``: ``(what, paths, source,
    fix)`` (``'images'``, the files, where they come from, the fix for missing ones); ``drop``: how to
    leave a file out (appended to the fix of damaged ones)."""
    for what, paths, source, fix in groups:
        missing, empty = _missing_and_empty(paths)
        if missing:
            raise UserError(
                f'{key}: {len(missing)} of {len(paths)} {what} {source} do not exist:{listing(missing)}'
                f'\nFix: {fix}. {hint}'.rstrip())
        if empty:
            raise UserError(
                f'{key}: {len(empty)} of {len(paths)} {what} {source} are empty (0 bytes: an interrupted '
                f'download or copy):{listing(empty)}\nFix: replace them with the original files{drop}. {hint}'.rstrip())
        verdicts = [(path, _damage(path)) for path in paths]
        unreadable = [f'{path}: {why[len(_UNREADABLE):]}' for path, why in verdicts
                      if why and why.startswith(_UNREADABLE)]
        if unreadable:
            raise UserError(
                f'{key}: {len(unreadable)} of {len(paths)} {what} {source} cannot be read:{listing(unreadable)}'
                f'\nFix: make them readable by this user (chmod a+r, or run as their owner){drop}. {hint}'.rstrip())
        damaged = [f'{path}: {why}' for path, why in verdicts if why]
        if damaged:
            raise UserError(
                f'{key}: {len(damaged)} of {len(paths)} {what} {source} cannot be decoded (an interrupted '
                f'download or copy, or a damaged file):{listing(damaged)}\nFix: replace them with the original '
                f'files (download or copy them again){drop}. {hint}'.rstrip())
