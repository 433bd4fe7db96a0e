"""Batch-wise image preprocessing on the training device: normalise, random erasing, Mixup/CutMix.

The same steps and order as the official PolaFormer training (timm's RandomErasing after
normalisation, then ``timm.data.Mixup`` on the batch), with timm's own implementations.
"""
from collections.abc import Mapping, Sequence

import torch
from mmengine.model import BaseDataPreprocessor

from mmpola.registry import MODELS

__all__ = ['TimmClsDataPreprocessor']

IMAGENET_MEAN_255 = (123.675, 116.28, 103.53)  # timm's IMAGENET_DEFAULT_MEAN x 255
IMAGENET_STD_255 = (58.395, 57.12, 57.375)


@MODELS.register_module()
class TimmClsDataPreprocessor(BaseDataPreprocessor):
    """uint8 image batches -> normalised float batches, plus training-only augmentation.

    Args:
        mean, std: per-channel statistics on the 0-255 scale (RGB; default ImageNet).
        random_erasing: keyword arguments of ``timm.data.RandomErasing`` (``probability``,
            ``mode``, ``max_count`` ...) or None. Training only; per sample.
        mixup: keyword arguments of ``timm.data.Mixup`` (``mixup_alpha``, ``cutmix_alpha``,
            ``label_smoothing``, ``num_classes`` ...) or None. Training only; needs an even
            batch size (``drop_last=True`` in the train dataloader). Adds the soft targets as
            ``data_samples['gt_score']`` (B, num_classes).
        non_blocking: asynchronous host-to-device copies.

    Input (from ``default_collate``, or a list from ``pseudo_collate``)::

        dict(inputs=uint8 (B, 3, H, W), data_samples=dict(gt_label=(B,), img_path=[...]))
    """

    def __init__(self, mean=IMAGENET_MEAN_255, std=IMAGENET_STD_255, random_erasing=None,
                 mixup=None, non_blocking=False):
        super().__init__(non_blocking=non_blocking)
        self.register_buffer('mean', torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), False)
        self.register_buffer('std', torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), False)
        self.random_erasing = None
        if random_erasing:
            from timm.data.random_erasing import RandomErasing
            self.random_erasing = RandomErasing(**dict(dict(device='cpu'), **random_erasing))
        self.mixup = None
        if mixup:
            from timm.data import Mixup
            self.mixup = Mixup(**mixup)

    @staticmethod
    def _collate_samples(samples):
        """A list of per-sample dicts (pseudo_collate) -> one dict with a label tensor."""
        if samples is None or isinstance(samples, Mapping):
            return samples
        if isinstance(samples, Sequence) and samples and isinstance(samples[0], Mapping):
            out = {k: [s[k] for s in samples] for k in samples[0]}
            out['gt_label'] = torch.as_tensor(out['gt_label'])
            return out
        raise TypeError(f'data_samples must be a dict or a list of dicts, got {type(samples).__name__}')

    def forward(self, data, training=False):
        inputs = data['inputs']
        if isinstance(inputs, (list, tuple)):
            inputs = torch.stack(inputs)
        samples = self._collate_samples(data.get('data_samples'))
        data = self.cast_data(dict(inputs=inputs, data_samples=samples))
        inputs, samples = data['inputs'], data['data_samples']
        if inputs.dim() != 4 or inputs.shape[1] != self.mean.shape[1]:
            raise ValueError(f'expected images (B, {self.mean.shape[1]}, H, W), got {tuple(inputs.shape)}')
        inputs = (inputs.float() - self.mean) / self.std
        if training:
            if self.random_erasing is not None:
                self.random_erasing.device = inputs.device
                inputs = self.random_erasing(inputs)
            if self.mixup is not None:
                if inputs.shape[0] % 2:
                    raise ValueError(f'Mixup/CutMix needs an even batch size, got {inputs.shape[0]}; '
                                     'use an even batch_size and drop_last=True in train_dataloader')
                inputs, scores = self.mixup(inputs, samples['gt_label'])
                samples = dict(samples, gt_score=scores)
        return dict(inputs=inputs, data_samples=samples)
