"""What a dataset config reads: its leaf datasets, their classes and files (shared by the checks).

Dataset configs are looked at, never built: the class a ``type`` names is looked up in the registry
of the current default scope, as the Runner would, to learn which loader it uses (mmdet's COCO-format
``CocoDataset`` or mmseg's folder ``BaseSegDataset``), its default ``METAINFO`` and ``__init__``
defaults.
"""
import inspect
import json
import mmap
import os
import os.path as osp
import re

from mmpola.errors import UserError

from ..config import is_url

__all__ = ['leaf_datasets', 'leaf_dataset_paths', 'pipeline_step', 'dataset_class', 'defining_class',
           'init_default', 'is_coco', 'is_seg', 'reads_local_files', 'dataset_classes', 'coco_ann_path',
           'coco_image_dir', 'coco_image_file_names', 'coco_images', 'seg_dataset_files', 'full_path', 'shown',
           'listing', 'SHOW']

# how many offending paths or ids a message lists
SHOW = 5


def full_path(root, path):
    return path if osp.isabs(path) or not root else osp.join(root, path)


def shown(items, more_word='more'):
    """``a, b, c, d, e and 3 more``."""
    items = list(items)
    text = ', '.join(str(i) for i in items[:SHOW])
    return text + (f' and {len(items) - SHOW} {more_word}' if len(items) > SHOW else '')


def listing(items):
    """One indented line per item (the first :data:`SHOW`), then how many more."""
    text = ''.join(f'\n  {item}' for item in items[:SHOW])
    return text + (f'\n  ... and {len(items) - SHOW} more' if len(items) > SHOW else '')


def leaf_datasets(node):
    """The leaf dataset configs of a (possibly wrapped: RepeatDataset, ConcatDataset ...) dataset."""
    for _, dataset in leaf_dataset_paths(node):
        yield dataset


def leaf_dataset_paths(node, where='dataset'):
    """``(config path, leaf dataset config)`` of every leaf dataset below ``node`` (found at
    ``where``, e.g. ``'train_dataloader.dataset'``)."""
    if not isinstance(node, dict):
        return
    inner = node.get('dataset', None)
    inners = node.get('datasets', None)
    if isinstance(inner, dict):
        yield from leaf_dataset_paths(inner, f'{where}.dataset')
    elif isinstance(inners, (list, tuple)):
        for i, item in enumerate(inners):
            yield from leaf_dataset_paths(item, f'{where}.datasets.{i}')
    else:
        yield where, node


def pipeline_step(dataset, name):
    """``(index, step config)`` of the first step of type ``name`` (any scope; or of one of the types
    ``name`` lists) in the dataset's pipeline, or ``(None, None)``."""
    names = (name,) if isinstance(name, str) else tuple(name)
    for i, step in enumerate(dataset.get('pipeline') or []):
        if isinstance(step, dict) and str(step.get('type', '')).split('.')[-1] in names:
            return i, step
    return None, None


def dataset_class(dataset_type):
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


def defining_class(dataset_type, method):
    """Name of the class whose ``method`` the dataset type uses (registry lookup, MRO), or None."""
    cls = dataset_class(dataset_type)
    if cls is None:
        return None
    owner = next((c for c in cls.__mro__ if method in vars(c)), None)
    return owner.__name__ if owner is not None else None


def init_default(dataset_type, name, fallback):
    """Default of ``name`` in the dataset class' ``__init__`` (e.g. ADE20KDataset's suffixes)."""
    cls = dataset_class(dataset_type)
    for c in (cls.__mro__ if cls is not None else ()):
        param = inspect.signature(c.__init__).parameters.get(name)
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default
    return fallback


def is_coco(dataset):
    owner = defining_class(dataset.get('type'), 'parse_data_info')
    return owner == 'CocoDataset' or (owner is None and dataset.get('type') == 'CocoDataset')


def is_seg(dataset):
    return defining_class(dataset.get('type'), 'load_data_list') == 'BaseSegDataset'


def reads_local_files(dataset):
    """Whether the dataset reads local files (remote backends are left to the dataset)."""
    prefix = dataset.get('data_prefix') or {}
    return not (dataset.get('backend_args') or is_url(dataset.get('data_root'))
                or (isinstance(prefix, dict) and any(is_url(v) for v in prefix.values())))


def dataset_classes(dataset):
    """``(classes, where they come from)`` of a dataset config: its ``metainfo.classes``, else the
    dataset class's ``METAINFO`` (mmdet's CocoDataset: the 80 COCO classes); ``(None, '')`` when
    neither says."""
    metainfo = dataset.get('metainfo') or {}
    if isinstance(metainfo, dict) and metainfo.get('classes'):
        return tuple(metainfo['classes']), 'its metainfo'
    cls = dataset_class(dataset.get('type'))
    classes = (getattr(cls, 'METAINFO', None) or {}).get('classes') if cls is not None else None
    if classes:
        return tuple(classes), f"{cls.__name__}'s default METAINFO (no metainfo=dict(classes=...) in the config)"
    return None, ''


def coco_ann_path(dataset):
    ann_file = dataset.get('ann_file') or ''
    return full_path(dataset.get('data_root') or '', ann_file) if ann_file else None


def coco_image_dir(dataset):
    """The folder a COCO-format dataset config reads its images from (``data_prefix.img``)."""
    prefix = dataset.get('data_prefix') or {}
    img_dir = (prefix.get('img', '') if isinstance(prefix, dict) else '') or ''
    return full_path(dataset.get('data_root') or '', img_dir) if not is_url(img_dir) else None


def coco_image_file_names(ann_file):
    """``images[*].file_name`` of a COCO annotation file, quickly (:func:`coco_images`)."""
    return [img['file_name'] for img in coco_images(ann_file) if 'file_name' in img]


def coco_images(ann_file):
    """The ``images`` entries (dicts) of a COCO annotation file, quickly.

    ``json.load`` of a file the size of COCO's instances_train2017.json (~450 MB) takes tens of
    seconds and GBs of memory; the ``images`` array (118k entries, ~30 MB) comes before the
    annotations in COCO-format files, so only it is decoded, from a memory map. Files laid out
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
    return [img for img in images if isinstance(img, dict)]


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


def seg_dataset_files(dataset, root):
    """(images, seg maps) an mmseg BaseSegDataset would list: images found under ``img_path`` by
    suffix (or named by ``ann_file``, one stem per line), each with its map under ``seg_map_path``."""
    def full(path):
        return path if osp.isabs(path) else osp.join(root, path)

    prefix = dataset.get('data_prefix') or {}
    img_dir = full(prefix.get('img_path', '') or '')
    seg_dir = prefix.get('seg_map_path')
    seg_dir = full(seg_dir) if seg_dir else None
    img_suffix = dataset.get('img_suffix') or init_default(dataset.get('type'), 'img_suffix', '.jpg')
    seg_suffix = dataset.get('seg_map_suffix') or init_default(dataset.get('type'), 'seg_map_suffix', '.png')
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
