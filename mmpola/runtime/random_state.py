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
  of that epoch, before its data loader iterator is created;
* epoch-based loops resumed from a checkpoint taken in the middle of an epoch (on SIGTERM, see
  :class:`mmpola.runtime.saving.SafeCheckpointHook`): the batches of that epoch already trained are
  loaded and discarded (like mmengine's replay in iteration-based loops), then the states are
  restored.

Every rank's states are saved (gathered by ``SafeCheckpointHook`` just before it writes, see
:meth:`RandomStateHook.gather_for_checkpoint`) and each rank of the resumed run gets its own back.

Data workers of epoch-based loops (iteration-based loops keep one stream of batches from the start,
which mmengine's replay reproduces), through the data loader's public ``worker_init_fn`` and
``collate_fn``:

* each worker starts from a seed of (seed, epoch, rank, worker id) instead of mmengine's
  (seed, rank, worker id), so workers started anew every epoch (``persistent_workers=False``) no
  longer repeat the same random numbers every epoch, and a resumed run's workers start where the
  interrupted run's did;
* persistent workers carry their generators from one epoch to the next, which a resumed run, whose
  new workers start from a seed, cannot repeat. Each batch therefore brings back the generator
  states of the worker that made it (under the batch key :data:`WORKER_STATE_KEY`, removed before
  the model sees the batch; batches must be dicts, as mmengine's collate functions make them); the
  states at the start of an epoch go into the checkpoint, and the workers of the resumed run start
  from them.

It also gives each data loader its own torch generator, so creating a data loader iterator (which
draws a seed) never consumes the global generator that the model's random layers use; a run then
does not depend on when validation happened. With these and ``randomness=dict(seed=...)``, a run
killed after checkpoint k and resumed ends with the same weights as an uninterrupted run
(tests/runtime/test_random_state.py, also with persistent data workers and with two processes).
Loading weights with ``load_from`` (fine-tuning) leaves the generators alone.
"""
import random

import numpy as np
import torch
from mmengine import dist as mmdist
from mmengine.hooks import Hook
from mmengine.runner import IterBasedTrainLoop

from mmpola.registry import HOOKS

from .resume import EPOCH_BATCHES_DONE

__all__ = ['RandomStateHook', 'CHECKPOINT_KEY', 'WORKER_STATE_KEY']

CHECKPOINT_KEY = 'mmpola_rng_state'
# batch key under which a persistent data worker reports (worker id, its generator states)
WORKER_STATE_KEY = 'mmpola_worker_rng_state'


def _generator_states():
    return dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state())


def _set_generator_states(state):
    random.setstate(_as_python_state(state['python']))
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])


def _as_python_state(state):
    """random.setstate needs tuples; a checkpoint may hold lists after serialisation."""
    version, internal, gauss = state
    return version, tuple(internal), gauss


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
    """A data loader whose next iterator skips (loads and discards) its first ``count`` batches, once;
    ``seen(batch)`` is called for each skipped batch."""

    def __init__(self, loader, count, restore, seen):
        self._loader, self._count, self._restore, self._seen = loader, count, restore, seen

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        iterator = _RestoreBeforeBatch(iter(self._loader), self._count, self._restore)
        for _ in range(self._count):
            self._seen(next(iterator))
        return iterator


class _WorkerStart:
    """``worker_init_fn`` of the training data loader: the loader's own, then the worker's generators
    from (seed, epoch, rank, worker id), or from the states a resumed run brought for it.

    ``epoch`` and ``resume_states`` are set by the hook in the main process before the workers
    start; each worker sees the values of when it was started (forked or spawned)."""

    def __init__(self, worker_init_fn, seed, rank):
        self.worker_init_fn, self.seed, self.rank = worker_init_fn, seed, rank
        self.epoch = 0
        self.resume_states = {}

    def __call__(self, worker_id):
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        state = self.resume_states.get(worker_id)
        if state is not None:
            _set_generator_states(state)
            return
        seed = int(np.random.SeedSequence([self.seed, self.epoch, self.rank, worker_id]).generate_state(1)[0])
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)


class _ReportStates:
    """``collate_fn`` of persistent workers: the loader's own, then (worker id, generator states after
    this batch) under :data:`WORKER_STATE_KEY` of the batch."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn

    def __call__(self, samples):
        batch = self.collate_fn(samples)
        info = torch.utils.data.get_worker_info()
        if info is not None and isinstance(batch, dict):
            batch[WORKER_STATE_KEY] = (info.id, _generator_states())
        return batch


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
        self._workers = None  # _WorkerStart of an epoch-based training loader with workers
        self._persistent = False
        self._worker_states = {}  # worker id -> its states after the latest batch it made
        self._epoch_start_worker_states = {}
        self._unreported = False

    # -- own generators for the data loaders, worker seeding -------------------------------------
    def before_run(self, runner):
        seed = runner.seed if isinstance(runner.seed, int) else 0
        for offset, (name, loop) in enumerate(_loops(runner)):
            loader = loop.dataloader
            if isinstance(loader, torch.utils.data.DataLoader) and name not in self._generators:
                generator = torch.Generator().manual_seed(seed + 7919 * (offset + 1))
                loader.generator = generator  # draws iterator seeds; DataLoader allows resetting it
                self._generators[name] = generator
                if name == 'train' and loader.num_workers > 0 and not isinstance(loop, IterBasedTrainLoop):
                    # the workers start at the first epoch's iterator, after this
                    self._workers = _WorkerStart(loader.worker_init_fn, seed, mmdist.get_rank())
                    loader.worker_init_fn = self._workers
                    self._persistent = bool(loader.persistent_workers)
                    if self._persistent:
                        loader.collate_fn = _ReportStates(loader.collate_fn)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if self._persistent and not self._take_report(data_batch) and not self._unreported:
            self._unreported = True
            runner.logger.warning(
                'RandomStateHook: the batches of the persistent data workers are not dicts, so their random '
                'generator states cannot be kept: a resumed run will continue correctly, but its random '
                'augmentations will not repeat the interrupted run exactly.')

    def _take_report(self, batch):
        """Keep (and remove from ``batch``) the states its worker reported; whether there were any."""
        report = batch.pop(WORKER_STATE_KEY, None) if isinstance(batch, dict) else None
        if report is None:
            return False
        worker_id, state = report
        self._worker_states[worker_id] = state
        return True

    # -- save -----------------------------------------------------------------------------------
    def _state(self, mid_epoch=False):
        state = dict(_generator_states(), generators={name: g.get_state() for name, g in self._generators.items()})
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        workers = self._epoch_start_worker_states if mid_epoch else self._worker_states
        if self._persistent and workers:
            state['workers'] = dict(workers)
        return state

    def gather_for_checkpoint(self, runner, mid_epoch=False):
        """Collect every rank's states (a collective: all ranks call it right before a checkpoint is
        written). ``mid_epoch``: the checkpoint resumes in the middle of the current epoch, so the
        persistent workers' states of the epoch's start are kept."""
        state = self._state(mid_epoch)
        if mmdist.get_world_size() > 1:
            self._gathered = mmdist.all_gather_object(state)
        else:
            self._gathered = [state]

    def before_save_checkpoint(self, runner, checkpoint):
        ranks, self._gathered = self._gathered, None
        mid_epoch = bool((checkpoint.get('meta') or {}).get(EPOCH_BATCHES_DONE))
        state = dict(ranks[0]) if ranks else self._state(mid_epoch)  # rank 0's at the top, as single-process
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
        workers = self._pending.get('workers') or {}
        if self._workers is not None and self._persistent:
            self._workers.resume_states = {int(k): v for k, v in workers.items()}
            self._worker_states = dict(self._workers.resume_states)

    def _restore(self):
        state, self._pending = self._pending, None
        if state is None:
            return
        _set_generator_states(state)
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
        if self._workers is not None:
            self._workers.epoch = runner.epoch
            self._epoch_start_worker_states = dict(self._worker_states)
        if self._skip:
            # a checkpoint from the middle of this epoch: skip its trained batches, then restore
            self._skipping = loop.dataloader
            loop.dataloader = _SkipBatches(loop.dataloader, self._skip, self._restore, self._take_report)
            runner.logger.warning(f'Advance dataloader {self._skip} steps to skip data that has already been '
                                  'trained in this epoch')
            self._skip = 0
        elif self._pending is not None:
            self._restore()

    def after_train_epoch(self, runner):
        if self._skipping is not None:
            runner.train_loop.dataloader, self._skipping = self._skipping, None
