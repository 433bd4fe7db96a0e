"""NonFinitePixelsHook (mmpola.runtime.nonfinite_pixels) on hand-made batches: which images hold NaN / inf
values (per-image lists and stacked tensors; integer images cost nothing), the options, and what
'skip' does in training (another image of the dataset takes the place) and in testing (the values set
to 0). Through the tools: tests/tools/test_test.py and test_train.py."""
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.structures import BaseDataElement

from mmpola.errors import UserError
from mmpola.runtime.nonfinite_pixels import NonFinitePixelsError, NonFinitePixelsHook, nonfinite_images


def _sample(path):
    return BaseDataElement(metainfo=dict(img_path=path))


def _batch(*images):
    return dict(inputs=list(images), data_samples=[_sample(f'img{i}.tiff') for i in range(len(images))])


def _runner(dataset=(), **cfg):
    def collate(samples):
        return dict(inputs=[s['inputs'] for s in samples], data_samples=[s['data_samples'] for s in samples])
    return SimpleNamespace(cfg=Config(cfg), iter=4, max_iters=10, seed=0, logger=MMLogger.get_current_instance(),
                           train_dataloader=SimpleNamespace(dataset=list(dataset), collate_fn=collate))


def test_nonfinite_images_of_lists_and_stacked_tensors():
    bad = torch.ones(3, 4, 4)
    bad[0, 1, 1], bad[2, 0, 0], bad[1, 2, 2] = float('nan'), float('nan'), float('inf')
    assert nonfinite_images(_batch(torch.ones(3, 4, 4), bad)) == [(1, 2, 1)]
    assert nonfinite_images(dict(inputs=torch.stack([bad, torch.ones(3, 4, 4), bad]))) == [(0, 2, 1), (2, 2, 1)]
    assert nonfinite_images(_batch(torch.zeros(3, 4, 4, dtype=torch.uint8))) == []
    assert nonfinite_images(dict(inputs=torch.zeros(2, 3, 4, 4, dtype=torch.uint8))) == []


def test_stop_names_the_files_and_skip_fills_at_test_time():
    nan = torch.full((3, 2, 2), float('nan'))
    hook = NonFinitePixelsHook()
    hook.before_run(_runner())
    with pytest.raises(NonFinitePixelsError, match=r'^test_dataloader: batch 3: 1 input image with non-finite '
                                                   r'pixel values: img1.tiff: 12 NaN pixel values\. '):
        hook.before_test_iter(_runner(), 2, _batch(torch.ones(3, 2, 2), nan.clone()))
    hook = NonFinitePixelsHook()
    hook.before_run(_runner(nonfinite_pixels=dict(action='skip')))
    batch = _batch(torch.ones(3, 2, 2), nan.clone())
    hook.before_val_iter(_runner(), 0, batch)
    assert torch.equal(batch['inputs'][1], torch.zeros(3, 2, 2))
    assert torch.equal(batch['inputs'][0], torch.ones(3, 2, 2))
    assert hook.skipped == [('val', 'img1.tiff')]


def test_skip_in_training_puts_another_image_in_the_place():
    nan = torch.full((3, 2, 2), float('nan'))
    dataset = [dict(inputs=nan.clone(), data_samples=_sample('also_bad.tiff')),
               dict(inputs=torch.full((3, 2, 2), 7.0), data_samples=_sample('good.jpg'))]
    hook = NonFinitePixelsHook(action='skip')
    batch = _batch(torch.ones(3, 2, 2), nan.clone())
    hook.before_train_iter(_runner(dataset), 0, batch)
    assert torch.equal(batch['inputs'][1], torch.full((3, 2, 2), 7.0))
    assert batch['data_samples'][1].img_path == 'good.jpg' and len(batch['inputs']) == 2
    with pytest.raises(NonFinitePixelsError, match='20 images drawn in place of img1.tiff all have non-finite'):
        hook.before_train_iter(_runner(dataset[:1]), 0, _batch(torch.ones(3, 2, 2), nan.clone()))


def test_options():
    with pytest.raises(ValueError):
        NonFinitePixelsHook(action='warn')
    hook = NonFinitePixelsHook()
    hook.before_run(_runner(nonfinite_pixels='skip'))
    assert hook.action == 'skip'
    with pytest.raises(UserError, match="nonfinite_pixels must be 'stop', 'skip'"):
        NonFinitePixelsHook().before_run(_runner(nonfinite_pixels=dict(action='skip', max_skips=3)))
    given = NonFinitePixelsHook(action='stop')
    given.before_run(_runner(nonfinite_pixels='skip'))
    assert given.action == 'stop'  # the hook's own argument wins
