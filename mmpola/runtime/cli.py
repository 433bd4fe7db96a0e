"""What the command-line tools share: arguments, the one-line user errors, test-time flags, the Runner.

The tools serve every task (mmdet, mmseg, classification), so nothing here names a task library
except through the config's ``default_scope``. Errors the user can fix are
:class:`mmpola.errors.MMPolaUserError`; :func:`exit_on_user_error` prints them as one line.
"""
import argparse
import contextlib
import logging
import os
import os.path as osp
import sys

from mmengine.config import DictAction

from mmpola.errors import MMPolaUserError, UserError

from .dump_results import check_out_path
from .launch import check_launch, init_distributed

__all__ = ['exit_on_user_error', 'user_message', 'check_launch_main', 'add_launch_args', 'add_check_args',
           'parse_tool_args',
           'enable_test_dump', 'enable_tta', 'enable_test_visualization', 'build_runner', 'check_train_batches']


@contextlib.contextmanager
def exit_on_user_error(logger=None):
    """Turn errors the user can fix into one ``error: <message>`` line and the error's exit status.

    Every such error derives from :class:`mmpola.errors.MMPolaUserError` (paths, flags and data,
    refused or mismatched checkpoints, bad backbone arguments, a NaN loss): its message names the
    problem and the fix, a traceback adds noise. With ``logger`` (a running Runner's) the line also
    goes to the run's log file (not to the terminal a second time).

    A misspelled ``type`` or argument in the config is such an error too: the tools check the config
    against what it builds first (:func:`mmpola.runtime.config_check.check_config`).
    """
    try:
        yield
    except MMPolaUserError as error:
        message = user_message(error)
        if logger is not None:
            _log_to_files(logger, f'[mmpola] {message}')
        # one write per line: the lines of several processes (one per rank) do not interleave
        sys.stderr.write(f'error: {message}\n')
        sys.stderr.flush()
        sys.exit(error.exit_code)


def user_message(error):
    """The message of ``error``; for one raised in a DataLoader worker (a pipeline step's), which
    PyTorch raises again in the main process with the worker's traceback as its text, the worker's own
    message (the traceback's last entry)."""
    text = str(error)
    if text.startswith('Caught ') and '\nOriginal Traceback' in text:
        cls = type(error)
        marker = f'{cls.__module__}.{cls.__qualname__}: '
        at = text.rfind(marker)
        if at >= 0:
            return text[at + len(marker):].strip()
    return text


def _log_to_files(logger, message):
    """An ERROR record of ``message`` to the file handlers of ``logger`` only (mmengine's logger writes
    to the terminal and the run's log file)."""
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, None, None,
                               func='exit_on_user_error')
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
            handler.handle(record)


def check_launch_main(argv=None):
    """``NPROC [tool options ...]``: tools/dist_*.sh run this once before torchrun
    (:func:`mmpola.runtime.launch.check_launch`); a problem is one ``error:`` line and a non-zero exit."""
    argv = sys.argv[1:] if argv is None else argv
    with exit_on_user_error():
        if not argv or not argv[0].isdecimal() or int(argv[0]) < 1:
            raise UserError(f'the number of processes per machine must be a positive integer, got '
                            f'{argv[0] if argv else None!r}')
        check_launch(int(argv[0]), argv[1:])


def add_launch_args(parser):
    """``--cfg-options``, ``--launcher``, ``--device``, ``--local-rank`` (torch.distributed.launch's spelling too)."""
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_dataloader.batch_size=4 '
                        'model.backbone.init_cfg=None')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                        help='job launcher (set by tools/dist_*.sh and tools/slurm_*.sh)')
    parser.add_argument('--device', choices=['auto', 'cuda', 'cpu'], default=None,
                        help='auto (default; also MMPOLA_DEVICE): CUDA when usable; a multi-process launch '
                        'without usable CUDA stops with the cause, one process warns and runs on the CPU. '
                        'cpu: run on the CPU on purpose (GPUs hidden). cuda: stop unless CUDA is usable')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0, help=argparse.SUPPRESS)
    return parser


def add_check_args(parser):
    """The switches of the checks made before anything is built."""
    parser.add_argument('--skip-data-check', action='store_true', help='skip the pre-flight check of the '
                        'data (files, annotations, segmentation maps, classes vs num_classes)')
    parser.add_argument('--skip-config-check', action='store_true', help='skip the check of the config\'s '
                        'types and arguments against what they build (misspellings are then found, or not, '
                        'when the Runner builds that part)')
    return parser


def parse_tool_args(parser, argv=None):
    """Parse, and export ``LOCAL_RANK`` when a launcher passed ``--local-rank`` instead of setting it."""
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(getattr(args, 'local_rank', 0))
    return args


def enable_test_dump(cfg, out, scope):
    """``--out``: keep the raw predictions (pickle for mmdet/others, a folder of maps for mmseg), with
    the path checked now (:func:`mmpola.runtime.dump_results.check_out_path`) and the pickle or the
    folder written atomically (:mod:`mmpola.runtime.dump_results`)."""
    if scope == 'mmseg':  # a folder of maps, written next to it and renamed once complete
        check_out_path(out, folder=True)
        evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, (list, tuple)) else [cfg.test_evaluator]
        metric = evaluators[0]
        kind = metric.pop('type')
        kind = kind if isinstance(kind, str) and '.' in kind else f'mmseg.{getattr(kind, "__name__", kind)}'
        metric.update(type='mmpola.SafeOutputDir', metric_type=kind, output_dir=out)
        return
    if not out.endswith(('.pkl', '.pickle')):
        raise UserError(f'--out {out!r}: the predictions are written as a pickle; use a .pkl name')
    check_out_path(out)
    dump = dict(type='mmpola.SafeDumpResults', out_file_path=out,
                dump_type='mmdet.DumpDetResults' if scope == 'mmdet' else 'DumpResults')
    evaluator = cfg.test_evaluator
    if isinstance(evaluator, (list, tuple)):
        cfg.test_evaluator = list(evaluator) + [dump]
    elif isinstance(evaluator, dict) and 'metrics' in evaluator:
        evaluator['metrics'] = list(evaluator['metrics']) + [dump]
    else:
        cfg.test_evaluator = [evaluator, dump]



def enable_tta(cfg):
    """``--tta``: wrap the model in the config's ``tta_model`` and test with its ``tta_pipeline``."""
    missing = [key for key in ('tta_model', 'tta_pipeline') if key not in cfg]
    if missing:
        raise UserError(f'--tta needs {" and ".join(missing)} in the config (the detection configs inherit '
                        'both from configs/detection/_base_/coco_tta.py, mmseg configs from their dataset and '
                        'runtime bases)')
    dataset = cfg.test_dataloader.dataset
    while 'dataset' in dataset:  # wrapped datasets: the pipeline lives on the innermost one
        dataset = dataset['dataset']
    dataset['pipeline'] = cfg.tta_pipeline
    cfg.model = dict(cfg.tta_model, module=cfg.model)



def enable_test_visualization(cfg, show_dir, scope, show=False, wait_time=2.0):
    """``--show-dir`` / ``--show``: switch the config's visualization hook on. ``show_dir`` is the folder as given
    (relative to the current directory) for every task library, and every test image is drawn (mmseg's hook
    draws every 50th unless the config sets its ``interval``); mmdet's own test script puts a relative folder
    under ``work_dir/timestamp``."""
    hook = cfg.get('default_hooks', {}).get('visualization')
    if hook is None:
        raise UserError('--show / --show-dir draw the predictions through the config\'s visualization hook '
                        '(default_hooks.visualization), which this config has not (the classification configs draw '
                        'nothing). Fix: --out FILE keeps the predictions instead, or add the task library\'s '
                        'visualization hook to default_hooks')
    if scope == 'mmpretrain':
        hook['enable'] = True
        if show_dir:
            hook['out_dir'] = show_dir
    else:
        hook['draw'] = True
        if show_dir:
            if scope == 'mmseg':
                cfg.visualizer['save_dir'] = show_dir
                hook.setdefault('interval', 1)
            else:  # mmdet: DetVisualizationHook writes one image per test sample there
                hook['test_out_dir'] = osp.abspath(show_dir)
    if show:
        hook['show'] = True
        hook['wait_time'] = wait_time


def build_runner(cfg, launcher='none', notes=()):
    """Start the process group (gloo where mmengine cannot), build the Runner, log ``notes``."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    init_distributed(launcher, cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    for note in notes:
        runner.logger.info(f'[mmpola] {note}')
    return runner


def check_train_batches(runner):
    """Refuse an epoch-based training whose data loader gives no batch (:class:`UserError`), before the Runner
    trains: a training set smaller than one batch per process, whose incomplete last batch the loader drops
    (``drop_last=True``, as the ImageNet recipes' loaders). mmengine would otherwise stop in its scheduler set-up
    with an assertion about ``epoch_length``, or, without schedulers that count iterations, run every epoch
    without a step. Builds the Runner's train loop (its data loader), which ``runner.train()`` then uses as
    it is. An iteration-based loop samples without end and is left alone."""
    from mmengine.runner import EpochBasedTrainLoop
    loop = runner.train_loop
    if not isinstance(loop, EpochBasedTrainLoop) or len(loop.dataloader) > 0:
        return
    loader = loop.dataloader
    samples = len(loader.dataset)
    if not loader.drop_last:
        raise UserError(f'train_dataloader gives no batch: the training set has {samples} samples; check the '
                        "dataset's files and filters")
    per_process = getattr(loader.sampler, 'num_samples', None)
    share = '' if per_process is None or per_process == samples else f' ({per_process} per process)'
    raise UserError(f'train_dataloader gives no batch: the training set has {samples} samples{share}, fewer than '
                    f'one batch of {loader.batch_size}, and the loader drops an incomplete last batch '
                    f'(drop_last=True); use a smaller batch (--cfg-options train_dataloader.batch_size=N) or more '
                    'training data')
