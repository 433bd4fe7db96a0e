"""Runtime helpers shared by tools/train.py, tools/test.py and the demos.

* :mod:`.cli`: config loading, argument and file checks, test-time flags, the one-line user errors;
* :mod:`.launch`: machine and launcher adaptation (CPU fallbacks, AMP, process group);
* :mod:`.data_checks`: data files checked before anything is built;
* hooks (:mod:`.hooks`, :mod:`.resume`, :mod:`.checkpointing`), the work dir lock (:mod:`.workdir`) and the
  bf16 optimizer wrapper (:mod:`.optim`).

Importing this module registers :class:`BF16AmpOptimWrapper`, :class:`CheckpointFitHook`,
:class:`InitialEvaluationHook`, :class:`NonFiniteLossHook`, :class:`RandomStateHook` and
:class:`SafeCheckpointHook` in mmengine's root registries (visible from every OpenMMLab scope).
"""
from mmpola.errors import MMPolaUserError, UserError

from .checkpoint_fit import CheckpointFitHook, add_checkpoint_fit_check
from .checkpointing import (
                            CheckpointSaveError,
                            SafeCheckpointHook,
                            TrainingInterrupted,
                            add_safe_checkpointing,
                            find_resumable_checkpoint,
)
from .cli import (
                            check_checkpoint_file,
                            check_pretrained_files,
                            enable_test_dump,
                            enable_test_visualization,
                            enable_tta,
                            exit_on_user_error,
                            is_url,
                            load_config,
                            register_task_modules,
)
from .data_checks import check_data_files, check_dataset_images, coco_image_file_names, run_preflight
from .hooks import InitialEvaluationHook, NonFiniteLossError, NonFiniteLossHook, add_nonfinite_loss_guard
from .launch import adapt_cfg_to_machine, init_distributed, replace_sync_bn, setup_amp
from .optim import BF16AmpOptimWrapper, autocast_module
from .resume import RandomStateHook, add_random_state_hook
from .workdir import WorkDirInUseError, lock_work_dir

__all__ = [
    'BF16AmpOptimWrapper', 'autocast_module', 'CheckpointFitHook', 'add_checkpoint_fit_check', 'InitialEvaluationHook',
    'NonFiniteLossError', 'NonFiniteLossHook',
    'add_nonfinite_loss_guard', 'RandomStateHook', 'add_random_state_hook', 'MMPolaUserError', 'UserError',
    'adapt_cfg_to_machine', 'check_checkpoint_file', 'check_data_files', 'check_dataset_images',
    'coco_image_file_names', 'check_pretrained_files', 'enable_test_dump', 'enable_test_visualization', 'enable_tta',
    'exit_on_user_error', 'init_distributed', 'is_url', 'load_config', 'register_task_modules', 'replace_sync_bn',
    'run_preflight', 'setup_amp', 'CheckpointSaveError', 'SafeCheckpointHook', 'TrainingInterrupted',
    'add_safe_checkpointing', 'find_resumable_checkpoint', 'WorkDirInUseError', 'lock_work_dir',
]
