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

* epoch-based loops resumed from a checkpoint taken in the middle of an epoch (on SIGTERM, see
  :class:`mmpola.runtime.checkpointing.SafeCheckpointHook`): the batches of that epoch already trained
  are loaded and discarded (like mmengine's replay in iteration-based loops), then the states are
  restored.

Every rank's states are saved (gathered by ``SafeCheckpointHook`` just before it writes, see
:meth:`RandomStateHook.gather_for_checkpoint`) and each rank of the resumed run gets its own back.

Data workers. mmengine seeds each worker once, from the seed, its rank and its id. Persistent workers
(``persistent_workers=True``) then carry their generators from one epoch to the next, which a resumed
run, whose new workers start from the seed again, cannot repeat. In epoch-based loops this hook
therefore re-seeds every worker at the start of each epoch from (seed, epoch, rank, worker id): the
random augmentations of an epoch no longer depend on the epochs before it in the same process (and
non-persistent workers no longer repeat the same random numbers every epoch). Iteration-based loops
keep one stream of batches from the start, which mmengine's replay reproduces.

It also gives each data loader its own torch generator, so creating a data loader iterator (which
draws a seed) never consumes the global generator that the model's random layers use; a run then
does not depend on when validation happened. With these and ``randomness=dict(seed=...)``, a run
killed after checkpoint k and resumed ends with the same weights as an uninterrupted run
(tests/tools/test_kill_resume.py, also with persistent data workers and with two processes).
Loading weights with ``load_from`` (fine-tuning) leaves the generators alone.
"""
import multiprocessing
import random

import numpy as np
import torch
from mmengine import dist as mmdist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import IterBasedTrainLoop

from .checkpointing import EPOCH_BATCHES_DONE

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


class _SkipBatches:
    """A data loader whose next iterator skips (loads and discards) its first ``count`` batches, once."""

    def __init__(self, loader, count, restore):
        self._loader, self._count, self._restore = loader, count, restore

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        iterator = _RestoreBeforeBatch(iter(self._loader), self._count, self._restore)
        for _ in range(self._count):
            next(iterator)
        return iterator


class _EpochSeededWorkers:
    """``worker_init_fn`` wrapper: the worker re-seeds itself whenever the shared epoch number changes."""

    def __init__(self, worker_init_fn, epoch, seed, rank):
        self.worker_init_fn, self.epoch, self.seed, self.rank = worker_init_fn, epoch, seed, rank

    def __call__(self, worker_id):
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        dataset = torch.utils.data.get_worker_info().dataset
        fetch = getattr(type(dataset), '__getitems__', None)
        seeded = [None]

        def getitems(indices):  # called by the worker's fetcher for every batch
            epoch = self.epoch.value
            if epoch != seeded[0]:
                seeded[0] = epoch
                worker_seed = int(np.random.SeedSequence([self.seed, epoch, self.rank, worker_id]).generate_state(1)[0])
                random.seed(worker_seed)
                np.random.seed(worker_seed)
                torch.manual_seed(worker_seed)
            return fetch(dataset, indices) if fetch is not None else [dataset[i] for i in indices]

        dataset.__getitems__ = getitems


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Save random generator states in checkpoints and restore them on resume (see module doc)."""

    priority = 'VERY_HIGH'

    def __init__(self):
        self._generators = {}
        self._pending = None
        self._gathered = None
        self._skip = 0
        self._skipping = None
        self._worker_epoch = None

    # -- own generators for the data loaders, epoch-seeded workers --------------------------------
    def before_run(self, runner):
        seed = runner.seed if isinstance(runner.seed, int) else 0
        for offset, (name, loop) in enumerate(_loops(runner)):
            loader = loop.dataloader
            if isinstance(loader, torch.utils.data.DataLoader) and name not in self._generators:
                generator = torch.Generator().manual_seed(seed + 7919 * (offset + 1))
                loader.generator = generator  # draws iterator seeds; DataLoader allows resetting it
                self._generators[name] = generator
                if name == 'train' and loader.num_workers > 0 and not isinstance(loop, IterBasedTrainLoop):
                    # workers start at the first epoch's iterator, after this
                    context = loader.multiprocessing_context or multiprocessing.get_context()
                    if isinstance(context, str):
                        context = multiprocessing.get_context(context)
                    self._worker_epoch = context.RawValue('q', -1)
                    loader.worker_init_fn = _EpochSeededWorkers(loader.worker_init_fn, self._worker_epoch, seed,
                                                                mmdist.get_rank())

    # -- save -----------------------------------------------------------------------------------
    def _state(self):
        state = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                     generators={name: g.get_state() for name, g in self._generators.items()})
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        return state

    def gather_for_checkpoint(self, runner):
        """Collect every rank's states (a collective: all ranks call it right before a checkpoint is written)."""
        state = self._state()
        if mmdist.get_world_size() > 1:
            self._gathered = mmdist.all_gather_object(state)
        else:
            self._gathered = [state]

    def before_save_checkpoint(self, runner, checkpoint):
        ranks, self._gathered = self._gathered, None
        state = dict(ranks[0]) if ranks else self._state()  # rank 0's at the top, as single-process runs
        if ranks and len(ranks) > 1:
            state['per_rank'] = ranks
        checkpoint[CHECKPOINT_KEY] = state

    # -- restore --------------------------------------------------------------------------------
    def after_load_checkpoint(self, runner, checkpoint):
        if not getattr(runner, '_resume', False):
            return  # load_from (fine-tuning): keep this run's own random stream
        self._skip = int((checkpoint.get('meta') or {}).get(EPOCH_BATCHES_DONE, 0) or 0)
        saved = checkpoint.get(CHECKPOINT_KEY)
        if saved is None:
            runner.logger.warning(
                'The resumed checkpoint has no random generator states (saved without RandomStateHook): '
                'training continues correctly, but random layers and augmentations will not repeat the '
                'interrupted run exactly.')
            self._pending = None
            return
        world_size, rank = mmdist.get_world_size(), mmdist.get_rank()
        per_rank = saved.get('per_rank') or [saved]
        if len(per_rank) == world_size:
            self._pending = per_rank[rank]
        else:
            self._pending = per_rank[rank % len(per_rank)]
            runner.logger.warning(
                f'The resumed checkpoint holds the random generator states of {len(per_rank)} process(es), this '
                f'run has {world_size}: training continues correctly, but random layers and augmentations will '
                'not repeat the interrupted run exactly.')

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
        loop = runner.train_loop
        if isinstance(loop, IterBasedTrainLoop):
            return
        if self._worker_epoch is not None:
            self._worker_epoch.value = runner.epoch
        if self._skip:
            # a checkpoint from the middle of this epoch: skip its trained batches, then restore
            self._skipping = loop.dataloader
            loop.dataloader = _SkipBatches(loop.dataloader, self._skip, self._restore)
            runner.logger.warning(f'Advance dataloader {self._skip} steps to skip data that has already been '
                                  'trained in this epoch')
            self._skip = 0
        elif self._pending is not None:
            self._restore()

    def after_train_epoch(self, runner):
        if self._skipping is not None:
            runner.train_loop.dataloader, self._skipping = self._skipping, None


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
