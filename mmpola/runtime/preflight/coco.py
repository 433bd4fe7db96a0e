"""COCO annotation files: what pycocotools or the pipeline cannot use, and classes vs categories.

* :func:`check_coco_annotations`: boxes with NaN/inf or negative size, polygons with fewer than
  3 points, annotations without ``segmentation`` when masks are trained or evaluated, category ids
  missing from ``categories``;
* :func:`check_classes_in_file`: the dataset's classes must be categories of the file;
* :func:`checked_coco_categories`: both for one file, whose verdict is cached while it is unchanged.
"""
import hashlib
import json
import math
import os
import os.path as osp
from collections import Counter

from mmpola.errors import UserError

from .datasets import coco_ann_path, shown

__all__ = ['load_coco_json', 'check_coco_annotations', 'check_classes_in_file', 'checked_coco_categories',
           'uses_masks', 'class_list']


def coco_category_names(coco):
    return [c.get('name') for c in coco.get('categories') or [] if isinstance(c, dict)]


def class_list(classes):
    return '(' + ', '.join(repr(c) for c in classes[:8]) + (', ...)' if len(classes) > 8 else ')')


def check_classes_in_file(key, dataset, classes, source, names):
    missing = [c for c in classes if c not in names]
    if not missing:
        return
    ann_file = coco_ann_path(dataset)
    if len(missing) == len(classes):
        raise UserError(
            f'{key}: none of the dataset\'s {len(classes)} classes {class_list(classes)} (from {source}) is a '
            f'category of {ann_file!r}, whose categories are {class_list(names)}: every annotation would be '
            f'dropped. Fix: set {key}.dataset.metainfo=dict(classes={tuple(names)!r}) (the names must equal the '
            "categories' 'name' fields) and num_classes accordingly")
    raise UserError(
        f"{key}: {len(missing)} of the dataset's classes (from {source}) are not categories of {ann_file!r}: "
        f"{shown(repr(m) for m in missing)}; mmdet would silently train without them and shift the labels "
        f"of the others. Its categories are {class_list(names)}. Fix: spell the classes exactly as the "
        "categories' 'name' fields, or remove those classes (and adjust num_classes)")


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


def uses_masks(cfg, key, dataset):
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
        ids = shown(i for i, _ in found)
        files = shown(dict.fromkeys(f for _, f in found))
        fix = _SEGM_FIX.get(what.replace('segmentation with ', '').replace('no segmentation', 'missing'),
                            'correct or delete these annotations')
        lines.append(f'  {len(found)} annotation(s) with {what}: ids {ids} (images {files}); fix: {fix}')
    if unknown:
        per_cat = ', '.join(f'category_id {c!r}: {n}' for c, n in sorted(unknown.items(), key=lambda kv: -kv[1]))
        lines.append(f"  {sum(unknown.values())} annotation(s) whose category_id is not in 'categories' "
                     f"(ids {shown(sorted(c for c in cat_ids if c is not None))}), which mmdet drops silently: "
                     f"{per_cat}; fix: add those categories to 'categories' or correct the ids")
    if lines:
        raise UserError(f'{key}: {ann_file!r} has annotations the model cannot use:\n' + '\n'.join(lines))


def _cache_file(path, needs_masks):
    """Where the verdict on a COCO annotation file is kept: the file's path, size and modification
    time name it, so an edited file is checked again. ``MMPOLA_CACHE_DIR`` overrides the folder."""
    stat = os.stat(path)
    key = f'{osp.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{bool(needs_masks)}|1'
    folder = os.environ.get('MMPOLA_CACHE_DIR') or osp.join(osp.expanduser('~'), '.cache', 'mmpola')
    return osp.join(folder, 'preflight', hashlib.sha1(key.encode()).hexdigest() + '.json')


def checked_coco_categories(path, key='dataset', needs_masks=False):
    """Category names of a COCO annotation file whose annotations pass
    :func:`check_coco_annotations`. A file that passed once is not parsed again while it is
    unchanged (COCO train2017's ~450 MB take tens of seconds to parse): the verdict is cached."""
    cache = _cache_file(path, needs_masks)
    try:
        with open(cache) as f:
            return json.load(f)['categories']
    except (OSError, ValueError, KeyError, TypeError):
        pass
    coco = load_coco_json(path)
    check_coco_annotations(coco, path, key, needs_masks)
    names = coco_category_names(coco)
    try:  # a read-only home only costs the next run the parse
        os.makedirs(osp.dirname(cache), exist_ok=True)
        tmp = f'{cache}.{os.getpid()}.tmp'
        with open(tmp, 'w') as f:
            json.dump(dict(file=osp.abspath(path), categories=names), f)
        os.replace(tmp, cache)
    except OSError:
        pass
    return names
