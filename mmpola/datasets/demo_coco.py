"""A tiny synthetic COCO-format instance segmentation dataset for the CPU demo and the tests.

Every image is a textured, noisy background with a few filled shapes (circles, rectangles,
triangles; rotated, of random size and colour). Each shape is stored as a COCO polygon, and the
image is rasterised from exactly that polygon, so masks and pixels agree. Some images also hold a
cluster of tiny shapes annotated as one ``iscrowd=1`` instance with an uncompressed RLE mask, as
COCO annotates crowds; COCOeval ignores those when matching, mmdet turns them into ignored
instances. The same seed always gives the same files.
"""
import json
import os
import os.path as osp

import cv2
import numpy as np
from pycocotools import mask as mask_utils

__all__ = ['DEMO_CLASSES', 'make_demo_coco', 'demo_coco_is_complete', 'demo_coco_files']

DEMO_CLASSES = ('circle', 'rectangle', 'triangle')
# (height, width) choices: small images keep a CPU training step well under a second
_IMAGE_SHAPES = ((128, 128), (128, 160), (160, 128), (144, 144))


def demo_coco_files(root):
    """Paths of the two annotation files; the splits' images live in ``root/{train,val}/``."""
    return {split: osp.join(root, 'annotations', f'instances_{split}.json') for split in ('train', 'val')}


def demo_coco_is_complete(root):
    """True when both annotation files exist (they are written after all images of a split)."""
    return all(osp.isfile(path) for path in demo_coco_files(root).values())


def _background(rng, height, width):
    """Smooth colour gradient + low-contrast stripes and blobs: a texture the detector must ignore."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(40, 215, size=3)
    direction = rng.normal(size=2)
    direction /= np.linalg.norm(direction) + 1e-6
    ramp = (xx * direction[0] + yy * direction[1]) / max(height, width)
    img = base[None, None, :] + ramp[..., None] * rng.uniform(-60, 60, size=3)
    period = rng.uniform(6, 24)
    angle = rng.uniform(0, np.pi)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period)
    img += stripes[..., None] * rng.uniform(3, 12)
    for _ in range(rng.integers(2, 6)):  # soft blobs, never with sharp edges like the objects
        centre = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        axes = (int(rng.integers(6, 30)), int(rng.integers(6, 30)))
        blob = np.zeros((height, width), np.float32)
        cv2.ellipse(blob, centre, axes, float(rng.uniform(0, 180)), 0, 360, 1.0, -1)
        blob = cv2.GaussianBlur(blob, (0, 0), sigmaX=5)
        img += blob[..., None] * rng.uniform(-25, 25, size=3)
    return img


def _shape_polygon(rng, name, centre, size):
    """Vertices (K, 2) in x, y of one rotated shape of roughly ``size`` pixels across."""
    angle = rng.uniform(0, 2 * np.pi)
    if name == 'circle':
        t = np.linspace(0, 2 * np.pi, 24, endpoint=False)
        pts = np.stack([np.cos(t), np.sin(t)], 1) * size / 2
    elif name == 'rectangle':
        half_w, half_h = size / 2, size / 2 * rng.uniform(0.45, 1.0)
        pts = np.array([[-half_w, -half_h], [half_w, -half_h], [half_w, half_h], [-half_w, half_h]])
    else:  # triangle: a jittered equilateral one
        t = np.array([0, 2 * np.pi / 3, 4 * np.pi / 3]) + rng.uniform(-0.25, 0.25, size=3)
        pts = np.stack([np.cos(t), np.sin(t)], 1) * size / 1.7
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return pts @ rot.T + np.asarray(centre, np.float64)


def _rasterise(polygon, height, width):
    # pycocotools' own rasteriser: the pixels drawn are exactly the mask COCOeval and mmdet decode
    rle = mask_utils.frPyObjects([np.round(polygon, 1).astype(np.float64).flatten().tolist()], height, width)
    return mask_utils.decode(mask_utils.merge(rle))


def _contrasting_colour(rng, background_mean):
    """An object colour far enough from the local background to be visible through the noise."""
    for _ in range(50):
        colour = rng.uniform(0, 255, size=3)
        if np.abs(colour - background_mean).mean() > 60:
            return colour
    return 255 - background_mean


def _annotation(mask, category_id, iscrowd, polygon=None):
    rle = mask_utils.encode(np.asfortranarray(mask))
    x, y, w, h = (float(v) for v in mask_utils.toBbox(rle))
    if iscrowd:
        # uncompressed RLE (counts as a list of run lengths), the form COCO uses for crowds
        flat = mask.flatten(order='F')  # COCO runs go down the columns and start with zeros
        boundaries = np.flatnonzero(flat[1:] != flat[:-1]) + 1
        runs = np.diff(np.concatenate([[0], boundaries, [flat.size]]))
        if flat[0]:
            runs = np.concatenate([[0], runs])
        segmentation = dict(counts=[int(c) for c in runs], size=list(mask.shape))
    else:
        segmentation = [np.round(polygon, 1).astype(np.float64).flatten().tolist()]
    return dict(category_id=category_id, segmentation=segmentation, area=float(mask_utils.area(rle)),
                bbox=[x, y, w, h], iscrowd=int(iscrowd))


def _shape_of(label):
    """The shape drawn for class ``label``: the demo's own classes are their shapes; the classes of
    another dataset (:func:`make_demo_coco`'s ``classes``) take the three shapes in turn."""
    return DEMO_CLASSES[label % len(DEMO_CLASSES)]


def _make_image(rng, height, width, max_objects, crowd_prob, classes=DEMO_CLASSES, min_objects=1):
    img = _background(rng, height, width)
    occupied = np.zeros((height, width), np.uint8)
    annotations = []

    def place(name, size, margin):
        for _ in range(30):  # rejection sampling: shapes never overlap, so polygons equal masks
            centre = rng.uniform(size / 2, [width - size / 2, height - size / 2])
            polygon = _shape_polygon(rng, name, centre, size)
            mask = _rasterise(polygon, height, width)
            grown = cv2.dilate(mask, np.ones((margin, margin), np.uint8))
            if mask.sum() >= 12 and not (grown & occupied).any():
                return polygon, mask
        return None, None

    for _ in range(int(rng.integers(min_objects, max_objects + 1))):
        label = int(rng.integers(len(classes)))
        size = float(rng.uniform(18, 0.45 * min(height, width)))
        polygon, mask = place(_shape_of(label), size, margin=5)
        if polygon is None:
            continue
        colour = _contrasting_colour(rng, img[mask.astype(bool)].mean(0))
        img[mask.astype(bool)] = colour + rng.normal(0, 6, size=3)
        occupied |= mask
        annotations.append(_annotation(mask, label + 1, iscrowd=False, polygon=polygon))

    if rng.random() < crowd_prob:  # a clump of tiny same-class shapes, annotated as one crowd
        label = int(rng.integers(len(classes)))
        crowd = np.zeros((height, width), np.uint8)
        centre = rng.uniform(20, [width - 20, height - 20])
        colour = _contrasting_colour(rng, img.mean((0, 1)))
        for _ in range(int(rng.integers(5, 9))):
            polygon = _shape_polygon(rng, _shape_of(label), centre + rng.normal(0, 8, 2),
                                     float(rng.uniform(5, 9)))
            mask = _rasterise(polygon, height, width)
            if not (mask & occupied).any():
                crowd |= mask
        if crowd.sum() >= 20:
            img[crowd.astype(bool)] = colour
            occupied |= crowd
            annotations.append(_annotation(crowd, label + 1, iscrowd=True))

    img += rng.normal(0, rng.uniform(4, 14), size=img.shape)  # sensor noise over everything
    return np.clip(img, 0, 255).astype(np.uint8), annotations


def make_demo_coco(root='data/demo_coco', num_train=320, num_val=64, seed=0, max_objects=4,
                   crowd_prob=0.15, image_shapes=_IMAGE_SHAPES, overwrite=False, verbose=True, classes=DEMO_CLASSES,
                   min_objects=1):
    """Write ``root/{train,val}/*.jpg`` and ``root/annotations/instances_{train,val}.json``.

    Each image holds ``min_objects`` to ``max_objects`` shapes (fewer where they do not fit without
    overlapping). ``classes``: the category names of the files (default: the demo's shapes); with
    another dataset's names (e.g. COCO's 80) every name gets instances, drawn as the three shapes in turn,
    so that a config of that dataset trains on the files as they are.

    Returns the annotation file paths. Does nothing when the dataset is already complete unless
    ``overwrite``. The split seeds derive from ``seed``, so the same arguments give the same files.
    """
    files = demo_coco_files(root)
    if demo_coco_is_complete(root) and not overwrite:
        return files
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    categories = [dict(id=i + 1, name=name, supercategory='shape') for i, name in enumerate(classes)]
    for split_index, (split, num_images) in enumerate((('train', num_train), ('val', num_val))):
        rng = np.random.default_rng([seed, split_index])
        os.makedirs(osp.join(root, split), exist_ok=True)
        images, annotations = [], []
        for image_id in range(1, num_images + 1):
            height, width = image_shapes[int(rng.integers(len(image_shapes)))]
            img, anns = _make_image(rng, height, width, max_objects, crowd_prob, classes, min_objects)
            file_name = f'{image_id:06d}.jpg'
            # cv2 writes BGR; the RGB/BGR order is irrelevant for random colours
            cv2.imwrite(osp.join(root, split, file_name), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
            images.append(dict(id=image_id, file_name=file_name, height=height, width=width))
            for ann in anns:
                ann.update(id=len(annotations) + 1, image_id=image_id)
                annotations.append(ann)
        with open(files[split] + '.tmp', 'w') as f:
            info = dict(description=f'mmpola synthetic demo_coco ({split}), seed {seed}', version='1.0')
            json.dump(dict(info=info, licenses=[], images=images, annotations=annotations,
                           categories=categories), f)
        os.replace(files[split] + '.tmp', files[split])  # the json appears only when complete
        if verbose:
            crowds = sum(a['iscrowd'] for a in annotations)
            print(f'demo_coco {split}: {len(images)} images, {len(annotations)} instances '
                  f'({crowds} crowd) -> {osp.join(root, split)}')
    return files
