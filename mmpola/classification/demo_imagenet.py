"""A tiny synthetic dataset in the ImageNet folder layout, for demos and end-to-end tests.

Six classes (``circle``, ``ring``, ``square``, ``triangle``, ``cross``, ``stripes``): a shape
of random size, position and rotation on a noisy, weakly tinted background. Each class also
has its own hue range (centres 60 degrees apart, +-40 degrees wide), so neighbouring classes
overlap in colour: colour is a quick but incomplete cue and the shape settles the rest, which
lets a small transformer trained from scratch learn visibly within a few CPU minutes. Every
image is drawn from its own seed (``seed``, split, class, index), so the files do not depend
on the order or number of images generated and the same call always writes the same data.
"""
import colorsys
import json
import math
import os
import os.path as osp
import shutil

import numpy as np
from PIL import Image, ImageDraw

__all__ = ['DEMO_CLASSES', 'make_demo_imagenet', 'demo_imagenet_is_complete', 'draw_sample']

DEMO_CLASSES = ('circle', 'ring', 'square', 'triangle', 'cross', 'stripes')
_SPLIT_IDS = {'train': 0, 'val': 1}
_META_FILE = 'meta.json'


def _class_colour(rng, label, num_classes):
    hue = (label / num_classes + rng.uniform(-40, 40) / 360) % 1.0
    rgb = colorsys.hsv_to_rgb(hue, rng.uniform(0.55, 1.0), rng.uniform(0.6, 1.0))
    return tuple(int(round(255 * c)) for c in rgb)


def _rotated(points, centre, angle):
    cx, cy = centre
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + (x - cx) * c - (y - cy) * s, cy + (x - cx) * s + (y - cy) * c) for x, y in points]


def draw_sample(class_name, rng, size=64, classes=DEMO_CLASSES):
    """One RGB ``PIL.Image`` of ``class_name`` drawn with the generator ``rng``."""
    if class_name not in classes:
        raise ValueError(f'unknown class {class_name!r}; valid: {", ".join(classes)}')
    grey = rng.uniform(40, 200)
    background = np.clip(grey + rng.normal(0, 12, 3), 0, 255)  # weakly tinted grey
    noise = rng.normal(0, 16, (size, size, 3))
    img = np.clip(background[None, None] + noise, 0, 255).astype(np.uint8)
    image = Image.fromarray(img, 'RGB')
    draw = ImageDraw.Draw(image)
    colour = _class_colour(rng, classes.index(class_name), len(classes))
    r = rng.uniform(0.2, 0.34) * size  # half extent of the shape
    cx, cy = rng.uniform(r + 2, size - r - 2, 2)
    angle = rng.uniform(0, 2 * math.pi)
    width = max(2, int(r * rng.uniform(0.25, 0.4)))
    if class_name == 'circle':
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif class_name == 'ring':
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=colour, width=width)
    elif class_name == 'square':
        square = [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
        draw.polygon(_rotated(square, (cx, cy), angle), fill=colour)
    elif class_name == 'triangle':
        tri = [(cx + r * math.cos(angle + k * 2 * math.pi / 3),
                cy + r * math.sin(angle + k * 2 * math.pi / 3)) for k in range(3)]
        draw.polygon(tri, fill=colour)
    elif class_name == 'cross':
        for a in (angle, angle + math.pi / 2):
            bar = [(cx - r, cy - width / 2), (cx + r, cy - width / 2), (cx + r, cy + width / 2),
                   (cx - r, cy + width / 2)]
            draw.polygon(_rotated(bar, (cx, cy), a), fill=colour)
    elif class_name == 'stripes':
        for k in (-1, 0, 1):
            offset = k * 2.2 * width
            bar = [(cx - r, cy + offset - width / 2), (cx + r, cy + offset - width / 2),
                   (cx + r, cy + offset + width / 2), (cx - r, cy + offset + width / 2)]
            draw.polygon(_rotated(bar, (cx, cy), angle), fill=colour)
    else:
        raise ValueError(f'no drawing rule for class {class_name!r}')
    return image


def demo_imagenet_is_complete(root):
    """True when ``root`` holds a finished dataset (``meta.json`` is written last)."""
    return osp.isfile(osp.join(root, _META_FILE))


def make_demo_imagenet(out_dir='data/demo_imagenet', num_train=50, num_val=16, size=64, seed=0,
                       classes=DEMO_CLASSES, overwrite=False):
    """Write ``out_dir/{train,val}/<class>/<class>_<i>.JPEG`` (``num_*`` images per class).

    A finished dataset is left alone unless ``overwrite`` (its ``meta.json`` is returned).

    Returns:
        the meta data: classes, image size, seed, images per split.
    """
    if demo_imagenet_is_complete(out_dir) and not overwrite:
        with open(osp.join(out_dir, _META_FILE)) as f:
            return json.load(f)
    if overwrite:
        for split in _SPLIT_IDS:
            shutil.rmtree(osp.join(out_dir, split), ignore_errors=True)
    counts = {}
    for split, per_class in (('train', num_train), ('val', num_val)):
        counts[split] = 0
        for label, name in enumerate(classes):
            folder = osp.join(out_dir, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                rng = np.random.default_rng([seed, _SPLIT_IDS[split], label, i])
                draw_sample(name, rng, size, classes).save(osp.join(folder, f'{name}_{i:04d}.JPEG'),
                                                  quality=92)
                counts[split] += 1
    meta = dict(classes=list(classes), image_size=size, seed=seed, images=counts)
    with open(osp.join(out_dir, _META_FILE), 'w') as f:
        json.dump(meta, f, indent=2)
    return meta
