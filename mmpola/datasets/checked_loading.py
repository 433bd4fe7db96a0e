"""The loading step that refuses JPEGs with a damaged body (:mod:`mmpola.datasets.decoding` says how).

Registered in the transform registry as ``LoadCheckedImage`` through
:func:`mmpola.datasets.build_load_checked_image`, which imports this module (and mmcv) when a
pipeline builds the step.
"""
from mmcv.transforms import LoadImageFromFile
from mmengine.logging import print_log

from .decoding import DamagedImageError, corrupt_jpeg_messages, decoder_messages

__all__ = ['LoadCheckedImage']


class LoadCheckedImage(LoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` (same arguments and results) that refuses a JPEG whose data are
    damaged instead of loading it with gray or noise where the data were lost (see the module doc).

    With mmcv's ``ignore_empty=True`` such an image (as an unreadable one) is left out with a warning
    naming it, and mmengine's dataset takes another in its place (in training; a test dataset stops).
    The check needs the ``cv2`` decoder (``imdecode_backend``, mmcv's default): Pillow drops libjpeg's
    warnings, so with ``imdecode_backend='pillow'`` a damaged body is not seen.
    """

    def transform(self, results):
        with decoder_messages() as lines:
            loaded = super().transform(results)
        corrupt = corrupt_jpeg_messages(lines)
        if not corrupt:
            return loaded
        path = results.get('img_path')
        what = f'image {path}: the file is damaged: its JPEG data are corrupt (libjpeg: {"; ".join(corrupt)})'
        if self.ignore_empty:
            print_log(f'[mmpola] {what}; left out (ignore_empty=True)', logger='current', level=30)
            return None
        raise DamagedImageError(
            f'{what}, so it decodes with the lost part filled with gray or noise, which the model would learn '
            'from or be scored on. Fix: replace the file with the original (download or copy it again), or '
            "remove it from the dataset (its entry in the annotation file); to leave damaged images out instead: "
            'ignore_empty=True in this LoadCheckedImage step')
