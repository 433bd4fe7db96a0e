"""Checkpoints that survive kills, full disks and SIGTERM; ``--resume`` that skips a broken latest file.

mmengine's ``CheckpointHook`` removes the oldest kept checkpoint *before* the new one is written and
writes the new one in place. A kill during the save (or a disk that fills) then leaves a partial
``epoch_N.pth`` and, with ``max_keep_ckpts=1``, no complete checkpoint at all while
``last_checkpoint`` names a deleted file. :class:`SafeCheckpointHook` (what the tools use instead of
``CheckpointHook``, same arguments) orders the steps so that nothing is lost at any point:

1. every rank gathers what must travel with the checkpoint (per-rank random states, see
   :class:`mmpola.runtime.resume.RandomStateHook`);
2. the checkpoint is written under a temporary name in the same folder (``.<name>.<pid>.part``),
   flushed to disk (fsync) and renamed to its final name (atomic on POSIX file systems);
3. only then is ``last_checkpoint`` replaced (also write-fsync-rename) and are checkpoints beyond
   ``max_keep_ckpts`` (and a previous ``best_*`` checkpoint) removed.

A write error (disk full, quota, file size limit) removes the temporary file and stops training with
:class:`CheckpointSaveError`, one line naming the file, the cause and the intact previous checkpoint.

On SIGTERM (what slurm and most schedulers send before killing a job) the current iteration is
finished, a resumable checkpoint is written the same way and training stops with
:class:`TrainingInterrupted` (exit status 143, the usual status of a SIGTERM-ended process). In an
epoch-based loop a checkpoint taken in the middle of an epoch is named ``iter_<N>.pth``; its meta
records how many batches of the epoch were done, and ``RandomStateHook`` skips exactly those when the
run is resumed. All ranks stop at the same iteration (one flag is all-reduced per iteration).

``--resume`` without a path (``resume=True`` and no ``load_from``): the hook picks the checkpoint
before mmengine does. If the file named in ``last_checkpoint`` is missing or unreadable it warns and
falls back to the newest readable ``epoch_*.pth`` / ``iter_*.pth`` of the work dir.
"""
import glob
import os
import os.path as osp
import re
import signal
import threading
import zipfile

import torch
from mmengine import dist as mmdist
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from mmpola.errors import MMPolaUserError

__all__ = ['CheckpointSaveError', 'SafeCheckpointHook', 'TrainingInterrupted', 'add_safe_checkpointing',
           'find_resumable_checkpoint', 'write_text_atomic']

LAST_CHECKPOINT = 'last_checkpoint'
# meta key of a checkpoint taken in the middle of an epoch: the batches of that epoch already trained
EPOCH_BATCHES_DONE = 'mmpola_epoch_batches_done'
_PART_RE = re.compile(r'^\..+\.\d+\.part$')
_STEP_RE = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')


class CheckpointSaveError(MMPolaUserError, OSError):
    """A checkpoint could not be written (disk full, quota, permissions); earlier ones are intact."""

    exit_code = 1


class TrainingInterrupted(MMPolaUserError):
    """Training stopped on SIGTERM after saving a resumable checkpoint."""

    exit_code = 128 + signal.SIGTERM


# --------------------------------------------------------------------------------------------
# atomic files

def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories; the rename is still atomic
        pass
    finally:
        os.close(fd)


def _fsync_file(path):
    with open(path, 'rb+') as f:
        os.fsync(f.fileno())


def _part_name(filename):
    return f'.{filename}.{os.getpid()}.part'


def write_text_atomic(path, text):
    """Write ``text`` to ``path`` so that a reader sees the old or the new content, never a mix."""
    folder, name = osp.split(osp.abspath(path))
    tmp = osp.join(folder, _part_name(name))
    try:
        with open(tmp, 'w') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(folder)


# --------------------------------------------------------------------------------------------
# which checkpoint --resume continues from

def _readable(path):
    """Whether ``path`` is a complete checkpoint file (cheap: the zip directory, read last, is intact)."""
    if not osp.isfile(path) or osp.getsize(path) == 0:
        return False, 'missing' if not osp.isfile(path) else 'empty'
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            return False, f'unreadable ({e})'
        return (True, '') if any(n.endswith('data.pkl') for n in names) else (False, 'not a torch checkpoint')
    try:  # a legacy (non-zip) torch file: only a full load tells
        from mmpola.checkpoint.safe_load import safe_torch_load
        safe_torch_load(path)
    except Exception as e:  # noqa: BLE001  (any failure means: not usable for resuming)
        return False, f'unreadable ({type(e).__name__}: {e})'
    return True, ''


def find_resumable_checkpoint(work_dir):
    """``(path or None, warnings)``: the checkpoint ``--resume`` without a path continues from.

    The file named in ``last_checkpoint`` when it is readable; otherwise the newest readable
    ``epoch_*.pth`` / ``iter_*.pth`` of ``work_dir`` (by modification time, then step number), with
    a warning for each file skipped. ``(None, [])`` when the work dir holds no checkpoint at all.
    """
    warnings = []
    named = None
    marker = osp.join(work_dir, LAST_CHECKPOINT)
    if osp.isfile(marker):
        with open(marker) as f:
            named = f.read().strip() or None
        if named is None:
            warnings.append(f'{marker} is empty')
    if named is not None:
        ok, why = _readable(named)
        if ok:
            return named, warnings
        warnings.append(f'{LAST_CHECKPOINT} names {named}, which is {why}')
    candidates = []
    for path in glob.glob(osp.join(work_dir, '*.pth')):
        match = _STEP_RE.match(osp.basename(path))
        if match and (named is None or osp.abspath(path) != osp.abspath(named)):
            candidates.append((osp.getmtime(path), int(match.group(1)), path))
    for _, _, path in sorted(candidates, reverse=True):
        ok, why = _readable(path)
        if ok:
            return path, warnings
        warnings.append(f'{path} is {why}')
    return None, warnings


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
    """``CheckpointHook`` with atomic saves, removal after success, SIGTERM saves (see module doc).

    Takes every argument of ``CheckpointHook``, plus ``save_on_sigterm`` (default True).
    """

    def __init__(self, *args, save_on_sigterm=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.save_on_sigterm = save_on_sigterm
        self._signal = None
        self._previous_handler = None
        self._stop_after_epoch = False
        self._last_saved = None

    # ---------------------------------------------------------------- set-up
    def before_run(self, runner):
        """``--resume`` without a path: choose a readable checkpoint before mmengine reads ``last_checkpoint``."""
        if not getattr(runner, '_resume', False) or getattr(runner, '_load_from', None) is not None:
            return
        path, warnings = find_resumable_checkpoint(runner.work_dir)
        for text in warnings:
            runner.logger.warning(f'[mmpola] --resume: {text}; skipped.')
        if path is None:
            if warnings:
                from mmpola.errors import UserError
                raise UserError(f'--resume: no readable checkpoint in {runner.work_dir} '
                                f'({"; ".join(warnings)}). Resume explicitly with --resume CHECKPOINT, '
                                'or start again without --resume.')
            runner.logger.warning(f'[mmpola] --resume: no checkpoint in {runner.work_dir} yet; '
                                  'training starts from the beginning.')
            runner._resume = False
            return
        runner.logger.info(f'Auto resumed from the latest checkpoint {path}.')
        runner._load_from = path

    def before_train(self, runner):
        super().before_train(runner)
        self._last_saved = runner.message_hub.get_info('last_ckpt')
        if self._local() and mmdist.is_main_process() and osp.isdir(self.out_dir):
            for name in os.listdir(self.out_dir):  # leftovers of a run killed while saving
                if _PART_RE.match(name):
                    os.remove(osp.join(self.out_dir, name))
                    runner.logger.info(f'[mmpola] removed {name}, the unfinished save of an interrupted run')
        self._signal = None
        if self.save_on_sigterm and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_signal)

    def after_train(self, runner):
        super().after_train(runner)
        self._restore_handler()

    def _restore_handler(self):
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_signal(self, signum, frame):
        self._signal = signum  # acted upon after the current iteration (after_train_iter)

    def _local(self):
        return isinstance(getattr(self, 'file_backend', None), (LocalBackend, _DeferredRemoval)) and \
            isinstance(getattr(self.file_backend, '_backend', self.file_backend), LocalBackend)

    # ---------------------------------------------------------------- saving
    def _write(self, runner, filename, **save_kwargs):
        """Write one checkpoint atomically (every rank calls this; rank 0 writes)."""
        runner = getattr(runner, '_runner', runner)
        for hook in runner.hooks:  # collective: e.g. RandomStateHook gathers every rank's generators
            if hasattr(hook, 'gather_for_checkpoint'):
                hook.gather_for_checkpoint(runner)
        final = self.file_backend.join_path(self.out_dir, filename)
        if not self._local():
            runner.save_checkpoint(self.out_dir, filename, self.file_client_args,
                                   backend_args=self.backend_args, **save_kwargs)
            return final
        part = osp.join(self.out_dir, _part_name(filename))
        error = None
        if mmdist.is_main_process():
            try:
                runner.save_checkpoint(self.out_dir, osp.basename(part), self.file_client_args,
                                       backend_args=self.backend_args, **save_kwargs)
                _fsync_file(part)
                os.replace(part, final)
                _fsync_dir(self.out_dir)
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
        if mmdist.is_main_process():
            for old in removals:
                path = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(old))
                if path == self.last_ckpt:
                    continue
                if self.file_backend.isfile(path):
                    self.file_backend.remove(path)
                elif self.file_backend.isdir(path):
                    self.file_backend.rmtree(path)

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
    def _stop_requested(self):
        flag = self._signal is not None
        if mmdist.get_world_size() > 1:
            tensor = torch.tensor([1.0 if flag else 0.0], device=mmdist.get_comm_device())
            mmdist.all_reduce(tensor, op='max')
            flag = bool(tensor.item() > 0)
        return flag

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        super().after_train_iter(runner, batch_idx, data_batch, outputs)
        if not self.save_on_sigterm or self._stop_after_epoch or not self._stop_requested():
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
        self._write(runner, filename, save_optimizer=self.save_optimizer,
                    save_param_scheduler=self.save_param_scheduler, meta=meta, by_epoch=False, **self.args)
        self._saved(runner, self.last_ckpt)
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
        self._restore_handler()
        name = signal.Signals(self._signal).name if self._signal is not None else 'SIGTERM (on another rank)'
        message = (f'training stopped by {name} after iteration {done}/{runner.max_iters}: the resumable '
                   f'checkpoint {self.last_ckpt} is saved and named in {LAST_CHECKPOINT}; continue with '
                   'tools/train.py CONFIG --resume (same --work-dir).')
        runner.logger.warning(f'[mmpola] {message}')
        raise TrainingInterrupted(message)


def _broadcast(value):
    holder = [value]
    mmdist.broadcast_object_list(holder, src=0)
    return holder[0]


def add_safe_checkpointing(cfg):
    """Use :class:`SafeCheckpointHook` for the config's checkpoint hook (same arguments)."""
    hooks = cfg.get('default_hooks', None)
    if hooks is None:
        return cfg
    entry = hooks.get('checkpoint', None)
    if isinstance(entry, dict) and entry.get('type', 'CheckpointHook') in ('CheckpointHook', CheckpointHook):
        entry['type'] = 'SafeCheckpointHook'
    return cfg
