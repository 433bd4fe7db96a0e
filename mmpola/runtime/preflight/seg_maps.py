"""Segmentation maps against their images and against the dataset's label convention.

* same size as the image (EXIF orientation applied as the decoder does), one channel: every map,
  from the headers only;
* ``reduce_zero_label``: the label values of a sample of maps (decoded in the same open) against
  the dataset's classes and the setting, and the setting of ``LoadAnnotations`` against the
  dataset's.
"""
import os.path as osp

import numpy as np

from mmpola.errors import UserError

from .datasets import listing
from .image_headers import image_header

__all__ = ['blank_maps_problem', 'check_seg_maps', 'check_zero_label_setting', 'label_convention_problem',
           'SAMPLED_MAPS']

# how many maps (evenly spread over the dataset) are decoded to learn the label convention
SAMPLED_MAPS = 64


def _sampled(count, limit=SAMPLED_MAPS):
    if count <= limit:
        return set(range(count))
    return {round(i * (count - 1) / (limit - 1)) for i in range(limit)}


def check_seg_maps(images, seg_maps, key='dataset', root='', reduce_zero_label=None, classes=None, fix=''):
    """Each segmentation map must have its image's size and one channel (a class index per pixel);
    with ``reduce_zero_label`` and ``classes`` given, the label values of a sample of maps must fit
    that setting (:func:`label_convention_problem`; ``fix`` names the options that change it).

    Without it a map of another size or an RGB map trains and then crashes the evaluation with an
    ``IndexError`` that names no file; 0-based maps read with ``reduce_zero_label=True`` train and
    evaluate silently with every class shifted by one. Reads the headers of every map and image
    (PNG IHDR; PIL's lazy open) and decodes :data:`SAMPLED_MAPS` maps, each in the same open.
    """
    wrong_size, coloured = [], []
    sample = _sampled(len(seg_maps)) if reduce_zero_label is not None and classes else set()
    counts = []  # (map, value counts) of the decoded sample
    for i, (image, seg_map) in enumerate(zip(images, seg_maps)):
        if i in sample:
            seg, pixels = image_header(seg_map, pixels=True)
            if pixels is not None and pixels.ndim == 2:
                # values as mmseg keeps them (uint8); maps of another depth are the pipeline's to judge
                counts.append((seg_map, np.bincount(pixels.ravel().astype(np.uint8), minlength=256)))
        else:
            seg = image_header(seg_map)
        if seg is None:
            continue
        if seg.channels is not None and seg.channels > 1:
            coloured.append(f'{_rel(seg_map, root)}: {seg.channels} channels ({seg.mode})')
        img = image_header(image)
        if img is not None and img.decoded_size() != seg.decoded_size(False) \
                and (img.width, img.height) != seg.decoded_size(False):
            wrong_size.append(f'{_rel(seg_map, root)}: {seg.width}x{seg.height}, its image {_rel(image, root)}: '
                              f'{img.width}x{img.height}')
    lines = []
    if wrong_size:
        lines.append(f'{len(wrong_size)} of {len(seg_maps)} segmentation maps differ in size (width x height) from '
                     f'their image:' + listing(wrong_size) +
                     '\nFix: give each map the size of its image (resize with nearest-neighbour interpolation, '
                     'or correct which map belongs to which image)')
    if coloured:
        lines.append(f'{len(coloured)} of {len(seg_maps)} segmentation maps have several channels; a map holds one '
                     'class index per pixel:' + listing(coloured) +
                     "\nFix: save them as single-channel PNGs (mode 'L' or 'P') of class indices; convert "
                     'colour-coded maps with the palette of the dataset')
    if lines:
        raise UserError(f'{key}: ' + '\n'.join(lines))
    if counts:
        blank = blank_maps_problem(counts, reduce_zero_label)
        if blank:
            where = osp.dirname(_rel(seg_maps[0], root)) or '.'
            raise UserError(f'{key}: the segmentation maps under {where!r} {blank}')
        problem = label_convention_problem(counts, reduce_zero_label, classes)
        if problem:
            where = osp.dirname(_rel(seg_maps[0], root)) or '.'
            raise UserError(f'{key}: the segmentation maps under {where!r} {problem} {fix}'.rstrip())


def blank_maps_problem(counts, reduce_zero_label):
    """With ``reduce_zero_label=True``: every sampled map holds only 0 (and 255), which that setting ignores,
    so no pixel would be trained; the maps lost their labels (not another label convention, which
    ``reduce_zero_label=False`` would fix: then every pixel would be class 0). The message, or None."""
    if not reduce_zero_label:
        return None
    total = sum(c for _, c in counts)
    if total[1:255].any():
        return None
    return (f'hold no class at all: all {len(counts)} sampled maps are 0 everywhere'
            f'{" (and 255)" if total[255] else ""}, and reduce_zero_label=True ignores 0, so no pixel would be '
            'trained or evaluated (reduce_zero_label=False would not help: every pixel would then be class 0). '
            'The maps lost their labels on the way: a conversion to 8 bits of 16-bit or RGB maps, labels scaled to '
            '0..1 and rounded, a colour-coded map read as grey, an export of empty masks. Fix: write the maps again '
            'from the source annotations as single-channel PNGs of class values (1..N here, 0 = unlabelled), '
            'and check one with PIL (numpy.unique(numpy.asarray(Image.open(path))))')


def label_convention_problem(counts, reduce_zero_label, classes):
    """What is wrong with ``reduce_zero_label=True`` for maps with these value counts, or None.

    ``counts``: ``[(map path, np.bincount of its values)]``. mmseg's ``reduce_zero_label`` makes the
    file value 0 the ignored label (255) and moves every other value down by one, for maps whose
    0 means "unlabelled" and whose classes are 1..N (ADE20K's convention). Maps whose classes are
    0..N-1 (255 = ignore) read this way lose class 0, shift every class by one and never show the
    last one; the mean IoU then even rises. Judged 0-based when no sampled map holds the value N
    (the last class) and either the maps already mark pixels with 255 (so 0 is no "unlabelled"), or
    0 is the most frequent value of most sampled maps (an "unlabelled" value rarely is).
    """
    if not reduce_zero_label or not classes:
        return None
    num_classes = len(classes)
    total = sum(c for _, c in counts)
    if num_classes >= 255 or total[num_classes]:
        return None
    with_255 = [path for path, c in counts if c[255]]
    zero_first = [path for path, c in counts if c[0] and int(np.argmax(c)) == 0]
    if not with_255 and len(zero_first) * 2 <= len(counts):
        return None
    evidence = (f'{len(with_255)} of {len(counts)} sampled maps mark pixels with 255 (already the ignored value)'
                if with_255 else
                f'0 is the most frequent value of {len(zero_first)} of {len(counts)} sampled maps')
    top = int(np.flatnonzero(total[:255]).max()) if total[:255].any() else 0
    return (f'look 0-based (values 0..{top}{", 255" if total[255] else ""}: classes 0..{num_classes - 1}, 255 = '
            f'ignored), but the dataset has reduce_zero_label=True, which ignores the value 0 and moves every '
            f'other value down by one: class 0 ({classes[0]!r}) would never be trained or evaluated, every class '
            f'would be learned as its neighbour, and the last class ({classes[-1]!r}, value {num_classes - 1} '
            f'after the shift) would never occur ({evidence}, and none holds the value {num_classes}). Fix: '
            'reduce_zero_label=False for maps whose classes start at 0;')


def check_zero_label_setting(key, dataset_setting, load_step, where):
    """mmseg's ``LoadAnnotations(reduce_zero_label=...)`` must agree with its dataset's setting (else
    an AssertionError at the first map); ``where`` is the config path of that pipeline step."""
    step_setting = load_step.get('reduce_zero_label') if isinstance(load_step, dict) else None
    if step_setting is None or bool(step_setting) == bool(dataset_setting):
        return
    raise UserError(
        f'{key}: {where}.reduce_zero_label={step_setting} but the dataset has reduce_zero_label={dataset_setting}; '
        'mmseg stops at the first map when they differ. Fix: give both the same value (the one of your maps\' '
        f'convention), e.g. --cfg-options {key}.dataset.reduce_zero_label={step_setting} or '
        f'{where}.reduce_zero_label={dataset_setting}')


def _rel(path, root):
    return osp.relpath(path, root) if root and path.startswith(root) else path
