"""Exact resumption: random number generator states travel with the checkpoints.

mmengine restores weights, optimizer, schedulers, iteration and the data order on ``--resume``, but
not the random number generators. After a resume, drop-path masks, RPN/RoI sampling and random
augmentations therefore differ from the uninterrupted run, and the weights drift apart.
:class:`RandomStateHook` saves the python, numpy, torch (and CUDA) generator states in every
checkpoint and puts them back at the point where the interrupted run would have continued:

* iteration-based loops: mmengine replays (loads and discards) the batches already trained, which
  consumes random numbers when ``num_workers=0``; the states are restored right after that replay,
  before the next batch is loaded;
* epoch-based loops: resumption starts at an epoch boundary; the states are restored at the start
  of that epoch, before its data loader iterator is created.

It also gives each data loader its own torch generator, so creating a data loader iterator (which
draws a seed) never consumes the global generator that the model's random layers use; a run then
does not depend on when validation happened. With these and ``randomness=dict(seed=...)`` (mmengine
seeds each data worker from the seed), a run killed after checkpoint k and resumed ends with the same
weights as an uninterrupted run (tests/test_tools/test_kill_resume.py). Loading weights with
``load_from`` (fine-tuning) leaves the generators alone.
"""
import random

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import IterBasedTrainLoop

CHECKPOINT_KEY = 'mmpola_rng_state'


def _loops(runner):
    for name in ('_train_loop', '_val_loop', '_test_loop'):
        loop = getattr(runner, name, None)
        if loop is not None and hasattr(loop, 'dataloader'):
            yield name.strip('_').replace('_loop', ''), loop


class _RestoreBeforeBatch:
    """Wraps a data iterator; calls ``restore()`` just before the ``index``-th ``next`` (0-based)."""

    def __init__(self, iterator, index, restore):
        self._iterator, self._remaining, self._restore = iterator, index, restore

    def __getattr__(self, name):  # _InfiniteDataloaderIterator's other attributes
        return getattr(self._iterator, name)

    def __iter__(self):
        return self

    def __next__(self):
        if self._restore is not None:
            if self._remaining == 0:
                self._restore()
                self._restore = None
            else:
                self._remaining -= 1
        return next(self._iterator)


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Save random generator states in checkpoints and restore them on resume (see module doc)."""

    priority = 'VERY_HIGH'

    def __init__(self):
        self._generators = {}
        self._pending = None

    # -- own generators for the data loaders ----------------------------------------------------
    def before_run(self, runner):
        seed = runner.seed if isinstance(runner.seed, int) else 0
        for offset, (name, loop) in enumerate(_loops(runner)):
            loader = loop.dataloader
            if isinstance(loader, torch.utils.data.DataLoader) and name not in self._generators:
                generator = torch.Generator().manual_seed(seed + 7919 * (offset + 1))
                loader.generator = generator  # draws iterator seeds; DataLoader allows resetting it
                self._generators[name] = generator

    # -- save -----------------------------------------------------------------------------------
    def before_save_checkpoint(self, runner, checkpoint):
        state = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                     generators={name: g.get_state() for name, g in self._generators.items()})
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint[CHECKPOINT_KEY] = state

    # -- restore --------------------------------------------------------------------------------
    def after_load_checkpoint(self, runner, checkpoint):
        if not getattr(runner, '_resume', False):
            return  # load_from (fine-tuning): keep this run's own random stream
        self._pending = checkpoint.get(CHECKPOINT_KEY)
        if self._pending is None:
            runner.logger.warning(
                'The resumed checkpoint has no random generator states (saved without RandomStateHook): '
                'training continues correctly, but random layers and augmentations will not repeat the '
                'interrupted run exactly.')

    def _restore(self):
        state, self._pending = self._pending, None
        if state is None:
            return
        random.setstate(_as_python_state(state['python']))
        np.random.set_state(state['numpy'])
        torch.set_rng_state(state['torch'])
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['cuda'])
        for name, generator_state in state.get('generators', {}).items():
            if name in self._generators:
                self._generators[name].set_state(generator_state)

    def before_train(self, runner):
        if self._pending is None:
            return
        loop = runner.train_loop
        if isinstance(loop, IterBasedTrainLoop) and hasattr(loop, 'dataloader_iterator'):
            # restore after mmengine's replay of the loop._iter batches already trained
            loop.dataloader_iterator = _RestoreBeforeBatch(loop.dataloader_iterator, loop.iter, self._restore)

    def before_train_epoch(self, runner):
        if self._pending is not None and not isinstance(runner.train_loop, IterBasedTrainLoop):
            self._restore()


def _as_python_state(state):
    """random.setstate needs tuples; a checkpoint may hold lists after serialisation."""
    version, internal, gauss = state
    return version, tuple(internal), gauss


def add_random_state_hook(cfg):
    """Append ``RandomStateHook`` to ``cfg.custom_hooks`` unless the config already has it."""
    hooks = list(cfg.get('custom_hooks', None) or [])
    if not any(isinstance(h, dict) and h.get('type') in ('RandomStateHook', RandomStateHook) for h in hooks):
        hooks.append(dict(type='RandomStateHook'))
    cfg.custom_hooks = hooks
    return cfg
