"""Stopping a run on a signal at a point where it can be resumed.

Schedulers (slurm, Kubernetes ...) send SIGTERM some time before they kill a job. :class:`StopSignals`
replaces the handler of the main thread for the duration of training, so that the signal only records
a request; the training hooks act on it after the current iteration (all ranks decide together,
:meth:`StopSignals.requested`), write a resumable checkpoint and stop with :class:`TrainingInterrupted`
(exit status 143, the usual status of a SIGTERM-ended process). The previous handlers come back when
training ends.
"""
import signal
import threading

import torch
from mmengine import dist as mmdist

from mmpola.errors import MMPolaUserError

__all__ = ['StopSignals', 'TrainingInterrupted']


class TrainingInterrupted(MMPolaUserError):
    """Training stopped on a signal after saving a resumable checkpoint."""

    exit_code = 128 + signal.SIGTERM


class StopSignals:
    """Record ``signals`` (default SIGTERM) instead of dying; see the module doc."""

    def __init__(self, signals=(signal.SIGTERM,)):
        self.signals = tuple(signals)
        self.received = None  # the signal number, once one arrived
        self._previous = {}

    def install(self):
        """Take over the handlers (only the main thread may set them); idempotent."""
        self.received = None
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)

    def restore(self):
        """Give the handlers back."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _record(self, signum, frame):
        self.received = signum

    def requested(self):
        """Whether a signal arrived on this rank or any other (a collective in a distributed run)."""
        flag = self.received is not None
        if mmdist.get_world_size() > 1:
            tensor = torch.tensor([1.0 if flag else 0.0], device=mmdist.get_comm_device())
            mmdist.all_reduce(tensor, op='max')
            flag = bool(tensor.item() > 0)
        return flag

    def name(self):
        """The received signal's name (``SIGTERM``), or what a rank without one says."""
        if self.received is None:
            return f'{signal.Signals(self.signals[0]).name} (on another rank)'
        return signal.Signals(self.received).name
