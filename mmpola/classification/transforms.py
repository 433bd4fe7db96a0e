"""Per-image pipeline steps: read with PIL, timm's ImageNet transforms, pack.

The timm transforms run in timm's *prefetcher* form (``use_prefetcher=True``): each image
leaves the data workers as a uint8 (3, H, W) tensor and the batch-wise float steps
(normalisation, random erasing, Mixup/CutMix) run in
:class:`~mmpola.classification.TimmClsDataPreprocessor` on the training device, as timm's own
training script does. Four times less data crosses the worker queues than with float tensors.
"""
import io

import numpy as np
from mmengine import fileio
from PIL import Image

from mmpola.datasets.decoding import unreadable_image
from mmpola.registry import TRANSFORMS

__all__ = ['LoadPILImage', 'TimmTransform', 'PackClsInputs']


@TRANSFORMS.register_module()
class LoadPILImage:
    """Read ``results['img_path']`` into an RGB ``PIL.Image`` at ``results['img']``.

    Files are read through mmengine's file backends (``backend_args``), so the same config
    reads a local folder, an object store or HTTP. CMYK / grey JPEGs of ImageNet become RGB
    (as torchvision's ``ImageFolder``). A file that cannot be read or decoded (permission denied, empty,
    no image, cut off) stops with one error naming it (:class:`mmpola.datasets.decoding.UnreadableImageError`),
    not PIL's, which names no file.
    """

    def __init__(self, backend_args=None):
        self.backend_args = backend_args

    def __call__(self, results):
        path = results['img_path']
        try:
            data = fileio.get(path, backend_args=self.backend_args)
            with Image.open(io.BytesIO(data)) as img:
                results['img'] = _rgb(img)
        except (OSError, SyntaxError, ValueError) as error:  # PIL's UnidentifiedImageError is an OSError
            raise unreadable_image(path, error) from None
        results['ori_shape'] = results['img'].size[::-1]
        return results

    def __repr__(self):
        return f'{type(self).__name__}(backend_args={self.backend_args})'


def _rgb(img):
    """An RGB image of ``img``. PIL's ``convert('RGB')`` clips the one channel of a 16-bit grey image (PNG, TIFF:
    modes ``I;16`` and ``I``) to 255, a white image: its top 8 bits are kept instead, as OpenCV (mmcv, the detection
    and segmentation loaders) reads such files. Float images (``F``) have no such scale: ``ValueError``."""
    if img.mode.startswith('I;16') or img.mode == 'I':
        values = np.asarray(img)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high > 65535:
            raise ValueError(f'a {img.mode} image with values {low}..{high}, beyond 16 bits; convert it to 8 bits')
        img = Image.fromarray((values >> 8 if high > 255 or img.mode != 'I' else values).astype(np.uint8))
    elif img.mode == 'F':
        raise ValueError('a 32-bit float image, which has no 8-bit scale; convert it to 8 bits')
    return img.convert('RGB')


@TRANSFORMS.register_module()
class TimmTransform:
    """``timm.data.create_transform(input_size, is_training, **kwargs)`` on ``results['img']``.

    Training (official recipe)::

        dict(type='TimmTransform', input_size=224, is_training=True, color_jitter=0.4,
             auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic')

    Evaluation (official: square resize to 256, bicubic, centre crop 224)::

        dict(type='TimmTransform', input_size=224, is_training=False, crop_pct=224 / 256,
             crop_mode='squash', interpolation='bicubic')

    Output ``results['inputs']``: uint8 (3, H, W) tensor (timm's prefetcher form). Random
    erasing (``re_prob`` ...), normalisation and Mixup belong to the data preprocessor, which
    runs them batch-wise; passing ``re_prob`` here is an error rather than a silent no-op.
    """

    def __init__(self, input_size=224, is_training=False, **kwargs):
        from timm.data import create_transform
        erasing = sorted(k for k in kwargs if k.startswith('re_') and kwargs[k])
        if erasing:
            raise ValueError(f'TimmTransform: {erasing} have no effect here; random erasing runs in '
                             "the data preprocessor: data_preprocessor=dict(type='TimmClsDataPreprocessor', "
                             "random_erasing=dict(probability=0.25, mode='pixel', max_count=1))")
        for key in ('use_prefetcher', 'mean', 'std', 'normalize'):
            if key in kwargs:
                raise ValueError(f'TimmTransform: {key!r} is fixed (uint8 output; mean/std belong to '
                                 'the data preprocessor)')
        self.input_size = input_size
        self.is_training = is_training
        self.kwargs = kwargs
        self.transform = create_transform(input_size, is_training=is_training, use_prefetcher=True,
                                          **kwargs)

    def __call__(self, results):
        results['inputs'] = self.transform(results.pop('img'))
        results['img_shape'] = tuple(results['inputs'].shape[-2:])
        return results

    def __repr__(self):
        return f'{type(self).__name__}(\n{self.transform})'


@TRANSFORMS.register_module()
class PackClsInputs:
    """-> ``dict(inputs=uint8 (3, H, W), data_samples=dict(gt_label=int, <meta_keys>))``.

    ``default_collate`` then stacks a batch into ``inputs`` (B, 3, H, W) and
    ``data_samples['gt_label']`` (B,).
    """

    def __init__(self, meta_keys=('img_path',)):
        self.meta_keys = tuple(meta_keys)

    def __call__(self, results):
        samples = dict(gt_label=results['gt_label'])
        samples.update({k: results[k] for k in self.meta_keys if k in results})
        return dict(inputs=results['inputs'], data_samples=samples)

    def __repr__(self):
        return f'{type(self).__name__}(meta_keys={self.meta_keys})'
