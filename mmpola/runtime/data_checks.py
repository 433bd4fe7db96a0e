"""Data-file checks that run before anything is built.

A missing dataset root, annotation file, image or segmentation map is reported up front, with the
files and the fix, instead of as an exception inside a DataLoader worker hours into a run.
"""
import inspect
import json
import mmap
import os
import os.path as osp
import re

from mmpola.errors import UserError

from .cli import is_url

__all__ = ['run_preflight', 'check_data_files', 'check_dataset_images', 'coco_image_file_names']


def run_preflight(cfg, dataloader_keys, skip_data_check=False):
    """Everything tools/train.py and tools/test.py check before building anything, once.

    * the model's channels (:func:`mmpola.runtime.preflight.check_model_channels`), always;
    * unless ``skip_data_check`` (``--skip-data-check``): the data files
      (:func:`check_data_files`) and what they hold against the model
      (:func:`mmpola.runtime.preflight.check_dataset_contents`: annotations, segmentation maps,
      classes and ``num_classes``).

    With a process group (started by :func:`mmpola.runtime.launch.init_distributed`) only rank 0
    checks; the others wait for its verdict and stop with the same message
    (:func:`mmpola.runtime.launch.run_on_rank0_and_share`).
    """
    from .launch import run_on_rank0_and_share
    from .preflight import check_dataset_contents, check_model_channels

    def checks():
        check_model_channels(cfg)
        if not skip_data_check:
            check_data_files(cfg, dataloader_keys)
            check_dataset_contents(cfg, dataloader_keys)

    run_on_rank0_and_share(checks)


def _dataset_cfgs(node):
    """The leaf dataset configs of a (possibly wrapped: RepeatDataset, ConcatDataset ...) dataset."""
    if not isinstance(node, dict):
        return
    inner = node.get('dataset', None)
    inners = node.get('datasets', None)
    if isinstance(inner, dict):
        yield from _dataset_cfgs(inner)
    elif isinstance(inners, (list, tuple)):
        for item in inners:
            yield from _dataset_cfgs(item)
    else:
        yield node



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
        for dataset in _dataset_cfgs(loader.get('dataset')):
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



# how many offending paths an error message lists
_SHOW_PATHS = 5



def _dataset_class(dataset_type):
    """The class the Runner would build for ``type`` (looked up as the builder does: in the
    registry of the current default scope), or None."""
    if isinstance(dataset_type, type):
        return dataset_type
    if not isinstance(dataset_type, str):
        return None
    try:
        from mmengine.registry import DATASETS
        with DATASETS.switch_scope_and_registry(None) as registry:
            cls = registry.get(dataset_type)
    except Exception:  # an unknown scope or type: the Runner will report it
        return None
    return cls if isinstance(cls, type) else None



def _defining_class(dataset_type, method):
    """Name of the class whose ``method`` the dataset type uses (registry lookup, MRO), or None."""
    cls = _dataset_class(dataset_type)
    if cls is None:
        return None
    owner = next((c for c in cls.__mro__ if method in vars(c)), None)
    return owner.__name__ if owner is not None else None



def _init_default(dataset_type, name, fallback):
    """Default of ``name`` in the dataset class' ``__init__`` (e.g. ADE20KDataset's suffixes)."""
    cls = _dataset_class(dataset_type)
    for c in (cls.__mro__ if cls is not None else ()):
        param = inspect.signature(c.__init__).parameters.get(name)
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default
    return fallback



def coco_image_file_names(ann_file):
    """``images[*].file_name`` of a COCO annotation file, quickly.

    ``json.load`` of a file the size of COCO's instances_train2017.json (~450 MB) takes ~30 s
    and GBs of memory; the ``images`` array (118k entries, ~30 MB) comes before the annotations
    in COCO-format files, so only it is decoded, from a memory map (~0.5 s). Files laid out
    otherwise fall back to a full parse.
    """
    try:
        with open(ann_file, 'rb') as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise UserError(f'annotation file {ann_file!r} is empty (0 bytes): an interrupted '
                                'download or copy; replace it with the original file')
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                images = _decode_images_array(mm)
                if images is None:
                    images = json.loads(mm[:].decode('utf-8')).get('images', [])
    except (ValueError, AttributeError) as e:  # JSONDecodeError, UnicodeDecodeError, not an object
        raise UserError(f'annotation file {ann_file!r} is not a COCO-format JSON file ({e}); '
                        'replace it with the original file') from e
    if not isinstance(images, list):
        raise UserError(f"annotation file {ann_file!r}: 'images' is not a list")
    return [img['file_name'] for img in images if isinstance(img, dict) and 'file_name' in img]



def _decode_images_array(mm):
    match = re.search(rb'"images"\s*:\s*\[', mm)  # only a key can be followed by ':'
    if match is None:
        return None
    start, size, decoder = match.end() - 1, 1 << 25, json.JSONDecoder()
    while True:
        chunk = mm[start:start + size].decode('utf-8', 'replace')  # a cut character: only at the end
        try:
            images, _ = decoder.raw_decode(chunk)  # a cut-off array is never valid JSON
        except json.JSONDecodeError:
            if start + size >= len(mm):
                return None
            size *= 4
            continue
        ok = all(isinstance(img, dict) and 'file_name' in img for img in images[:100])
        return images if ok else None



def _seg_dataset_files(dataset, root):
    """(images, seg maps) an mmseg BaseSegDataset would list: images found under ``img_path`` by
    suffix (or named by ``ann_file``, one stem per line), each with its map under ``seg_map_path``."""
    def full(path):
        return path if osp.isabs(path) else osp.join(root, path)

    prefix = dataset.get('data_prefix') or {}
    img_dir = full(prefix.get('img_path', '') or '')
    seg_dir = prefix.get('seg_map_path')
    seg_dir = full(seg_dir) if seg_dir else None
    img_suffix = dataset.get('img_suffix') or _init_default(dataset.get('type'), 'img_suffix', '.jpg')
    seg_suffix = dataset.get('seg_map_suffix') or _init_default(dataset.get('type'), 'seg_map_suffix', '.png')
    ann_file = dataset.get('ann_file') or ''
    if ann_file and not osp.isdir(full(ann_file)):
        with open(full(ann_file)) as f:
            stems = [line.strip() for line in f if line.strip()]
    else:
        stems = []
        for dirpath, _, files in os.walk(img_dir, followlinks=True):
            rel = osp.relpath(dirpath, img_dir)
            stems += [osp.normpath(osp.join(rel, name))[:-len(img_suffix)]
                      for name in files if name.endswith(img_suffix)]
        if not stems:
            raise UserError(f'no {img_suffix!r} images under {img_dir!r}')
        stems.sort()
    images = [osp.join(img_dir, stem + img_suffix) for stem in stems]
    seg_maps = [osp.join(seg_dir, stem + seg_suffix) for stem in stems] if seg_dir else []
    return images, seg_maps



def _missing_and_empty(paths):
    missing, empty = [], []
    for path in paths:
        try:
            if os.stat(path).st_size == 0:
                empty.append(path)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(path)
    return missing, empty



def _listing(paths):
    shown = ''.join(f'\n  {path}' for path in paths[:_SHOW_PATHS])
    more = len(paths) - _SHOW_PATHS
    return shown + (f'\n  ... and {more} more' if more > 0 else '')



def check_dataset_images(dataset, key='dataset', hint=''):
    """Stat every image (and segmentation map) a dataset config will read; raise :class:`UserError`
    with the count, the first paths and the fix when some are missing or empty (0 bytes).

    Understood: mmdet's COCO-format datasets (``images[*].file_name`` of ``ann_file`` under
    ``data_prefix.img``) and mmseg's folder datasets (images by suffix under
    ``data_prefix.img_path``, maps under ``seg_map_path``). Other datasets, and files read through
    a remote ``backend_args``, are left to the dataset. One ``stat`` per file: COCO train2017
    (118k images) takes well under a second on a local disk.
    """
    if dataset.get('backend_args') or is_url(dataset.get('data_root')):
        return
    root = dataset.get('data_root') or ''
    prefix = dataset.get('data_prefix') or {}
    if not isinstance(prefix, dict):
        return
    dataset_type = dataset.get('type')
    loader_owner = _defining_class(dataset_type, 'parse_data_info')
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
    elif _defining_class(dataset_type, 'load_data_list') == 'BaseSegDataset':
        if any(is_url(v) for v in prefix.values()):
            return
        images, seg_maps = _seg_dataset_files(dataset, root)
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
                f'{key}: {len(missing)} of {len(paths)} {what} {source} do not exist:{_listing(missing)}'
                f'\nFix: {fix}. {hint}'.rstrip())
        if empty:
            raise UserError(
                f'{key}: {len(empty)} of {len(paths)} {what} {source} are empty (0 bytes: an interrupted '
                f'download or copy):{_listing(empty)}\nFix: replace them with the original files. {hint}'.rstrip())
