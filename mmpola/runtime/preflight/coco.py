"""COCO annotation files: what pycocotools or the pipeline cannot use, and classes vs categories.

* :func:`check_has_annotations`: a file without ``annotations`` (nothing to train on; a whole run
  evaluated to -1.000);
* :func:`check_coco_annotations`: image ids or annotation ids used twice, boxes with NaN/inf or
  negative size, polygons with fewer than 3 points, annotations without ``segmentation`` when masks
  are trained or evaluated, category ids missing from ``categories``;
* :func:`check_trainable_annotations`: a training file whose annotations are all crowd regions
  (ignored by the losses), boxes that do not match their own polygons (x1,y1,x2,y2 written as COCO's
  x,y,width,height);
* :func:`check_metric_file`: a metric's own ``ann_file`` must list the images the dataset reads;
* :func:`check_image_sizes`: the ``width`` / ``height`` the file gives each image against the image
  as the pipeline decodes it (EXIF orientation applied), from the image headers;
* :func:`check_classes_in_file`: the dataset's classes must be categories of the file;
* :func:`checked_coco_categories`: all of them for one file, whose verdict is cached while it is
  unchanged.
"""
import hashlib
import json
import math
import os
import os.path as osp
from collections import Counter

from mmpola.errors import UserError

from .datasets import coco_ann_path, coco_images, listing, shown
from .image_headers import image_header

__all__ = ['load_coco_json', 'check_has_annotations', 'check_coco_annotations', 'check_trainable_annotations',
           'check_metric_file', 'check_image_sizes', 'check_classes_in_file', 'checked_coco_categories',
           'uses_masks', 'is_evaluated', 'class_list']


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


def _evaluators(cfg, key):
    """The metric configs of the evaluator that goes with dataloader ``key`` (``val_dataloader`` ->
    ``val_evaluator``); none for the training loader or a run without that loop."""
    if not key.endswith('_dataloader') or key.startswith('train'):
        return []
    if key.startswith('val') and cfg.get('val_cfg') is None:
        return []
    evaluator = cfg.get(key.replace('_dataloader', '_evaluator'))
    if isinstance(evaluator, dict) and 'metrics' in evaluator and 'type' not in evaluator:
        evaluator = evaluator['metrics']
    return [m for m in (evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]) if isinstance(m, dict)]


def is_evaluated(cfg, key):
    """``[ann_file or None]`` of every COCO metric that scores loader ``key``'s predictions against
    ground truth (``format_only`` metrics only write results); None: the file is scored by no metric."""
    files = [m.get('ann_file') for m in _evaluators(cfg, key)
             if str(m.get('type', '')).split('.')[-1] == 'CocoMetric' and not m.get('format_only')]
    return files or None


def check_has_annotations(coco, ann_file, key='dataset', evaluated=False):
    """A training file must have annotations; so must a file a COCO metric scores against.

    Without them a training run stops with a bare error from inside mmengine, and a validation
    file gives a whole training run followed by -1.000 for every metric."""
    anns = coco.get('annotations')
    if isinstance(anns, list) and anns:
        return
    what = f"has no 'annotations' list (its keys: {', '.join(sorted(coco)) or 'none'})" if anns is None else \
        ("has an empty 'annotations' list" if isinstance(anns, list) else "has an 'annotations' entry that is no list")
    if key.startswith('train'):
        raise UserError(
            f'{key}: {ann_file!r} {what}: there is nothing to train on. Fix: use the annotation file with the '
            "objects (e.g. instances_train2017.json, not an image_info_*.json list of images), or add them")
    if evaluated:
        loop = 'val' if key.startswith('val') else 'test'
        fix = ('train without validation (--cfg-options val_cfg=None val_dataloader=None val_evaluator=None)'
               if loop == 'val' else
               f'to only predict on images without annotations, write the results instead of scoring them: '
               f'--cfg-options {loop}_evaluator.format_only=True {loop}_evaluator.outfile_prefix=DIR/results')
        raise UserError(
            f"{key}: {ann_file!r} {what}, so the COCO metric has no ground truth and would report -1.000 for every "
            f'number (after the whole run). Fix: evaluate on the annotation file with the objects, or {fix}')


def check_image_sizes(coco, ann_file, img_dir, key='dataset', applies_orientation=True, fix_option=None):
    """The ``width`` / ``height`` the file gives each image must be the size the pipeline decodes.

    A JPEG whose EXIF orientation rotates it by 90 degrees is decoded with width and height swapped
    (mmcv applies the orientation, as browsers do); boxes drawn on the stored pixels then lie on
    the wrong objects: a box-only detector trains silently, Mask R-CNN stops with a bare error.
    Reads every image's header once (no pixel is decoded); images without both numbers are left out.
    ``fix_option``: the config path of the pipeline's ``LoadImageFromFile``, for the fix.
    """
    wrong, rotated = [], 0
    images = [img for img in coco.get('images') or [] if isinstance(img, dict)]
    for img in images:
        size = (img.get('width'), img.get('height'))
        name = img.get('file_name')
        if not isinstance(name, str) or not all(isinstance(v, int) and not isinstance(v, bool) for v in size):
            continue
        header = image_header(osp.join(img_dir, name))
        if header is None:
            continue
        decoded = header.decoded_size(applies_orientation)
        if decoded == size:
            continue
        text = f"{name}: {size[0]}x{size[1]} in the file, decoded {decoded[0]}x{decoded[1]}"
        if applies_orientation and header.transposed and (header.width, header.height) == size:
            rotated += 1
            text += f' (EXIF orientation {header.orientation}: the decoder turns it by 90 degrees)'
        wrong.append(text)
    if not wrong:
        return
    if rotated:
        option = (f' --cfg-options {fix_option}.color_type=color_ignore_orientation' if fix_option else '')
        fix = ('the boxes were drawn on the stored (unrotated) pixels: load these images without turning them, '
               f"LoadImageFromFile(color_type='color_ignore_orientation') in every pipeline of this data"
               f'{" (e.g." + option + ")" if option else ""}; or turn the pixels and the annotations '
               'together and remove the EXIF orientation tag; or, if the annotations were made on the turned '
               'images, correct width/height in the file')
    else:
        fix = (f'correct width/height of these images in {ann_file!r} (or the images: the annotations were made '
               'on images of the size the file says)')
    raise UserError(
        f'{key}: {len(wrong)} of {len(images)} images of {ann_file!r} are not the size the file says (width x '
        f'height), so their boxes and masks would not lie on the objects:{listing(wrong)}\nFix: {fix}')


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


def _duplicate_ids(coco):
    """Lines naming the image ids and annotation ids that several entries share."""
    lines = []
    by_id = {}
    for img in coco.get('images') or []:
        if isinstance(img, dict):
            by_id.setdefault(img.get('id'), []).append(img.get('file_name'))
    shared = {i: names for i, names in by_id.items() if len(names) > 1}
    if shared:
        listed = shown(f"id {i!r}: {', '.join(str(n) for n in names)}" for i, names in shared.items())
        lines.append(f'  {len(shared)} image id(s) used by several images ({listed}), which mmdet merges into one '
                     'image with the boxes of all (the other images silently disappear); fix: give every image its '
                     "own id, and each annotation the image_id of its image")
    counts = Counter(ann.get('id') for ann in coco.get('annotations') or [] if isinstance(ann, dict))
    twice = [(i, n) for i, n in counts.items() if n > 1]
    if twice:
        lines.append(f'  {len(twice)} annotation id(s) used by several annotations (ids '
                     f'{shown(f"{i!r} ({n}x)" for i, n in twice)}), of which pycocotools keeps one per id (the others '
                     'are lost, the kept one counted for each); fix: give every annotation its own id')
    return lines


def check_coco_annotations(coco, ann_file, key='dataset', needs_masks=False):
    """Annotations of a parsed COCO file that pycocotools or the pipeline cannot use.

    Refused, listed by problem with annotation ids and image files: image ids or annotation ids used
    more than once (pycocotools keeps one entry per id: an image silently disappears and the other
    gets its boxes; an annotation is lost and another counted twice), boxes with NaN/inf values or
    negative size (NaN losses; negative ones are dropped silently), polygons with fewer than 3
    points (evaluation crashes after the epoch), annotations without ``segmentation`` when masks
    are trained or evaluated, RLE masks (crowd regions) whose ``size`` is not their image's, and
    category ids that ``categories`` does not define (dropped silently: counted per category). Zero-size
    boxes are left to mmdet, which drops them.
    """
    images = {img.get('id'): img.get('file_name') for img in coco.get('images') or [] if isinstance(img, dict)}
    sizes = {img.get('id'): [img.get('height'), img.get('width')] for img in coco.get('images') or []
             if isinstance(img, dict)}
    rle_sizes = []  # (annotation id, image file, RLE size, image size) of RLE masks of another size
    cat_ids = {c.get('id') for c in coco.get('categories') or [] if isinstance(c, dict)}
    problems = {}  # description -> list of (annotation id, image file)
    unknown = Counter()
    lines = _duplicate_ids(coco)
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
            segm, size = ann.get('segmentation'), sizes.get(ann.get('image_id'))
            if not bad and isinstance(segm, dict) and size and None not in size and list(segm['size']) != size:
                rle_sizes.append(where + (list(segm['size']), size))
    for what, found in problems.items():
        ids = shown(i for i, _ in found)
        files = shown(dict.fromkeys(f for _, f in found))
        fix = _SEGM_FIX.get(what.replace('segmentation with ', '').replace('no segmentation', 'missing'),
                            'correct or delete these annotations')
        lines.append(f'  {len(found)} annotation(s) with {what}: ids {ids} (images {files}); fix: {fix}')
    if rle_sizes:
        ann_id, name, rle, size = rle_sizes[0]
        lines.append(f'  {len(rle_sizes)} annotation(s) with an RLE mask whose size is not its image\'s: ids '
                     f'{shown(i for i, *_ in rle_sizes)} (images {shown(dict.fromkeys(f for _, f, *_ in rle_sizes))}), '
                     f'e.g. id {ann_id!r} ({name}): RLE size {rle} (height, width), the image {size} in \'images\' '
                     '(mmdet\'s LoadAnnotations would stop at that image with a ValueError naming no file); fix: '
                     'encode each RLE at its image\'s size (pycocotools.mask.encode of a '
                     'height x width mask), or correct the image\'s width/height if those are wrong')
    if unknown:
        per_cat = ', '.join(f'category_id {c!r}: {n}' for c, n in sorted(unknown.items(), key=lambda kv: -kv[1]))
        lines.append(f"  {sum(unknown.values())} annotation(s) whose category_id is not in 'categories' "
                     f"(ids {shown(sorted(c for c in cat_ids if c is not None))}), which mmdet drops silently: "
                     f"{per_cat}; fix: add those categories to 'categories' or correct the ids")
    if lines:
        raise UserError(f'{key}: {ann_file!r} has annotations the model cannot use:\n' + '\n'.join(lines))


def _polygon_bounds(segm):
    """``(x0, y0, x1, y1)`` of the points of COCO polygons, or None (RLE, malformed)."""
    if not isinstance(segm, list) or not segm:
        return None
    xs, ys = [], []
    for poly in segm:
        if not isinstance(poly, list) or len(poly) < 6 or len(poly) % 2 or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in poly):
            return None
        xs += poly[0::2]
        ys += poly[1::2]
    return min(xs), min(ys), max(xs), max(ys)


def _inside_image(bounds, size):
    """Polygon bounds clipped to the image (``size``: (width, height) of the file's image record, when
    numbers): a box lies inside its image, a polygon may reach past its edge."""
    if bounds is None or not size or not all(isinstance(v, (int, float)) and v > 0 for v in size):
        return bounds
    width, height = size
    x0, y0, x1, y1 = bounds
    return min(max(x0, 0), width), min(max(y0, 0), height), min(max(x1, 0), width), min(max(y1, 0), height)


def _box_off_polygon(bbox, bounds):
    """Whether a COCO box ([x, y, w, h]) misses its polygon's bounds by more than rounding: each edge
    must lie within 2 px (or a tenth of the object's size) of the polygon's."""
    x, y, w, h = bbox
    x0, y0, x1, y1 = bounds
    tol_x, tol_y = max(2.0, 0.1 * (x1 - x0)), max(2.0, 0.1 * (y1 - y0))
    return abs(x - x0) > tol_x or abs(x + w - x1) > tol_x or abs(y - y0) > tol_y or abs(y + h - y1) > tol_y


def check_trainable_annotations(coco, ann_file, key='dataset'):
    """Annotations that are well-formed but cannot teach what they should.

    * every annotation of a training file ``iscrowd=1``: mmdet ignores crowd regions in the losses, so
      the box and mask losses stay 0 for the whole run (training file only);
    * a ``bbox`` that does not match the bounds of its own polygons (e.g. ``[x1, y1, x2, y2]`` where
      COCO has ``[x, y, width, height]``): the boxes are trained and scored on other pixels than the
      masks. Refused when more than 1% of the annotations with polygons are off (a few sloppy boxes
      of a large set are annotation noise); those with RLE masks or without polygons are left out.
    """
    anns = [a for a in coco.get('annotations') or [] if isinstance(a, dict) and not a.get('ignore', False)]
    images = {img.get('id'): img.get('file_name') for img in coco.get('images') or [] if isinstance(img, dict)}
    sizes = {img.get('id'): (img.get('width'), img.get('height')) for img in coco.get('images') or []
             if isinstance(img, dict)}
    if key.startswith('train') and anns and all(a.get('iscrowd') for a in anns):
        raise UserError(
            f'{key}: all {len(anns)} annotations of {ann_file!r} have iscrowd=1 (e.g. annotation id '
            f"{anns[0].get('id')!r}), which mmdet treats as regions to ignore: the box and mask losses would be 0 "
            'for the whole run. Fix: set iscrowd=0 for the objects to learn (iscrowd=1 only marks crowds)')
    off, compared = [], 0
    for ann in anns:
        bounds = _inside_image(_polygon_bounds(ann.get('segmentation')), sizes.get(ann.get('image_id')))
        if bounds is not None and _bad_box(ann.get('bbox')) is None:
            compared += 1
            if _box_off_polygon(ann['bbox'], bounds):
                off.append((ann, bounds))
    if len(off) <= compared // 100:  # a few sloppy boxes in a large set are left to the training
        return
    ann, (x0, y0, x1, y1) = off[0]
    x, y, w, h = ann['bbox']
    image = images.get(ann.get('image_id'), f"image_id {ann.get('image_id')}")
    corner_like = sum(abs(a['bbox'][2] - b[2]) <= max(2.0, 0.1 * (b[2] - b[0])) and
                      abs(a['bbox'][3] - b[3]) <= max(2.0, 0.1 * (b[3] - b[1])) for a, b in off)
    looks = (' They look like x1,y1,x2,y2 corners; COCO boxes are [x, y, width, height].'
             if corner_like * 2 > len(off) else '')
    raise UserError(
        f"{key}: {len(off)} of the {compared} annotations with polygons of {ann_file!r} have a bbox that does not "
        f"match their own polygon, e.g. annotation id {ann.get('id')!r} ({image}): "
        f'bbox {ann["bbox"]} spans x {x:g}..{x + w:g}, y {y:g}..{y + h:g}, its polygon x {x0:g}..{x1:g}, '
        f'y {y0:g}..{y1:g}.{looks} Fix: write each bbox as [x, y, width, height] of its object (e.g. from the '
        'polygon: [min x, min y, max x - min x, max y - min y])')


def check_metric_file(metric_file, dataset_file, metric_key, dataset_key):
    """A COCO metric with an ``ann_file`` of its own scores each prediction against the ground truth
    of that file's image with the prediction's image id, and counts every image of the file: the
    file must list exactly the images (ids and file names) of the dataset's annotation file.
    Otherwise (e.g. the training file named in the test evaluator) the predictions are scored against
    other images' objects and the run ends with a wrong mAP."""
    ours = {img.get('id'): img.get('file_name') for img in coco_images(dataset_file)}
    theirs = {img.get('id'): img.get('file_name') for img in coco_images(metric_file)}
    if ours == theirs:
        return
    absent = [i for i in ours if i not in theirs]
    other = [i for i in ours if i in theirs and theirs[i] != ours[i]]
    extra = [i for i in theirs if i not in ours]
    found = []
    if other:
        i = other[0]
        found.append(f'{len(other)} image id(s) name another file there (e.g. id {i!r}: {theirs[i]!r} there, '
                     f'{ours[i]!r} in the dataset)')
    if absent:
        found.append(f'{len(absent)} of the dataset\'s {len(ours)} images are not in it (e.g. id {absent[0]!r}: '
                     f'{ours[absent[0]]!r})')
    if extra:
        found.append(f'it has {len(extra)} image(s) the dataset does not read (e.g. id {extra[0]!r}: '
                     f'{theirs[extra[0]]!r}), counted as missed')
    raise UserError(
        f"{metric_key}.ann_file {metric_file!r} is not the annotation file of the images {dataset_key} reads "
        f"({dataset_file!r}): {'; '.join(found)}; the COCO metric would score the predictions against other "
        f'images\' ground truth. Fix: --cfg-options {metric_key}.ann_file={dataset_file} (the dataset\'s file)')


def _cache_file(path, settings):
    """Where the verdict on a COCO annotation file is kept: the file's path, size and modification
    time and the settings it was checked with name it, so an edited file is checked again.
    ``MMPOLA_CACHE_DIR`` overrides the folder."""
    stat = os.stat(path)
    key = f'{osp.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{json.dumps(settings, sort_keys=True)}|3'
    folder = os.environ.get('MMPOLA_CACHE_DIR') or osp.join(osp.expanduser('~'), '.cache', 'mmpola')
    return osp.join(folder, 'preflight', hashlib.sha1(key.encode()).hexdigest() + '.json')


def checked_coco_categories(path, key='dataset', needs_masks=False, img_dir=None, applies_orientation=True,
                            evaluated=False, load_option=None):
    """Category names of a COCO annotation file that passes the checks of this module:
    :func:`check_has_annotations` (``evaluated``: a COCO metric scores against it),
    :func:`check_coco_annotations`, :func:`check_trainable_annotations` and, with ``img_dir`` (where its images are),
    :func:`check_image_sizes` (``load_option``: the config path of the pipeline's image loading, for
    the fix). A file that passed once is not parsed again while it is unchanged (COCO train2017's
    ~450 MB take tens of seconds to parse, its 118k image headers about ten): the verdict is cached.
    """
    settings = dict(masks=bool(needs_masks), img_dir=osp.abspath(img_dir) if img_dir else None,
                    orientation=bool(applies_orientation), evaluated=bool(evaluated), train=key.startswith('train'))
    cache = _cache_file(path, settings)
    try:
        with open(cache) as f:
            return json.load(f)['categories']
    except (OSError, ValueError, KeyError, TypeError):
        pass
    coco = load_coco_json(path)
    check_has_annotations(coco, path, key, evaluated)
    check_coco_annotations(coco, path, key, needs_masks)
    check_trainable_annotations(coco, path, key)
    if img_dir:
        check_image_sizes(coco, path, img_dir, key, applies_orientation, load_option)
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
