"""What mmpola adds to a training or test run, one module per concept.

Hooks, the optimizer wrapper and its constructor (registered on import; the shipped configs name them, so a run
started with mmdet's or mmseg's own tools gets them too):

* :mod:`.saving`: :class:`SafeCheckpointHook` (atomic checkpoint saves, a checkpoint on SIGTERM),
  with :mod:`.atomic_files`, :mod:`.signals` (stopping on a signal) and :mod:`.resume` (which
  checkpoint ``--resume`` continues from);
* :mod:`.random_state`: :class:`RandomStateHook` (random generator states in checkpoints: exact resume);
* :mod:`.nonfinite_loss`: :class:`NonFiniteLossHook` (stop or skip at a NaN / inf loss);
* :mod:`.nonfinite_pixels`: :class:`NonFinitePixelsHook` (stop at, or skip, input images with NaN / inf
  pixels before they are batched);
* :mod:`.fit_check`: :class:`CheckpointFitHook` (refuse a checkpoint of another model);
* :mod:`.dump_results`: ``SafeDumpResults`` and ``SafeOutputDir`` (``tools/test.py --out``, a pickle or
  mmseg's folder of maps, written atomically, its path checked first);
* :mod:`.workdir`: :class:`WorkDirHook` (a work dir deleted during the run recreated before the next write);
* :mod:`.amp`: :class:`BF16AmpOptimWrapper` (bf16 mixed precision on the CPU and with fp32-only kernels);
* :mod:`.param_groups`: :class:`MergedGroupsOptimWrapperConstructor` (parameter groups of equal options merged:
  the optimizer steps a few groups instead of one per parameter);
* :mod:`.initial_evaluation`: :class:`InitialEvaluationHook` (the untrained model's evaluation, before
  training; the demos add it).

The demos' shared course (evaluate untrained, train, evaluate, report): :mod:`.demo`.

What only a tool can do (called explicitly by tools/train.py, tools/test.py and the demos):

* :mod:`.config` (loading a config, ``data_root``, the task library, the work dir) and
  :mod:`.config_check` (types and arguments against what they build);
* :mod:`.preflight`: data, checkpoint and model checks before anything is built;
* :mod:`.launch`: the device, the process group, the machine's fallbacks (SyncBN, AMP);
* :mod:`.workdir`: one training run per work dir (its lock, a work dir the run could not write into);
* :mod:`.cli`: arguments, test-time flags, the one-line user errors;
* :mod:`.allocator`: glibc malloc settings of the tools.
"""
from mmpola.errors import MMPolaUserError, UserError

from .amp import BF16AmpOptimWrapper, autocast_module
from .cli import (
    add_check_args,
    add_launch_args,
    build_runner,
    enable_test_dump,
    enable_test_visualization,
    enable_tta,
    exit_on_user_error,
    parse_tool_args,
)
from .config import check_config_file, is_url, load_config, move_data_root, register_task_modules, set_work_dir
from .config_check import check_config
from .dump_results import ResultsSaveError, check_out_path
from .fit_check import CheckpointFitHook
from .initial_evaluation import InitialEvaluationHook
from .launch import adapt_cfg_to_machine, check_device, init_distributed, replace_sync_bn, setup_amp
from .nonfinite_loss import NonFiniteLossError, NonFiniteLossHook
from .nonfinite_pixels import NonFinitePixelsError, NonFinitePixelsHook
from .param_groups import MergedGroupsOptimWrapperConstructor
from .preflight import run_preflight
from .preflight.files import check_data_files, check_dataset_images
from .random_state import RandomStateHook
from .resume import find_resumable_checkpoint
from .saving import CheckpointSaveError, SafeCheckpointHook
from .signals import TrainingInterrupted
from .workdir import WorkDirHook, WorkDirInUseError, lock_work_dir

__all__ = [
    'MMPolaUserError', 'UserError',
    # hooks and the optimizer wrapper
    'SafeCheckpointHook', 'RandomStateHook', 'NonFiniteLossHook', 'NonFinitePixelsHook', 'CheckpointFitHook',
    'InitialEvaluationHook',
    'BF16AmpOptimWrapper', 'autocast_module', 'MergedGroupsOptimWrapperConstructor',
    # errors of the run
    'CheckpointSaveError', 'ResultsSaveError', 'TrainingInterrupted', 'NonFiniteLossError', 'NonFinitePixelsError',
    'WorkDirInUseError', 'WorkDirHook',
    # what the tools call
    'check_config_file', 'load_config', 'move_data_root', 'register_task_modules', 'set_work_dir', 'is_url',
    'check_config', 'run_preflight', 'check_data_files', 'check_dataset_images', 'find_resumable_checkpoint',
    'adapt_cfg_to_machine', 'check_device', 'init_distributed', 'replace_sync_bn', 'setup_amp', 'lock_work_dir',
    'add_launch_args', 'add_check_args', 'parse_tool_args', 'build_runner', 'exit_on_user_error',
    'enable_test_dump', 'enable_tta', 'enable_test_visualization', 'check_out_path',
]
