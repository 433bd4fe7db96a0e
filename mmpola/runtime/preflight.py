"""Pre-flight checks of what the model will consume, before anything is built.

:func:`mmpola.runtime.data_checks.check_data_files` makes sure the files exist; the checks here read
what is in them and compare it with the model, so that mistakes that today surface after a whole
epoch (or never) stop the run at once, with one message naming the file or entry, the problem and
the fix:

* :func:`check_num_classes`: ``num_classes`` of every head against the classes of every dataset
  (and, for COCO files, the classes against the file's ``categories``);
* :func:`check_coco_annotations`: boxes with NaN/inf or negative size, polygons with fewer than
  3 points, annotations without ``segmentation`` when masks are trained or evaluated, category ids
  missing from ``categories``;
* :func:`check_seg_maps`: segmentation maps whose size differs from their image's, or with
  several channels (PNG headers only, nothing is decoded);
* :func:`check_model_channels`: necks' / decode heads' ``in_channels`` against the backbone's
  ``out_channels`` (the backbone is built on the ``meta`` device: no memory, no weights).

:func:`mmpola.runtime.data_checks.run_preflight` runs them (once, on rank 0) in tools/train.py and
tools/test.py.
"""
import json
import math
import os
import os.path as osp
import struct
from collections import Counter

from mmpola.errors import UserError

from .cli import is_url
from .data_checks import _SHOW_PATHS, _dataset_cfgs, _dataset_class, _defining_class, _seg_dataset_files

__all__ = ['check_num_classes', 'check_coco_annotations', 'checked_coco_categories', 'check_seg_maps',
           'check_model_channels', 'check_dataset_contents', 'load_coco_json', 'dataset_classes', 'head_num_classes',
           'png_header']

# parts of a model config whose num_classes is not the dataset's (RPN is class-agnostic)
_NOT_DATASET_CLASSES = ('rpn_head', 'train_cfg', 'test_cfg', 'data_preprocessor')


def _full(root, path):
    return path if osp.isabs(path) or not root else osp.join(root, path)


def _is_coco(dataset):
    owner = _defining_class(dataset.get('type'), 'parse_data_info')
    return owner == 'CocoDataset' or (owner is None and dataset.get('type') == 'CocoDataset')


def _is_seg(dataset):
    return _defining_class(dataset.get('type'), 'load_data_list') == 'BaseSegDataset'


def _local(dataset):
    """Whether the dataset reads local files (remote backends are left to the dataset)."""
    prefix = dataset.get('data_prefix') or {}
    return not (dataset.get('backend_args') or is_url(dataset.get('data_root'))
                or (isinstance(prefix, dict) and any(is_url(v) for v in prefix.values())))


def _shown(items, more_word='more'):
    items = list(items)
    shown = ', '.join(str(i) for i in items[:_SHOW_PATHS])
    return shown + (f' and {len(items) - _SHOW_PATHS} {more_word}' if len(items) > _SHOW_PATHS else '')


# ------------------------------------------------------------------------------------------------
# classes

def dataset_classes(dataset):
    """``(classes, where they come from)`` of a dataset config: its ``metainfo.classes``, else the
    dataset class's ``METAINFO`` (mmdet's CocoDataset: the 80 COCO classes); ``(None, '')`` when
    neither says."""
    metainfo = dataset.get('metainfo') or {}
    if isinstance(metainfo, dict) and metainfo.get('classes'):
        return tuple(metainfo['classes']), 'its metainfo'
    cls = _dataset_class(dataset.get('type'))
    classes = (getattr(cls, 'METAINFO', None) or {}).get('classes') if cls is not None else None
    if classes:
        return tuple(classes), f"{cls.__name__}'s default METAINFO (no metainfo=dict(classes=...) in the config)"
    return None, ''


def head_num_classes(model_cfg, where='model'):
    """``[(config path, num_classes)]`` of every head of a model config that predicts the dataset's
    classes (RPN heads, train/test settings and data preprocessors are left out)."""
    found = []
    if isinstance(model_cfg, dict):
        for key, value in model_cfg.items():
            if key in _NOT_DATASET_CLASSES:
                continue
            if key == 'num_classes' and isinstance(value, int) and not isinstance(value, bool):
                found.append((f'{where}.num_classes', value))
            else:
                found += head_num_classes(value, f'{where}.{key}')
    elif isinstance(model_cfg, (list, tuple)):
        for i, value in enumerate(model_cfg):
            found += head_num_classes(value, f'{where}.{i}')
    return found


def _coco_category_names(coco):
    return [c.get('name') for c in coco.get('categories') or [] if isinstance(c, dict)]


def check_num_classes(cfg, dataloader_keys, coco_categories=None):
    """Every head's ``num_classes`` must equal the number of classes of every dataset it trains or
    is evaluated on; for COCO files, every class must also be one of the file's categories.

    Today a Mask R-CNN with 80 classes on a 3-class set trains an epoch and crashes in the metric,
    and a RetinaNet with 2 on a 3-class set learns the third class as background, exit status 0.
    ``coco_categories`` maps annotation paths to their category names (to read each file once).
    """
    heads = head_num_classes(cfg.get('model') or {})
    for key in dataloader_keys:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for dataset in _dataset_cfgs(loader.get('dataset')):
            classes, source = dataset_classes(dataset)
            if classes is None:
                continue
            names = (coco_categories or {}).get(_coco_ann_path(dataset)) if _is_coco(dataset) else None
            if names is not None:
                _check_classes_in_file(key, dataset, classes, source, names)
            wrong = [(path, n) for path, n in heads if n != len(classes)]
            if wrong:
                listed = ', '.join(f'{path}={n}' for path, n in wrong)
                fix = ' '.join(f'{path}={len(classes)}' for path, _ in wrong)
                raise UserError(
                    f'{key}: the dataset has {len(classes)} classes {_class_list(classes)} (from {source}) but '
                    f'the model predicts another number: {listed}. Too many classes break the evaluation after '
                    'training; too few train the remaining classes as background (or fail on their labels). '
                    f'Fix: set num_classes={len(classes)} in every head, e.g. --cfg-options {fix}'
                    + ('' if source == 'its metainfo' else
                       f", or give the dataset its classes: metainfo=dict(classes=(...)) in {key}.dataset"))


def _class_list(classes):
    return '(' + ', '.join(repr(c) for c in classes[:8]) + (', ...)' if len(classes) > 8 else ')')


def _check_classes_in_file(key, dataset, classes, source, names):
    missing = [c for c in classes if c not in names]
    if not missing:
        return
    ann_file = _coco_ann_path(dataset)
    if len(missing) == len(classes):
        raise UserError(
            f'{key}: none of the dataset\'s {len(classes)} classes {_class_list(classes)} (from {source}) is a '
            f'category of {ann_file!r}, whose categories are {_class_list(names)}: every annotation would be '
            f'dropped. Fix: set {key}.dataset.metainfo=dict(classes={tuple(names)!r}) (the names must equal the '
            "categories' 'name' fields) and num_classes accordingly")
    raise UserError(
        f"{key}: {len(missing)} of the dataset's classes (from {source}) are not categories of {ann_file!r}: "
        f"{_shown(repr(m) for m in missing)}; mmdet would silently train without them and shift the labels "
        f"of the others. Its categories are {_class_list(names)}. Fix: spell the classes exactly as the "
        "categories' 'name' fields, or remove those classes (and adjust num_classes)")


# ------------------------------------------------------------------------------------------------
# COCO annotations

def _coco_ann_path(dataset):
    ann_file = dataset.get('ann_file') or ''
    return _full(dataset.get('data_root') or '', ann_file) if ann_file else None


def load_coco_json(path):
    """The parsed annotation file, with a clear error for one that is not COCO-format JSON."""
    try:
        with open(path, 'rb') as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f'annotation file {path!r} is not a COCO-format JSON file ({e}); replace it with '
                        'the original file') from e
    if not isinstance(data, dict):
        raise UserError(f'annotation file {path!r} is not a COCO-format JSON file (a JSON '
                        f'{type(data).__name__}, not an object with images/annotations/categories)')
    return data


def _needs_masks(cfg, key, dataset):
    """Whether masks of this dataset are trained or evaluated: ``LoadAnnotations(with_mask=True)``
    in its pipeline, or a ``segm`` metric in the loader's evaluator."""
    for step in dataset.get('pipeline') or []:
        if isinstance(step, dict) and str(step.get('type', '')).endswith('LoadAnnotations') and \
                step.get('with_mask'):
            return True
    evaluator = cfg.get(key.replace('_dataloader', '_evaluator')) if key.endswith('_dataloader') else None
    for metric in (evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]):
        if isinstance(metric, dict):
            names = metric.get('metric', [])
            if 'segm' in ([names] if isinstance(names, str) else list(names or [])):
                return True
    return False


def _bad_box(bbox):
    """What is wrong with a COCO ``bbox`` ([x, y, w, h]), or None."""
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or \
            not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox):
        return 'not 4 numbers'
    if not all(math.isfinite(v) for v in bbox):
        return 'NaN/inf'
    if bbox[2] < 0 or bbox[3] < 0:
        return 'negative width/height'
    return None


def _bad_segmentation(segm):
    """What is wrong with a COCO ``segmentation`` (polygons or RLE), or None."""
    if isinstance(segm, dict):
        return None if 'counts' in segm and 'size' in segm else 'an RLE without counts/size'
    if not isinstance(segm, list) or not segm:
        return 'missing'
    for poly in segm:
        if not isinstance(poly, list) or len(poly) % 2 or (poly and not isinstance(poly[0], (int, float))):
            return 'a polygon that is not a flat list of x, y numbers'
        if len(poly) < 6:
            return 'a polygon with fewer than 3 points'
    return None


_SEGM_FIX = {
    'missing': 'add their masks, or train boxes only (LoadAnnotations(with_mask=False), a detector '
               "without mask head, metric=['bbox'])",
    'a polygon with fewer than 3 points': 'delete those polygons (or annotations), or give them at least 3 points',
}


def check_coco_annotations(coco, ann_file, key='dataset', needs_masks=False):
    """Annotations of a parsed COCO file that pycocotools or the pipeline cannot use.

    Refused, listed by problem with annotation ids and image files: boxes with NaN/inf values or
    negative size (NaN losses; negative ones are dropped silently), polygons with fewer than 3
    points (evaluation crashes after the epoch), annotations without ``segmentation`` when masks
    are trained or evaluated, and category ids that ``categories`` does not define (dropped
    silently: counted per category). Zero-size boxes are left to mmdet, which drops them.
    """
    images = {img.get('id'): img.get('file_name') for img in coco.get('images') or [] if isinstance(img, dict)}
    cat_ids = {c.get('id') for c in coco.get('categories') or [] if isinstance(c, dict)}
    problems = {}  # description -> list of (annotation id, image file)
    unknown = Counter()
    for ann in coco.get('annotations') or []:
        if not isinstance(ann, dict):
            continue
        where = (ann.get('id'), images.get(ann.get('image_id'), f"image_id {ann.get('image_id')}"))
        if ann.get('category_id') not in cat_ids:
            unknown[ann.get('category_id')] += 1
        if ann.get('ignore', False):
            continue
        bad = _bad_box(ann.get('bbox'))
        if bad:
            problems.setdefault(f'bbox with {bad}' if bad != 'not 4 numbers' else 'bbox that is not 4 numbers',
                                []).append(where)
        if needs_masks:
            bad = _bad_segmentation(ann.get('segmentation'))
            if bad:
                problems.setdefault('no segmentation' if bad == 'missing' else f'segmentation with {bad}',
                                    []).append(where)
    lines = []
    for what, found in problems.items():
        ids = _shown(i for i, _ in found)
        files = _shown(dict.fromkeys(f for _, f in found))
        fix = _SEGM_FIX.get(what.replace('segmentation with ', '').replace('no segmentation', 'missing'),
                            'correct or delete these annotations')
        lines.append(f'  {len(found)} annotation(s) with {what}: ids {ids} (images {files}); fix: {fix}')
    if unknown:
        per_cat = ', '.join(f'category_id {c!r}: {n}' for c, n in sorted(unknown.items(), key=lambda kv: -kv[1]))
        lines.append(f"  {sum(unknown.values())} annotation(s) whose category_id is not in 'categories' "
                     f"(ids {_shown(sorted(c for c in cat_ids if c is not None))}), which mmdet drops silently: "
                     f"{per_cat}; fix: add those categories to 'categories' or correct the ids")
    if lines:
        raise UserError(f'{key}: {ann_file!r} has annotations the model cannot use:\n' + '\n'.join(lines))


# ------------------------------------------------------------------------------------------------
# segmentation maps

_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# PNG colour type -> (channels, name)
_PNG_COLOUR = {0: (1, 'grayscale'), 2: (3, 'RGB'), 3: (1, 'palette'), 4: (2, 'grayscale + alpha'),
               6: (4, 'RGBA')}


def png_header(path):
    """``(width, height, channels, colour name)`` from a PNG's IHDR chunk (nothing decoded), or None
    when the file is no PNG."""
    with open(path, 'rb') as f:
        head = f.read(29)
    if len(head) < 29 or not head.startswith(_PNG_SIGNATURE) or head[12:16] != b'IHDR':
        return None
    width, height, _, colour = struct.unpack('>IIBB', head[16:26])
    channels, name = _PNG_COLOUR.get(colour, (None, f'colour type {colour}'))
    return width, height, channels, name


def _image_header(path):
    """``(width, height, channels, mode, transposed)`` of any image from its header (PIL opens
    lazily); ``transposed``: an EXIF orientation that decoders apply by swapping width and height."""
    header = png_header(path)
    if header is not None:
        return header + (False,)
    from PIL import Image
    try:
        with Image.open(path) as img:
            orientation = img.getexif().get(0x0112, 1) if img.format in ('JPEG', 'TIFF', 'WEBP') else 1
            return img.width, img.height, len(img.getbands()), img.mode, orientation in (5, 6, 7, 8)
    except Exception:  # unreadable: decoding errors are the pipeline's to report, naming the file
        return None


def check_seg_maps(images, seg_maps, key='dataset', root=''):
    """Each segmentation map must have its image's size and one channel (a class index per pixel).

    Today a map of another size or an RGB map trains and then crashes the evaluation with an
    ``IndexError`` that names no file. Reads only the headers (PNG IHDR; PIL's lazy open for
    images).
    """
    wrong_size, coloured = [], []
    for image, seg_map in zip(images, seg_maps):
        seg = _image_header(seg_map)
        if seg is None:
            continue
        if seg[2] is not None and seg[2] > 1:
            coloured.append(f'{_rel(seg_map, root)}: {seg[2]} channels ({seg[3]})')
        img = _image_header(image)
        if img is not None and img[:2] != seg[:2] and not (img[4] and img[1::-1] == seg[:2]):
            wrong_size.append(f'{_rel(seg_map, root)}: {seg[0]}x{seg[1]}, its image {_rel(image, root)}: '
                              f'{img[0]}x{img[1]}')
    lines = []
    if wrong_size:
        lines.append(f'{len(wrong_size)} of {len(seg_maps)} segmentation maps differ in size (width x height) from '
                     f'their image:' + _indented(wrong_size) +
                     '\nFix: give each map the size of its image (resize with nearest-neighbour interpolation, '
                     'or correct which map belongs to which image)')
    if coloured:
        lines.append(f'{len(coloured)} of {len(seg_maps)} segmentation maps have several channels; a map holds one '
                     'class index per pixel:' + _indented(coloured) +
                     "\nFix: save them as single-channel PNGs (mode 'L' or 'P') of class indices; convert "
                     'colour-coded maps with the palette of the dataset')
    if lines:
        raise UserError(f'{key}: ' + '\n'.join(lines))


def _rel(path, root):
    return osp.relpath(path, root) if root and path.startswith(root) else path


def _indented(items):
    shown = ''.join(f'\n  {item}' for item in items[:_SHOW_PATHS])
    return shown + (f'\n  ... and {len(items) - _SHOW_PATHS} more' if len(items) > _SHOW_PATHS else '')


# ------------------------------------------------------------------------------------------------
# everything a dataset holds

def _cache_file(path, needs_masks):
    """Where the verdict on a COCO annotation file is kept: the file's path, size and modification
    time name it, so an edited file is checked again. ``MMPOLA_CACHE_DIR`` overrides the folder."""
    import hashlib
    stat = os.stat(path)
    key = f'{osp.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{bool(needs_masks)}|1'
    folder = os.environ.get('MMPOLA_CACHE_DIR') or osp.join(osp.expanduser('~'), '.cache', 'mmpola')
    return osp.join(folder, 'preflight', hashlib.sha1(key.encode()).hexdigest() + '.json')


def checked_coco_categories(path, key='dataset', needs_masks=False):
    """Category names of a COCO annotation file whose annotations pass
    :func:`check_coco_annotations`. A file that passed once is not parsed again while it is
    unchanged (COCO train2017's ~450 MB take most of a minute to parse): the verdict is cached."""
    cache = _cache_file(path, needs_masks)
    try:
        with open(cache) as f:
            return json.load(f)['categories']
    except (OSError, ValueError, KeyError, TypeError):
        pass
    coco = load_coco_json(path)
    check_coco_annotations(coco, path, key, needs_masks)
    names = _coco_category_names(coco)
    try:  # a read-only home only costs the next run the parse
        os.makedirs(osp.dirname(cache), exist_ok=True)
        tmp = f'{cache}.{os.getpid()}.tmp'
        with open(tmp, 'w') as f:
            json.dump(dict(file=osp.abspath(path), categories=names), f)
        os.replace(tmp, cache)
    except OSError:
        pass
    return names


def check_dataset_contents(cfg, dataloader_keys):
    """The content checks of every (leaf) dataset of ``dataloader_keys``: COCO annotations, class
    names against the file's categories, segmentation maps, and ``num_classes`` of the heads.
    Each annotation file is parsed at most once (and not again while it is unchanged)."""
    categories = {}
    for key in dataloader_keys:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for dataset in _dataset_cfgs(loader.get('dataset')):
            if not _local(dataset):
                continue
            if _is_coco(dataset):
                path = _coco_ann_path(dataset)
                if not path or not osp.isfile(path):
                    continue
                masks = _needs_masks(cfg, key, dataset)
                if (path, masks) not in categories:
                    categories[path, masks] = checked_coco_categories(path, key, masks)
                categories[path] = categories[path, masks]
            elif _is_seg(dataset):
                root = dataset.get('data_root') or ''
                images, seg_maps = _seg_dataset_files(dataset, root)
                if seg_maps:
                    check_seg_maps(images, seg_maps, key, root)
    check_num_classes(cfg, dataloader_keys, categories)


# ------------------------------------------------------------------------------------------------
# the model's channels

def _backbone_out_channels(backbone_cfg):
    """``out_channels`` of the backbone a config builds (on the meta device: nothing allocated),
    or None when it cannot be built here or does not say."""
    import torch
    from mmengine.registry import MODELS
    try:
        with torch.device('meta'), MODELS.switch_scope_and_registry(None) as registry:
            backbone = registry.build(backbone_cfg)
        channels = getattr(backbone, 'out_channels', None)
    except Exception:  # any problem building it is the Runner's to report (with its own message)
        return None
    if isinstance(channels, int):
        return [channels]
    if isinstance(channels, (list, tuple)) and all(isinstance(c, int) for c in channels):
        return list(channels)
    return None


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_model_channels(cfg):
    """A neck's (or, without a neck, each decode / auxiliary head's) ``in_channels`` must be the
    channels the backbone returns; today a mismatch is a bare AssertionError at the first forward."""
    model = cfg.get('model') or {}
    while isinstance(model, dict) and 'backbone' not in model and isinstance(model.get('module'), dict):
        model = model['module']  # test-time augmentation wrapper
    if not isinstance(model, dict) or not isinstance(model.get('backbone'), dict):
        return
    consumers = []
    neck = model.get('neck')
    for i, item in enumerate(_as_list(neck)[:1] if neck else []):  # the first neck reads the backbone
        if isinstance(item, dict) and 'in_channels' in item:
            where = 'model.neck' if not isinstance(neck, (list, tuple)) else f'model.neck.{i}'
            consumers.append((where, item, None))
    if not neck:
        for name in ('decode_head', 'auxiliary_head'):
            heads = model.get(name)
            for i, head in enumerate(_as_list(heads) if heads else []):
                if isinstance(head, dict) and 'in_channels' in head:
                    where = f'model.{name}' if not isinstance(heads, (list, tuple)) else f'model.{name}.{i}'
                    consumers.append((where, head, head.get('in_index', -1)))
    if not consumers:
        return
    out = _backbone_out_channels(model['backbone'])
    if out is None:
        return
    backbone = f"model.backbone ({model['backbone'].get('type')}, out_indices " \
               f"{tuple(model['backbone'].get('out_indices', range(len(out))))})"
    for where, item, in_index in consumers:
        given = item['in_channels']
        if in_index is None:
            expected = out
        else:
            try:
                expected = [out[i] for i in _as_list(in_index)]
            except IndexError:
                raise UserError(f'{where}.in_index={in_index!r} selects a backbone output that does not exist: '
                                f'{backbone} returns {len(out)} maps') from None
            if not isinstance(in_index, (list, tuple)):
                expected = expected[0]
        if _as_list(given) != _as_list(expected):
            raise UserError(
                f'{where}.in_channels={given!r} does not match the channels of the maps {backbone} returns'
                f'{"" if in_index is None else f" at in_index {in_index!r}"}: {expected!r}. '
                f'Fix: --cfg-options {where}.in_channels={str(expected).replace(" ", "")}')
