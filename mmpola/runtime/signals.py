"""Stopping a run on a signal at a point where it can be resumed.

Schedulers (slurm, Kubernetes ...) send SIGTERM some time before they kill a job, often to every
process of the job (its process group: the training processes and their DataLoader workers); Ctrl-C
sends SIGINT to the terminal's process group. :class:`StopSignals` replaces the handlers of SIGTERM
and SIGINT in the main thread for the duration of training, so that the signal only records a
request; the training hooks act on it after the current iteration (all ranks decide together,
:meth:`StopSignals.requested`), write a resumable checkpoint and stop with
:class:`TrainingInterrupted` (exit status 128 + the signal: 143 for SIGTERM, 130 for SIGINT). A
second Ctrl-C stops at once, without saving. The previous handlers come back when training ends.

The DataLoader workers of the run leave both signals to the main process
(:func:`ignore_stop_signals_in_workers`, on their ``worker_init_fn``): torch's workers die of a SIGTERM
that does not come from their parent and end on SIGINT, and the main process would then stop with
"DataLoader worker exited unexpectedly" before it could save. They still end when the main process
shuts them down (its None on their queue; a SIGTERM once training is over or the process exits, when
multiprocessing terminates its daemonic children) or dies.

When the main process cannot save (a second Ctrl-C, a worker that was ended anyway, a signal before
the first iteration), :func:`stopped_cleanly` turns what follows into one line naming the last
checkpoint of the run instead of a traceback.
"""
import atexit
import contextlib
import multiprocessing
import os
import signal
import sys
import threading

import torch
from mmengine import dist as mmdist

from mmpola.errors import MMPolaUserError

__all__ = ['StopSignals', 'TrainingInterrupted', 'ignore_stop_signals_in_workers', 'workers_may_end',
           'stopped_cleanly', 'STOP_SIGNALS']

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_LAST = []  # the StopSignals installed last in this process (what stopped_cleanly asks)


class TrainingInterrupted(MMPolaUserError):
    """Training stopped on a signal (after saving a resumable checkpoint when it could)."""

    exit_code = 128 + signal.SIGTERM

    def __init__(self, message, signum=signal.SIGTERM):
        super().__init__(message)
        self.exit_code = 128 + int(signum)

    def __reduce__(self):
        return type(self), (str(self), self.exit_code - 128)


def signal_name(signum):
    name = signal.Signals(signum).name
    return f'{name} (Ctrl-C)' if signum == signal.SIGINT else name


class StopSignals:
    """Record ``signals`` (default SIGTERM and SIGINT) instead of dying; see the module doc."""

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = tuple(signals)
        self.received = None  # the first signal number that arrived
        self.second_interrupt = False
        self._previous = {}

    def install(self):
        """Take over the handlers (only the main thread may set them); idempotent."""
        self.received = None
        self.second_interrupt = False
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)
        _LAST[:] = [self]

    def restore(self):
        """Give the handlers back."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _record(self, signum, frame):
        if signum == signal.SIGINT and self.received == signal.SIGINT:  # a second Ctrl-C: stop now
            self.restore()
            self.second_interrupt = True
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signum
            if signum == signal.SIGINT and mmdist.is_main_process():
                sys.stderr.write('\n[mmpola] Ctrl-C: the current iteration finishes, then a resumable checkpoint is '
                                 'written and training stops. Press Ctrl-C again to stop at once without saving.\n')
                sys.stderr.flush()

    def requested(self):
        """Whether a signal arrived on this rank or any other (a collective in a distributed run)."""
        flag = self.received is not None
        if mmdist.get_world_size() > 1:
            tensor = torch.tensor([1.0 if flag else 0.0], device=mmdist.get_comm_device())
            mmdist.all_reduce(tensor, op='max')
            flag = bool(tensor.item() > 0)
        return flag

    @property
    def installed(self):
        return bool(self._previous)

    def signum(self):
        return self.received if self.received is not None else self.signals[0]

    def name(self):
        """The received signal's name (``SIGTERM``), or what a rank without one says."""
        if self.received is None:
            return f'{signal.Signals(self.signals[0]).name} (on another rank)'
        return signal_name(self.received)


_WORKERS_MAY_END = []  # [multiprocessing.Event]: set when a SIGTERM may end the workers again


def workers_may_end():
    """From now on a SIGTERM ends this process's data workers again (training is over, or the process
    exits: multiprocessing then terminates its daemonic children and joins them)."""
    if _WORKERS_MAY_END:
        _WORKERS_MAY_END[0].set()


def _may_end_event():
    if not _WORKERS_MAY_END:
        _WORKERS_MAY_END.append(multiprocessing.Event())
        atexit.register(workers_may_end)  # runs before multiprocessing's own exit function (registered earlier)
    return _WORKERS_MAY_END[0]


class _LeaveStopSignalsToMain:
    """``worker_init_fn`` wrapper: the loader's own, then SIGINT ignored and SIGTERM ignored until the
    main process says the workers may end (:func:`workers_may_end`)."""

    def __init__(self, worker_init_fn, may_end):
        self.worker_init_fn, self.may_end = worker_init_fn, may_end

    def __call__(self, worker_id):
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._sigterm)

    def _sigterm(self, signum, frame):
        if self.may_end.is_set():
            os._exit(0)  # as torch's own handler does when the parent ends a worker


def ignore_stop_signals_in_workers(loader):
    """Make the worker processes of ``loader`` (a DataLoader, before its workers start) leave SIGTERM
    and SIGINT to the main process, which stops the run after the iteration; idempotent."""
    if isinstance(loader, torch.utils.data.DataLoader) and loader.num_workers > 0 \
            and not isinstance(loader.worker_init_fn, _LeaveStopSignalsToMain):
        may_end = _may_end_event()
        may_end.clear()  # a new run: its workers are ours to keep until it is over
        loader.worker_init_fn = _LeaveStopSignalsToMain(loader.worker_init_fn, may_end)


def _last_checkpoint(runner):
    hub = getattr(runner, 'message_hub', None)
    return hub.get_info('last_ckpt') if hub is not None else None


@contextlib.contextmanager
def stopped_cleanly(runner=None):
    """Around ``runner.train()``: a run that a signal stops where no checkpoint can be written ends
    with :class:`TrainingInterrupted` naming the last checkpoint (a second Ctrl-C, or an error that
    follows a stop signal, such as a DataLoader worker ended by it), not with a traceback."""
    try:
        yield
    except MMPolaUserError:
        raise
    except (Exception, KeyboardInterrupt) as error:  # re-raised unless a stop signal explains it
        active = _LAST[-1] if _LAST else None
        signum = signal.SIGINT if isinstance(error, KeyboardInterrupt) else (
            active.received if active is not None and active.installed else None)
        if signum is None:
            raise
        second = isinstance(error, KeyboardInterrupt) and active is not None and active.second_interrupt
        if active is not None:
            active.restore()
        if second:
            how = 'a second Ctrl-C'
        elif isinstance(error, KeyboardInterrupt):
            how = signal_name(signal.SIGINT)
        else:
            detail = str(error).strip().splitlines()
            how = f'{signal_name(signum)} (then {type(error).__name__}{": " + detail[0] if detail else ""})'
        where = ''
        loop = getattr(runner, '_train_loop', None)
        if hasattr(loop, 'iter') and hasattr(loop, 'max_iters'):
            where = f' in iteration {loop.iter + 1}/{loop.max_iters}'
        last = _last_checkpoint(runner) if runner is not None else None
        saved = (f'the last checkpoint of this run is {last} (named in last_checkpoint); continue with '
                 'tools/train.py CONFIG --resume (same --work-dir)' if last else
                 'this run has written no checkpoint yet: start it again')
        message = f'training stopped by {how}{where} without writing a checkpoint: {saved}.'
        if runner is not None and getattr(runner, 'logger', None) is not None:
            runner.logger.warning(f'[mmpola] {message}')
        raise TrainingInterrupted(message, signum) from error
