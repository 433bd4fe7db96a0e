"""Non-finite input pixels: found where the images enter the model, named, never mixed into a batch.

A float image (a TIFF or EXR read with ``color_type='unchanged'``, a ``.npy`` loader ...) can hold NaN
or inf values. In a batch they do not stay in their own image: mmdet's RoI extractor adds
``feats[i].sum() * 0.`` for empty pyramid levels (NaN x 0 is NaN), so every RoI of the batch becomes
NaN and the other images lose all their detections; batch statistics and the losses become NaN in
training. :class:`NonFinitePixelsHook` (in the shipped configs' ``custom_hooks``) checks every float
image of every batch before the model (and its data preprocessor, which stacks them) sees it, in
training, validation and testing (uint8 images, the default, cannot hold such values and cost
nothing), and

* ``action='stop'`` (default): raises :class:`NonFinitePixelsError` naming the files, the counts, the
  loop and iteration, and the fix;
* ``action='skip'``: in training the image is replaced by another image of the dataset (what
  mmengine's datasets do when a pipeline drops an image), so the batch keeps its size; in validation
  and testing, where every image must be predicted, its non-finite values are set to 0 for its own
  prediction. A warning names each image.

Options come from the hook's argument, else from the config's top-level ``nonfinite_pixels``
(``--cfg-options nonfinite_pixels.action=skip``, or ``nonfinite_pixels=skip``), else ``'stop'``.
"""
import numpy as np
import torch
from mmengine import dist as mmdist
from mmengine.hooks import Hook

from mmpola.errors import MMPolaUserError, UserError
from mmpola.registry import HOOKS

from .options import NONFINITE_PIXELS

__all__ = ['NonFinitePixelsError', 'NonFinitePixelsHook', 'nonfinite_images']

OPTION = NONFINITE_PIXELS  # the config key of the options
_ACTIONS = ('stop', 'skip')
# how many other images training tries in place of one with non-finite pixels
_REPLACEMENT_TRIES = 20


class NonFinitePixelsError(MMPolaUserError, ValueError):
    """An input image holds NaN or infinite pixel values."""


def _samples(data_batch):
    samples = data_batch.get('data_samples') if isinstance(data_batch, dict) else None
    return samples if isinstance(samples, (list, tuple)) else None


def _image_name(data_batch, index):
    samples = _samples(data_batch)
    meta = getattr(samples[index], 'metainfo', None) if samples is not None and index < len(samples) else None
    if meta is None and samples is not None and index < len(samples) and isinstance(samples[index], dict):
        meta = samples[index]
    path = (meta or {}).get('img_path') or (meta or {}).get('filename')
    return str(path) if path else f'image {index + 1} of the batch (no file name)'


def _count(image):
    """``(NaN count, inf count)`` of a float tensor (one device sync)."""
    nan = torch.isnan(image).sum()
    inf = torch.isinf(image).sum()
    return tuple(int(v) for v in torch.stack([nan, inf]).tolist())


def nonfinite_images(data_batch):
    """``[(index, NaN count, inf count)]`` of the images of a batch (``inputs``: a list of per-image
    tensors or a stacked tensor) that hold non-finite values; integer images are skipped at no cost.

    A sum per image finds them (NaN and inf propagate through it; one pass, a fraction of the cost of
    ``isfinite``); only the images whose sum is not finite are counted element by element."""
    inputs = data_batch.get('inputs') if isinstance(data_batch, dict) else None
    if isinstance(inputs, torch.Tensor):
        if not inputs.is_floating_point() or inputs.dim() < 2:
            return []
        images = list(inputs)
        suspects = torch.nonzero(~torch.isfinite(inputs.flatten(1).sum(1))).flatten().tolist()
    elif isinstance(inputs, (list, tuple)):
        images = inputs
        floats = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]
        if not floats:
            return []
        finite = torch.isfinite(torch.stack([inputs[i].sum() for i in floats])).tolist()
        suspects = [i for i, ok in zip(floats, finite) if not ok]
    else:
        return []
    counts = [(i, *_count(images[i])) for i in suspects]
    return [(i, nan, inf) for i, nan, inf in counts if nan or inf]  # not a sum that overflowed


def _values_text(nan, inf):
    parts = ([f'{nan} NaN'] if nan else []) + ([f'{inf} infinite'] if inf else [])
    return ' and '.join(parts) + f' pixel value{"s" if nan + inf > 1 else ""}'


@HOOKS.register_module()
class NonFinitePixelsHook(Hook):
    """Stop at (or skip) input images with NaN / inf pixels before the model sees them (module doc)."""

    priority = 'VERY_HIGH'

    def __init__(self, action=None):
        self._given = action is not None
        self.action = 'stop' if action is None else action
        if self.action not in _ACTIONS:
            raise ValueError(f"NonFinitePixelsHook: action must be 'stop' or 'skip', got {self.action!r}")
        self.skipped = []  # (loop, file) of every image left out or filled

    def before_run(self, runner):
        options = runner.cfg.get(OPTION) if getattr(runner, 'cfg', None) is not None else None
        if options is None or self._given:
            return
        action = options if isinstance(options, str) else (options.get('action') if isinstance(options, dict) else None)
        if action not in _ACTIONS or (isinstance(options, dict) and set(options) - {'action'}):
            raise UserError(f"{OPTION} must be 'stop', 'skip' or dict(action='stop' | 'skip'), got {options!r}")
        self.action = action

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._check(runner, 'train', batch_idx, data_batch)

    def before_val_iter(self, runner, batch_idx, data_batch=None):
        self._check(runner, 'val', batch_idx, data_batch)

    def before_test_iter(self, runner, batch_idx, data_batch=None):
        self._check(runner, 'test', batch_idx, data_batch)

    # ------------------------------------------------------------------------------------------
    def _check(self, runner, loop, batch_idx, data_batch):
        bad = nonfinite_images(data_batch)
        if self.action == 'stop' and mmdist.get_world_size() > 1:  # every rank stops together
            flag = torch.tensor([1.0 if bad else 0.0], device=mmdist.get_comm_device())
            mmdist.all_reduce(flag, op='max')
            if flag.item() > 0 and not bad:
                raise NonFinitePixelsError(f'{loop}_dataloader: another rank met an image with non-finite pixel '
                                           'values (its message names it); stopped with it.')
        if not bad:
            return
        where = self._where(runner, loop, batch_idx)
        found = [f'{_image_name(data_batch, i)}: {_values_text(nan, inf)}' for i, nan, inf in bad]
        if self.action == 'stop':
            raise NonFinitePixelsError(
                f"{loop}_dataloader: {where}: {len(bad)} input image{'s' if len(bad) > 1 else ''} with non-finite "
                f"pixel values: {'; '.join(found)}. Such an image makes the training losses NaN and, in a batch, "
                "blanks the predictions of the other images too (their RoI features become NaN). Fix: repair or "
                'remove the file, or go on without such images: --cfg-options nonfinite_pixels.action=skip '
                '(training: another image of the dataset takes its place; validation and testing: its non-finite '
                'values are set to 0 for its own prediction; a warning names each).')
        for (i, nan, inf), text in zip(bad, found):
            name = _image_name(data_batch, i)
            if loop == 'train':
                other = self._replace(runner, data_batch, i)
                message = f'{text}: left out, {other} takes its place'
            else:
                _set_image(data_batch, i, torch.nan_to_num(_image(data_batch, i), nan=0.0, posinf=0.0, neginf=0.0))
                message = f'{text}: set to 0 for its prediction'
            self.skipped.append((loop, name))
            runner.logger.warning(f'[mmpola] {loop}_dataloader: {where}: {message} ({OPTION}.action=skip).')

    @staticmethod
    def _where(runner, loop, batch_idx):
        if loop == 'train':
            return f'iteration {runner.iter + 1}/{runner.max_iters}'
        return f'batch {batch_idx + 1}'

    def _replace(self, runner, data_batch, index):
        """Put another (finite) image of the training set at ``index`` of the batch; its file name."""
        loader = runner.train_dataloader
        dataset = loader.dataset
        seed = runner.seed if isinstance(getattr(runner, 'seed', None), int) else 0
        rng = np.random.default_rng([seed, runner.iter, index])  # the global generators stay untouched
        for _ in range(_REPLACEMENT_TRIES):
            sample = loader.collate_fn([dataset[int(rng.integers(len(dataset)))]])
            if not nonfinite_images(sample):
                _set_image(data_batch, index, _image(sample, 0))
                samples = _samples(data_batch)
                if samples is not None:
                    samples[index] = _samples(sample)[0]
                return _image_name(sample, 0)
        raise NonFinitePixelsError(
            f'train_dataloader: iteration {runner.iter + 1}: {_REPLACEMENT_TRIES} images drawn in place of '
            f'{_image_name(data_batch, index)} all have non-finite pixel values too: repair the data (every float '
            'image should hold finite values) before training with it.')


def _image(data_batch, index):
    return data_batch['inputs'][index]


def _set_image(data_batch, index, image):
    inputs = data_batch['inputs']
    if isinstance(inputs, tuple):
        inputs = data_batch['inputs'] = list(inputs)
    inputs[index] = image
