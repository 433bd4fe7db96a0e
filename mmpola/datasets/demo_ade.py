"""A tiny synthetic ADE20K-layout semantic segmentation dataset for the CPU demo and the tests.

Layout and label convention are ADE20K's, so mmseg's ADE pipeline applies unchanged::

    ROOT/
      images/{training,validation}/demo_ade_XXXXX.jpg       RGB scenes
      annotations/{training,validation}/demo_ade_XXXXX.png  uint8 labels: 0 = other (ignored,
                                                            reduce_zero_label=True), 1..K classes
      meta.json                                             classes, palette, generator settings

Every scene has a sky gradient above a horizon and a textured ground (grass, road or water),
then buildings, trees, cars and people drawn with per-class colour and texture, plus an
unlabelled clutter shape (label 0) that the metric must not score. Image ``i`` of a split depends
only on (seed, split, i), so the data is reproducible whatever the sizes asked for.
"""
import json
import os
import os.path as osp

import cv2
import numpy as np

__all__ = ['DEMO_ADE_CLASSES', 'DEMO_ADE_PALETTE', 'make_demo_ade', 'demo_ade_is_complete']

# Index i + 1 is the label value in the PNGs (0 is "other"); the segmentation demo config
# repeats these names as its dataset metainfo (a test checks that the two agree).
DEMO_ADE_CLASSES = ('sky', 'building', 'tree', 'grass', 'road', 'water', 'person', 'car')
DEMO_ADE_PALETTE = [[70, 130, 180], [180, 120, 120], [4, 200, 3], [4, 250, 7], [140, 140, 140],
                    [61, 230, 250], [150, 5, 61], [0, 102, 200]]

# Bumped whenever the drawing changes, so that stale data on disk is regenerated.
GENERATOR_VERSION = 3
SPLITS = {'training': 1, 'validation': 2}
SKY, BUILDING, TREE, GRASS, ROAD, WATER, PERSON, CAR = range(1, len(DEMO_ADE_CLASSES) + 1)


def smooth_noise(rng, height, width, cell):
    """Value noise in [0, 1]: a coarse random grid upsampled bicubically."""
    grid = rng.random((max(2, height // cell + 2), max(2, width // cell + 2))).astype(np.float32)
    noise = cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC)
    return np.clip(noise, 0.0, 1.0)


def paint(image, labels, mask, label, texture):
    """Write ``texture`` (H, W, 3) float RGB into the pixels of ``mask`` and set their label."""
    image[mask] = texture[mask]
    labels[mask] = label


def colour_field(rng, height, width, base, jitter, cell, amount):
    """A base RGB colour (jittered per instance) modulated by smooth noise of the given cell size."""
    base = np.asarray(base, np.float32) + rng.uniform(-jitter, jitter, 3)
    noise = smooth_noise(rng, height, width, cell)[..., None] - 0.5
    return base[None, None, :] * (1.0 + amount * noise)


def draw_scene(rng, height, width):
    """Return (image uint8 RGB (H, W, 3), labels uint8 (H, W)) of one synthetic scene."""
    image = np.zeros((height, width, 3), np.float32)
    labels = np.zeros((height, width), np.uint8)
    rows, cols = np.mgrid[0:height, 0:width]

    # Sky: vertical gradient from deep to pale blue.
    horizon = int(height * rng.uniform(0.35, 0.6))
    top = np.array([40, 90, 200], np.float32) + rng.uniform(-20, 20, 3)
    bottom = np.array([170, 200, 240], np.float32) + rng.uniform(-15, 15, 3)
    ramp = (rows / max(1, height - 1))[..., None]
    sky = top * (1 - ramp) + bottom * ramp
    paint(image, labels, rows < horizon, SKY, sky)

    # Ground: one of grass (fine green noise), road (grey, lane stripes), water (blue waves).
    ground = rows >= horizon
    kind = rng.choice([GRASS, ROAD, WATER])
    if kind == GRASS:
        texture = colour_field(rng, height, width, (60, 160, 50), 15, 3, 0.8)
    elif kind == ROAD:
        texture = colour_field(rng, height, width, (110, 110, 110), 10, 16, 0.2)
        stripes = (np.abs(cols - width / 2) < max(1, width // 40)) & ((rows // 6) % 2 == 0)
        texture[stripes] = (230, 230, 230)
    else:
        phase = rng.uniform(0, 2 * np.pi)
        waves = 0.5 + 0.5 * np.sin(rows * 1.3 + np.sin(cols * 0.15) * 2 + phase)
        texture = np.array([30, 80, 150], np.float32) + waves[..., None] * np.array([20, 50, 60])
    paint(image, labels, ground, kind, texture)

    # Buildings standing on the horizon: concrete-grey/beige blocks with a grid of dark windows.
    for _ in range(rng.integers(0, 3)):
        bw = int(width * rng.uniform(0.12, 0.3))
        bh = int(height * rng.uniform(0.15, 0.4))
        x0 = int(rng.integers(0, max(1, width - bw)))
        y0 = max(0, horizon - bh)
        mask = (cols >= x0) & (cols < x0 + bw) & (rows >= y0) & (rows < horizon + 2)
        texture = colour_field(rng, height, width, (175, 165, 150), 25, 8, 0.2)
        pitch = int(rng.integers(5, 8))
        windows = ((rows - y0) % pitch < pitch // 2) & ((cols - x0) % pitch < pitch // 2)
        texture[windows] = (45, 60, 90)
        paint(image, labels, mask, BUILDING, texture)

    # Trees: a dark, blotchy green crown on a short trunk (trunk counts as tree, as in ADE).
    for _ in range(rng.integers(0, 3)):
        radius = height * rng.uniform(0.07, 0.14)
        cx = rng.uniform(0, width)
        cy = horizon - radius * rng.uniform(0.6, 1.4)
        crown = (rows - cy) ** 2 + (cols - cx) ** 2 < radius ** 2
        trunk = (np.abs(cols - cx) < radius * 0.2) & (rows >= cy) & (rows < horizon + radius * 0.3)
        texture = colour_field(rng, height, width, (25, 90, 30), 10, 2, 1.0)
        texture[trunk & ~crown] = (90, 60, 30)
        paint(image, labels, crown | trunk, TREE, texture)

    # Unlabelled clutter: a random-colour shape with label 0 ("other"), ignored by the metric.
    if rng.random() < 0.5:
        cx, cy = rng.uniform(0, width), rng.uniform(horizon, height)
        ax, ay = width * rng.uniform(0.04, 0.1), height * rng.uniform(0.04, 0.1)
        mask = ((cols - cx) / ax) ** 2 + ((rows - cy) / ay) ** 2 < 1
        texture = colour_field(rng, height, width, rng.uniform(0, 255, 3), 0, 4, 0.6)
        paint(image, labels, mask, 0, texture)

    # Cars on the ground: boxes in saturated paint colours (none of which occurs elsewhere in the
    # scenes) with dark wheels, only on roads or grass.
    if kind != WATER:
        for _ in range(rng.integers(0, 3)):
            cw = int(width * rng.uniform(0.12, 0.22))
            ch = max(3, int(cw * rng.uniform(0.4, 0.55)))
            x0 = int(rng.integers(0, max(1, width - cw)))
            y0 = int(rng.integers(horizon, max(horizon + 1, height - ch)))
            body = (cols >= x0) & (cols < x0 + cw) & (rows >= y0) & (rows < y0 + ch)
            colour = [(210, 30, 30), (235, 200, 30), (240, 120, 20), (200, 40, 160)][rng.integers(4)]
            texture = colour_field(rng, height, width, colour, 20, 16, 0.1)
            wheels = (rows >= y0 + ch * 0.7) & (((cols - x0) % max(2, cw // 2)) < max(1, cw // 6))
            texture[wheels] = (20, 20, 20)
            paint(image, labels, body, CAR, texture)

    # People: skin-toned head over a striped shirt and dark trousers, standing on the ground
    # (at least ~6 px wide at 128 px, so a stride-4 model can resolve them).
    for _ in range(rng.integers(0, 3)):
        ph = height * rng.uniform(0.2, 0.32)
        cx = rng.uniform(0, width)
        feet = rng.uniform(horizon + ph * 0.3, height + ph * 0.2)
        head_r = ph * 0.13
        top = feet - ph + 2 * head_r
        head = (rows - (feet - ph + head_r)) ** 2 + (cols - cx) ** 2 < head_r ** 2
        body = (np.abs(cols - cx) < ph * 0.13) & (rows >= top) & (rows < feet)
        texture = colour_field(rng, height, width, rng.uniform(60, 220, 3), 0, 4, 0.3)
        texture[(rows - int(top)) % 4 < 2] *= 0.6
        texture[rows >= top + (feet - top) * 0.55] = (40, 40, 70)
        texture[head] = (225, 180, 150)
        paint(image, labels, head | body, PERSON, texture)

    image = image + rng.normal(0, 4, image.shape)  # sensor noise, so colour alone is not enough
    return np.clip(image, 0, 255).astype(np.uint8), labels


def make_demo_ade(out_dir='data/demo_ade', num_train=200, num_val=50, size=128, seed=0):
    """Write the dataset under ``out_dir`` and return its metadata dict (also saved as meta.json).

    ``size`` is the image height; widths vary in [size, 1.5 * size] (ADE images are not square,
    so whole-image testing sees non-multiple sizes). Files of an earlier run in ``out_dir`` are
    replaced (stale ``demo_ade_*`` files beyond the new counts are removed).
    """
    counts = {'training': num_train, 'validation': num_val}
    for split, count in counts.items():
        img_dir = osp.join(out_dir, 'images', split)
        ann_dir = osp.join(out_dir, 'annotations', split)
        for folder in (img_dir, ann_dir):
            os.makedirs(folder, exist_ok=True)
            for name in os.listdir(folder):
                if name.startswith('demo_ade_'):
                    os.remove(osp.join(folder, name))
        for index in range(count):
            rng = np.random.default_rng([seed, SPLITS[split], index])
            width = int(size * rng.choice([1.0, 1.0, 1.25, 1.5]))
            image, labels = draw_scene(rng, size, width)
            name = f'demo_ade_{index:05d}'
            cv2.imwrite(osp.join(img_dir, name + '.jpg'), image[..., ::-1],
                        [cv2.IMWRITE_JPEG_QUALITY, 95])
            cv2.imwrite(osp.join(ann_dir, name + '.png'), labels)
    meta = dict(classes=list(DEMO_ADE_CLASSES), palette=DEMO_ADE_PALETTE, num_train=num_train,
                num_val=num_val, size=size, seed=seed, version=GENERATOR_VERSION)
    with open(osp.join(out_dir, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)
    return meta


def demo_ade_is_complete(out_dir, num_train=200, num_val=50, size=128, seed=0):
    """True when ``out_dir`` holds a dataset generated with exactly these settings."""
    meta_file = osp.join(out_dir, 'meta.json')
    if not osp.isfile(meta_file):
        return False
    with open(meta_file) as f:
        meta = json.load(f)
    wanted = dict(num_train=num_train, num_val=num_val, size=size, seed=seed, version=GENERATOR_VERSION)
    if any(meta.get(key) != value for key, value in wanted.items()):
        return False
    for split, count in (('training', num_train), ('validation', num_val)):
        for sub, ext in (('images', '.jpg'), ('annotations', '.png')):
            folder = osp.join(out_dir, sub, split)
            if not osp.isdir(folder) or sum(f.endswith(ext) for f in os.listdir(folder)) != count:
                return False
    return True
