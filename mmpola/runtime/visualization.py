"""A one-file figure of detection results: ground truth next to predictions, for several images.

mmdet's ``DetLocalVisualizer`` draws one sample (ground truth left, prediction right); this
module only enlarges small images first (so labels stay readable) and tiles the samples into a
grid with a caption. mmdet is imported lazily: the module is importable without it.
"""
import warnings

import cv2
import numpy as np
import torch
import torch.nn.functional as F

__all__ = ['upscale_det_sample', 'draw_gt_and_prediction', 'tile_panels', 'save_detection_figure']


def upscale_det_sample(data_sample, factor):
    """A copy of a ``DetDataSample`` with boxes and masks of every instance set scaled by ``factor``."""
    sample = data_sample.clone()  # shallow: the instance sets are still shared ...
    for key in ('gt_instances', 'pred_instances', 'ignored_instances'):
        if key not in sample:
            continue
        instances = getattr(sample, key).clone()  # ... so each is replaced, never changed in place
        setattr(sample, key, instances)
        if 'bboxes' in instances:
            bboxes = instances.bboxes
            if isinstance(bboxes, torch.Tensor):
                instances.bboxes = bboxes * factor
            else:  # mmdet box structures (HorizontalBoxes)
                bboxes = bboxes.clone()
                bboxes.rescale_((factor, factor))
                instances.bboxes = bboxes
        if 'masks' in instances:
            masks = instances.masks
            if isinstance(masks, torch.Tensor):
                if len(masks):
                    masks = F.interpolate(masks[None].float(), scale_factor=factor, mode='nearest')[0] > 0.5
                else:
                    masks = masks.new_zeros((0, masks.shape[1] * factor, masks.shape[2] * factor))
                instances.masks = masks
            else:  # BitmapMasks / PolygonMasks
                instances.masks = masks.resize((masks.height * factor, masks.width * factor))
    return sample


def draw_gt_and_prediction(visualizer, image, data_sample, score_thr=0.5, factor=3):
    """RGB array: the image with ground truth (left) and predictions above ``score_thr`` (right)."""
    image = cv2.resize(image, None, fx=factor, fy=factor, interpolation=cv2.INTER_NEAREST)
    with warnings.catch_warnings():  # boxes touching the border make mmengine warn per box
        warnings.filterwarnings('ignore', message='Warning: The .* is out of bounds')
        visualizer.add_datasample('sample', image, upscale_det_sample(data_sample, factor), draw_gt=True,
                                  draw_pred=True, show=False, pred_score_thr=score_thr)
    return visualizer.get_image()


def tile_panels(panels, columns, gap=6, background=255):
    """Tile same-height-or-not RGB panels row by row into one array, padding with ``background``."""
    rows = []
    for start in range(0, len(panels), columns):
        row = panels[start:start + columns]
        height = max(p.shape[0] for p in row)
        padded = []
        for p in row:
            p = cv2.copyMakeBorder(p, 0, height - p.shape[0] + gap, 0, gap, cv2.BORDER_CONSTANT,
                                   value=(background,) * 3)
            padded.append(p)
        rows.append(np.concatenate(padded, axis=1))
    width = max(r.shape[1] for r in rows)
    rows = [cv2.copyMakeBorder(r, 0, 0, 0, width - r.shape[1], cv2.BORDER_CONSTANT, value=(background,) * 3)
            for r in rows]
    return np.concatenate(rows, axis=0)


def save_detection_figure(path, images, data_samples, dataset_meta, caption='', score_thr=0.5,
                          factor=3, columns=2):
    """Write a PNG with, per image, ground truth next to predictions; returns the RGB array."""
    from mmdet.visualization import DetLocalVisualizer
    visualizer = DetLocalVisualizer(name=f'mmpola_figure_{id(images)}', line_width=2, alpha=0.5)
    visualizer.dataset_meta = dataset_meta
    panels = [draw_gt_and_prediction(visualizer, image, sample, score_thr, factor)
              for image, sample in zip(images, data_samples)]
    figure = tile_panels(panels, columns)
    lines = [line for line in caption.splitlines() if line]
    if lines:
        header = np.full((22 * len(lines) + 8, figure.shape[1], 3), 255, np.uint8)
        for i, line in enumerate(lines):
            cv2.putText(header, line, (8, 22 * (i + 1)), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 1,
                        cv2.LINE_AA)
        figure = np.concatenate([header, figure], axis=0)
    cv2.imwrite(path, figure[..., ::-1])
    return figure
