"""The shared course of the demos (tools/demo_*.py): evaluate untrained, train, evaluate, report.

Each demo generates its data, adjusts its config (:func:`prepare_demo_config` does what every demo
does), then :func:`run_demo` builds the Runner, lets the demo look at the untrained model
(``before_train``, e.g. predictions for the figure), trains with :class:`InitialEvaluationHook`
(which scores the untrained model first), and returns the metrics before and after with the
timings. Drawing and the printed table are the demo's own; :func:`write_summary` saves its
``summary.json``.
"""
import json
import os.path as osp
import time
from dataclasses import dataclass
from typing import Any

from ..ops import implementation_note
from .cli import build_runner, check_train_batches, exit_on_user_error
from .config import move_data_root
from .config_check import check_config
from .initial_evaluation import InitialEvaluationHook
from .launch import adapt_cfg_to_machine, check_device
from .preflight import run_preflight
from .workdir import lock_work_dir

__all__ = ['DemoResult', 'prepare_demo_config', 'run_demo', 'write_summary', 'config_label', 'check_learned']


@dataclass
class DemoResult:
    runner: Any
    initial_metrics: dict  # the untrained model's, from InitialEvaluationHook
    final_metrics: dict  # after training
    initial_eval_seconds: float
    train_seconds: float  # training, including the initial and the final evaluation
    before_train: Any = None  # what ``before_train`` returned


def prepare_demo_config(cfg, work_dir, data_root, seed, pretrained=None):
    """What every demo does to its config; returns the notes to log (the op implementations of the environment,
    :func:`mmpola.ops.implementation_note`, and those of :func:`adapt_cfg_to_machine`).

    Work dir and seed; ``data_root`` for the train/val/test datasets and evaluators; the backbone from
    ``pretrained`` when that file exists; the initial evaluation (:class:`InitialEvaluationHook`); the
    device check; the machine fallbacks; the config and pre-flight checks. mmpola's run-time hooks
    (safe checkpoints, RNG states, non-finite loss guard) come with the demo configs' runtime base.
    """
    check_device()  # one process: on the CPU when CUDA is not usable, with one warning line naming why
    cfg.work_dir = work_dir
    cfg.randomness = dict(seed=seed)
    move_data_root(cfg, data_root)  # the datasets and the evaluators' annotation files
    if pretrained and osp.isfile(pretrained):
        cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=pretrained)
    cfg.custom_hooks = list(cfg.get('custom_hooks') or []) + [dict(type='mmpola.InitialEvaluationHook')]
    notes = [implementation_note()] + adapt_cfg_to_machine(cfg, 'none')
    check_config(cfg)  # misspelled types and arguments
    run_preflight(cfg, ['train_dataloader', 'val_dataloader'], training=True)  # data, checkpoints, channels
    return notes


def run_demo(cfg, notes, description, before_train=None):
    """Build the Runner, log ``description``, call ``before_train(runner)``, train; a :class:`DemoResult`.

    ``description`` is a string, or a function of the built runner that returns one.
    """
    lock_work_dir(cfg.work_dir)  # one run per work dir
    runner = build_runner(cfg, 'none', notes)
    with exit_on_user_error(runner.logger):
        check_train_batches(runner)
    runner.logger.info(description(runner) if callable(description) else description)
    seen = before_train(runner) if before_train is not None else None
    start = time.time()
    runner.train()
    train_seconds = time.time() - start
    hook = next(h for h in runner.hooks if isinstance(h, InitialEvaluationHook))
    return DemoResult(runner, dict(hook.initial_metrics or {}), dict(hook.last_metrics or {}),
                      hook.initial_seconds, train_seconds, seen)


def config_label(config, repo_root):
    """The config path relative to the repository when it is inside it (for summaries)."""
    return osp.relpath(config, repo_root) if osp.abspath(config).startswith(repo_root) else config


def write_summary(work_dir, summary):
    path = osp.join(work_dir, 'summary.json')
    with open(path, 'w') as f:
        json.dump(summary, f, indent=2)
    return path


def check_learned(tool, after, minimums, log_dir):
    """A demo's pass/fail check: each metric of ``after`` reaches its minimum, else one line and exit 1.

    The trained figures are not the same digits on every machine (the CPU's kernels and the thread count
    change the rounding, and a few hundred steps from scratch carry that into the result), so the
    minimums sit far below the range measured on different kernels and threads (docs) and far above
    the untrained model: they tell a run that learned from one that did not. Call it after the summary
    is written (nothing is lost when it fails).
    """
    short = {name: after.get(name, float('nan')) for name, low in minimums.items()
             if not after.get(name, float('nan')) >= low}
    if short:
        found = ', '.join(f'{name} {value:g} (minimum {minimums[name]:g})' for name, value in short.items())
        raise SystemExit(f'{tool}: the trained model did not learn: {found}; see the training loss in '
                         f'{log_dir}/*/*.log, and rerun the demo without options')
