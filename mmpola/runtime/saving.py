"""Checkpoints that survive kills, full disks and SIGTERM.

mmengine's ``CheckpointHook`` removes the oldest kept checkpoint *before* the new one is written and
writes the new one in place. A kill during the save (or a disk that fills) then leaves a partial
``epoch_N.pth`` and, with ``max_keep_ckpts=1``, no complete checkpoint at all while
``last_checkpoint`` names a deleted file. :class:`SafeCheckpointHook` (the shipped configs'
``default_hooks.checkpoint``; it takes every argument of ``CheckpointHook``) orders the steps so that
nothing is lost at any point:

1. every rank gathers what must travel with the checkpoint (per-rank random states, see
   :class:`mmpola.runtime.random_state.RandomStateHook`);
2. the checkpoint is written under a temporary name in the same folder and renamed to its final name
   (:mod:`mmpola.runtime.atomic_files`);
3. only then is ``last_checkpoint`` replaced (the same way) and are checkpoints beyond
   ``max_keep_ckpts`` (and a previous ``best_*`` checkpoint) removed.

A write error (disk full, quota, file size limit) removes the temporary file and stops training with
:class:`CheckpointSaveError`, one line naming the file, the cause and the intact previous checkpoint.

On SIGTERM or Ctrl-C (:mod:`mmpola.runtime.signals`; also when the signal reaches the whole process
group: the data workers of the training and validation loaders ignore it) the current iteration is
finished, a resumable checkpoint is written the same way and training stops with
:class:`mmpola.runtime.signals.TrainingInterrupted`. In an epoch-based loop a checkpoint taken in the
middle of an epoch is named ``iter_<N>.pth``; its meta records how many batches of the epoch were done
(:data:`mmpola.runtime.resume.EPOCH_BATCHES_DONE`). Such a checkpoint is only a resume point: once a
later checkpoint is complete (the next regular one, or another interruption's), it is removed, like the
checkpoints beyond ``max_keep_ckpts`` (kept when ``max_keep_ckpts`` keeps every checkpoint). All ranks
stop at the same iteration.

``--resume`` without a path: before mmengine reads ``last_checkpoint``, the hook makes sure it names a
readable file (:func:`mmpola.runtime.resume.choose_resume_checkpoint`).
"""
import os
import os.path as osp

from mmengine import dist as mmdist
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook

from mmpola.errors import MMPolaUserError
from mmpola.registry import HOOKS

from .atomic_files import fsync_dir, fsync_file, is_part_file, part_name, write_text_atomic
from .param_groups import merge_saved_param_groups
from .resume import EPOCH_BATCHES_DONE, LAST_CHECKPOINT, choose_resume_checkpoint, loaded_checkpoint, lr_change_note
from .signals import StopSignals, TrainingInterrupted, ignore_stop_signals_in_workers, workers_may_end

__all__ = ['CheckpointSaveError', 'SafeCheckpointHook', 'INTERRUPT_CHECKPOINTS']

# message hub key: the resume points written in the middle of an epoch that a later checkpoint supersedes
INTERRUPT_CHECKPOINTS = 'mmpola_interrupt_checkpoints'


class CheckpointSaveError(MMPolaUserError, OSError):
    """A checkpoint could not be written (disk full, quota, permissions); earlier ones are intact."""

    exit_code = 1


# --------------------------------------------------------------------------------------------
# the hook

class _DeferredRemoval:
    """A file backend whose ``remove`` / ``rmtree`` wait until :meth:`flush` (after a save succeeded)."""

    def __init__(self, backend):
        self._backend, self.pending = backend, []

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def remove(self, path):
        self.pending.append(('remove', path))

    def rmtree(self, path):
        self.pending.append(('rmtree', path))

    def flush(self):
        for method, path in self.pending:
            getattr(self._backend, method)(path)
        self.pending = []


class _AtomicSaveRunner:
    """The runner as mmengine's best-checkpoint code sees it: ``save_checkpoint`` goes through the hook."""

    def __init__(self, runner, hook):
        self._runner, self._hook = runner, hook

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def save_checkpoint(self, out_dir, filename, file_client_args=None, backend_args=None, **kwargs):
        self._hook._write(self._runner, filename, **kwargs)


@HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with atomic saves, removal after success, SIGTERM / Ctrl-C saves (see module doc).

    Takes every argument of ``CheckpointHook``, plus ``save_on_sigterm`` (default True: SIGTERM and
    SIGINT are acted upon after the current iteration).
    """

    def __init__(self, *args, save_on_sigterm=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.save_on_sigterm = save_on_sigterm
        self._signals = StopSignals()
        self._stop_after_epoch = False
        self._last_saved = None

    # ---------------------------------------------------------------- set-up
    def before_run(self, runner):
        """``--resume`` without a path: a readable checkpoint, before mmengine reads ``last_checkpoint``."""
        choose_resume_checkpoint(runner)

    def after_load_checkpoint(self, runner, checkpoint):
        """On a resume: a checkpoint with one optimizer parameter group per parameter merged into the run's
        groups (merge_saved_param_groups), and a config's changed lr said once: the checkpoint's wins
        (lr_change_note)."""
        if getattr(runner, '_resume', False):
            optimizer = getattr(getattr(runner, 'optim_wrapper', None), 'optimizer', None)
            merged = merge_saved_param_groups(checkpoint, optimizer)
            if merged is not None:
                runner.logger.info(merged)
            filename = loaded_checkpoint(runner)
            note = lr_change_note(optimizer, checkpoint, filename or 'the checkpoint')
            if note is not None:
                runner.logger.warning(note)

    def before_train(self, runner):
        super().before_train(runner)
        self._last_saved = runner.message_hub.get_info('last_ckpt')
        if self._local() and mmdist.is_main_process() and osp.isdir(self.out_dir):
            for name in os.listdir(self.out_dir):  # leftovers of a run killed while saving
                if is_part_file(name):
                    os.remove(osp.join(self.out_dir, name))
                    runner.logger.info(f'[mmpola] removed {name}, the unfinished save of an interrupted run')
        if self.save_on_sigterm:
            self._signals.install()  # a signal is acted upon after the current iteration (after_train_iter)
            for loop in (runner.train_loop, getattr(runner, '_val_loop', None)):  # their workers leave it to us
                ignore_stop_signals_in_workers(getattr(loop, 'dataloader', None))

    def after_train(self, runner):
        super().after_train(runner)
        self._signals.restore()
        workers_may_end()

    def _local(self):
        return isinstance(getattr(self, 'file_backend', None), (LocalBackend, _DeferredRemoval)) and \
            isinstance(getattr(self.file_backend, '_backend', self.file_backend), LocalBackend)

    # ---------------------------------------------------------------- saving
    def _write(self, runner, filename, mid_epoch=False, **save_kwargs):
        """Write one checkpoint atomically (every rank calls this; rank 0 writes). ``mid_epoch``: the
        checkpoint resumes in the middle of the current epoch."""
        runner = getattr(runner, '_runner', runner)
        for hook in runner.hooks:  # collective: e.g. RandomStateHook gathers every rank's generators
            if hasattr(hook, 'gather_for_checkpoint'):
                hook.gather_for_checkpoint(runner, mid_epoch=mid_epoch)
        final = self.file_backend.join_path(self.out_dir, filename)
        if not self._local():
            runner.save_checkpoint(self.out_dir, filename, self.file_client_args,
                                   backend_args=self.backend_args, **save_kwargs)
            return final
        part = osp.join(self.out_dir, part_name(filename))
        error = None
        if mmdist.is_main_process():
            try:
                runner.save_checkpoint(self.out_dir, osp.basename(part), self.file_client_args,
                                       backend_args=self.backend_args, **save_kwargs)
                fsync_file(part)
                os.replace(part, final)
                fsync_dir(self.out_dir)
            except OSError as e:
                if osp.exists(part):
                    os.remove(part)
                error = f'{e.strerror or e}' + (f' (errno {e.errno})' if e.errno else '')
        if mmdist.get_world_size() > 1:  # every rank stops together
            error = _broadcast(error)
        if error is not None:
            previous = (f'the previous checkpoint {self._last_saved} is intact and {LAST_CHECKPOINT} still names it'
                        if self._last_saved else 'no earlier checkpoint of this run exists')
            raise CheckpointSaveError(
                f'could not save checkpoint {final}: {error}. Nothing was lost: {previous}, and no partial '
                f'file was left. Free disk space (or use a --work-dir on a larger disk), then continue '
                f'with --resume.')
        return final

    def _save_checkpoint_with_step(self, runner, step, meta):
        """mmengine's steps in a safe order: write, then ``last_checkpoint``, then remove old ones."""
        runner = getattr(runner, '_runner', runner)
        removals = []
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                removals.append(self.keep_ckpt_ids.popleft())
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))
        filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        self._write(runner, filename, save_optimizer=self.save_optimizer,
                    save_param_scheduler=self.save_param_scheduler, meta=meta, by_epoch=self.by_epoch, **self.args)
        self._saved(runner, self.last_ckpt)
        self._remove_interrupt_checkpoints(runner)
        if mmdist.is_main_process():
            for old in removals:
                path = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(old))
                if path == self.last_ckpt:
                    continue
                if self.file_backend.isfile(path):
                    self.file_backend.remove(path)
                elif self.file_backend.isdir(path):
                    self.file_backend.rmtree(path)

    def _remove_interrupt_checkpoints(self, runner, keep=None):
        """Remove the mid-epoch resume points a complete later checkpoint supersedes (all but ``keep``),
        unless ``max_keep_ckpts`` keeps every checkpoint."""
        pending = list(runner.message_hub.get_info(INTERRUPT_CHECKPOINTS) or [])
        if not pending or not self._local():
            return
        left = [path for path in pending if path == keep]
        if self.max_keep_ckpts > 0 and mmdist.is_main_process():
            for path in pending:  # only this run's folder: a run resumed from a copy leaves the original alone
                if path not in (keep, self.last_ckpt) and osp.isfile(path) \
                        and osp.dirname(osp.abspath(path)) == osp.abspath(self.out_dir):
                    os.remove(path)
                    runner.logger.info(f'[mmpola] removed {path}, the resume point of an interrupted epoch, now that '
                                       f'{self.last_ckpt} is saved')
        runner.message_hub.update_info(INTERRUPT_CHECKPOINTS, left if self.max_keep_ckpts > 0 else [])

    def _saved(self, runner, path):
        self._last_saved = path
        if mmdist.is_main_process():
            write_text_atomic(osp.join(runner.work_dir, LAST_CHECKPOINT), path)

    def _save_best_checkpoint(self, runner, metrics):
        """mmengine's best-checkpoint logic; its saves are atomic, its removals wait for them."""
        backend = self.file_backend
        self.file_backend = deferred = _DeferredRemoval(backend)
        try:
            super()._save_best_checkpoint(_AtomicSaveRunner(runner, self), metrics)
        finally:
            self.file_backend = backend
        if mmdist.is_main_process():
            deferred.flush()

    # ---------------------------------------------------------------- SIGTERM
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        super().after_train_iter(runner, batch_idx, data_batch, outputs)
        if not self.save_on_sigterm or self._stop_after_epoch or not self._signals.requested():
            return
        done = runner.iter + 1  # the loop counts this iteration after the hooks
        if not self.by_epoch:
            if self.last_ckpt != self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(done)):
                self._save_checkpoint_with_step(runner, done, dict(epoch=runner.epoch, iter=done))
            self._interrupted(runner, done)
        # batches of this epoch trained so far (batch_idx restarts at 0 in an epoch resumed in its middle)
        per_epoch = len(runner.train_loop.dataloader)
        batches_done = done - runner.epoch * per_epoch
        if batches_done >= per_epoch:
            self._stop_after_epoch = True  # the epoch is complete: save it as such in after_train_epoch
            return
        filename = f'iter_{done}.pth'
        meta = {'epoch': runner.epoch, 'iter': done, EPOCH_BATCHES_DONE: batches_done}
        self.last_ckpt = self.file_backend.join_path(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        pending = list(runner.message_hub.get_info(INTERRUPT_CHECKPOINTS) or [])
        runner.message_hub.update_info(INTERRUPT_CHECKPOINTS, pending + [self.last_ckpt])  # saved with it
        self._write(runner, filename, mid_epoch=True, save_optimizer=self.save_optimizer,
                    save_param_scheduler=self.save_param_scheduler, meta=meta, by_epoch=False, **self.args)
        self._saved(runner, self.last_ckpt)
        self._remove_interrupt_checkpoints(runner, keep=self.last_ckpt)
        self._interrupted(runner, done)

    def after_train_epoch(self, runner):
        super().after_train_epoch(runner)
        if not self._stop_after_epoch:
            return
        step = runner.epoch + 1
        if self.last_ckpt != self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(step)):
            self._save_checkpoint_with_step(runner, step, dict(epoch=step, iter=runner.iter))
        self._interrupted(runner, runner.iter)

    def _interrupted(self, runner, done):
        self._signals.restore()
        name = self._signals.name()
        message = (f'training stopped by {name} after iteration {done}/{runner.max_iters}: the resumable '
                   f'checkpoint {self.last_ckpt} is saved and named in {LAST_CHECKPOINT}; continue with '
                   'tools/train.py CONFIG --resume (same --work-dir).')
        runner.logger.warning(f'[mmpola] {message}')
        raise TrainingInterrupted(message, self._signals.signum())


def _broadcast(value):
    holder = [value]
    mmdist.broadcast_object_list(holder, src=0)
    return holder[0]
