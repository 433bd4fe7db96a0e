"""Pipeline steps that check what was loaded: images in the form the models expect, segmentation labels.

Registered in mmengine's root ``TRANSFORMS`` registry (mmcv's), so configs of every task library
(``default_scope`` mmseg, mmdet, ...) find them; importing :mod:`mmpola` (the configs'
``custom_imports``) registers them.
"""
import numpy as np
from mmengine.logging import print_log

from mmpola.registry import TRANSFORMS

__all__ = ['CheckImage', 'CheckSegLabels']


@TRANSFORMS.register_module()
class CheckImage:
    """The loaded image in the form OpenMMLab's models take: three channels, values in 0..255.

    Place it right after ``LoadImageFromFile`` in a test pipeline (the shipped configs do): mmdet's
    ``DetInferencer`` and mmseg's ``MMSegInferencer`` run the config's test pipeline with their own loader
    in the place of ``LoadImageFromFile``, so the arrays given to them pass here too.

    * a 2-D (grayscale) array, or one of one channel, becomes three equal channels (the data
      preprocessor's BGR -> RGB swap would otherwise stop with ``IndexError: index 2 is out of bounds``);
    * a float image whose values all lie in [0, 1] (numpy's and PIL-to-float habit) is scaled to 0..255:
      the models are trained on 0..255 pixels and normalise them with means near 120, so a 0..1 image
      reaches them as an almost uniform dark one and the predictions change silently.

    Each conversion is said once per pipeline (a warning in the log). NaN / inf pixels are left to
    :class:`mmpola.runtime.NonFinitePixelsHook`, which names the file in the tools' runs.
    """

    def __init__(self):
        self._said = set()

    def __call__(self, results):
        return self.transform(results)

    def _say(self, kind, message):
        if kind not in self._said:
            self._said.add(kind)
            print_log(f'[mmpola] CheckImage: {message} (said once)', logger='current', level=30)

    def transform(self, results):
        img = results.get('img')
        if not isinstance(img, np.ndarray):
            return results
        where = results.get('img_path') or 'an image given as an array'
        if img.ndim == 2 or (img.ndim == 3 and img.shape[2] == 1):
            img = np.repeat(img.reshape(img.shape[0], img.shape[1], 1), 3, axis=2)
            self._say('gray', f'{where} has one channel (shape {results["img"].shape}); it is used as three equal '
                              'channels, as the models take colour images')
        if img.dtype.kind == 'f' and img.size:
            mask = np.isfinite(img)
            finite = img if mask.all() else img[mask]
            if finite.size and finite.min() >= 0 and finite.max() <= 1:
                img = img.astype(np.float32) * 255
                self._say('unit', f'{where} is a float image with values in 0..1; it is scaled to 0..255, the '
                                  'range the models were trained on (pass uint8 images, or float ones in 0..255, to '
                                  'skip this)')
        if img is not results['img']:
            results['img'] = img
            results['img_shape'] = img.shape[:2]
        return results

    def __repr__(self):
        return f'{type(self).__name__}()'


@TRANSFORMS.register_module()
class CheckSegLabels:
    """Check that ``gt_seg_map`` holds only class labels ``[0, num_classes)`` and ``ignore_index``.

    Place it right after ``LoadAnnotations``. Without it, a label the model has no class for
    (e.g. a value 200 in an ADE20K map of 150 classes, or a map saved with another dataset's
    label convention) reaches ``CrossEntropyLoss``: on the CPU an ``IndexError: Target 199 is out
    of bounds`` from inside the loss, on CUDA a device-side assert, neither naming the file.
    Labels are those after ``LoadAnnotations`` (``reduce_zero_label`` and a custom-class
    ``label_map`` applied). Cost: one ``np.bincount`` over the uint8 map (~0.3 ms at 512x683).

    Args:
        num_classes (int): the decode heads' ``num_classes``.
        ignore_index (int): the heads' ``ignore_index`` (mmseg's default 255).
    """

    def __init__(self, num_classes, ignore_index=255):
        if int(num_classes) <= 0:
            raise ValueError(f'CheckSegLabels: num_classes must be positive, got {num_classes}')
        self.num_classes = int(num_classes)
        self.ignore_index = ignore_index

    def __call__(self, results):
        return self.transform(results)

    def transform(self, results):
        seg = results['gt_seg_map']
        if seg.dtype == np.uint8:
            values = np.flatnonzero(np.bincount(seg.ravel(), minlength=256))
        else:
            values = np.unique(seg)
        bad = [int(v) for v in values if not (0 <= v < self.num_classes or v == self.ignore_index)]
        if bad:
            raise ValueError(self._message(results, bad))
        return results

    def _message(self, results, bad):
        path = results.get('seg_map_path', '<in-memory segmentation map>')
        shown = ', '.join(str(v) for v in bad[:10]) + (', ...' if len(bad) > 10 else '')
        msg = (f'segmentation map {path}: label values [{shown}] are not classes of this model '
               f'(valid: 0..{self.num_classes - 1} for num_classes={self.num_classes}, plus '
               f'ignore_index={self.ignore_index}).')
        if results.get('reduce_zero_label'):
            raw = ', '.join(str(v + 1) for v in bad[:10]) + (', ...' if len(bad) > 10 else '')
            msg += (f' The dataset has reduce_zero_label=True (file value v becomes v - 1, 0 becomes '
                    f'{self.ignore_index}), so the file holds [{raw}]; valid file values are '
                    f'0 (ignored) and 1..{self.num_classes}.')
        msg += (' Fix: convert the maps to the dataset\'s label convention (e.g. ADE20K: 0 = other, '
                '1..150 = classes, with reduce_zero_label=True), map the extra values to '
                f'{self.ignore_index} (ignored) or to a class, or, if the dataset really has more '
                'classes, set num_classes of the decode/auxiliary heads and of CheckSegLabels.')
        return msg

    def __repr__(self):
        return f'{type(self).__name__}(num_classes={self.num_classes}, ignore_index={self.ignore_index})'
