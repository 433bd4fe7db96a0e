"""The untrained model's evaluation, before the first training iteration: :class:`InitialEvaluationHook`
(the demos add it, :mod:`.demo`; any config may name it, ``dict(type='mmpola.InitialEvaluationHook')``)."""
import copy
import time

from mmengine.hooks import Hook

from mmpola.registry import HOOKS

__all__ = ['InitialEvaluationHook']


@HOOKS.register_module()
class InitialEvaluationHook(Hook):
    """Validate the freshly initialised model once before the first training iteration.

    Gives the "before training" reference a short run is judged against. The metrics of that
    first validation and of the latest one are kept in ``initial_metrics`` / ``last_metrics``, the
    duration of the first in ``initial_seconds``.
    Skipped when the run resumes (the model is no longer the initial one).

    Priority ``LOWEST`` so it runs after every other ``before_train`` hook (weights are
    initialised and checkpoints loaded by then).
    """

    priority = 'LOWEST'

    def __init__(self):
        self.initial_metrics = None
        self.last_metrics = None
        self.initial_seconds = 0.0

    def before_train(self, runner):
        if runner._resume or runner.iter > 0 or runner.val_loop is None:
            return
        runner.logger.info('Evaluating the initial (untrained) model')
        start = time.perf_counter()
        self.initial_metrics = copy.deepcopy(runner.val_loop.run())
        self.initial_seconds = time.perf_counter() - start

    def after_val_epoch(self, runner, metrics=None):
        if metrics is not None:
            self.last_metrics = copy.deepcopy(dict(metrics))
