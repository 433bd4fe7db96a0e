"""Runtime helpers shared by tools/train.py, tools/test.py and the demos.

Importing this module registers :class:`BF16AmpOptimWrapper`, :class:`InitialEvaluationHook` and
:class:`NonFiniteLossHook` and :class:`RandomStateHook` in mmengine's root registries (visible from every OpenMMLab scope).
"""
from .hooks import InitialEvaluationHook, NonFiniteLossError, NonFiniteLossHook, add_nonfinite_loss_guard
from .resume import RandomStateHook, add_random_state_hook
from .optim import BF16AmpOptimWrapper, autocast_module
from .runtime import (UserError, adapt_cfg_to_machine, check_checkpoint_file, check_data_files,
                      check_pretrained_files, enable_test_dump, enable_test_visualization, enable_tta,
                      exit_on_user_error, init_distributed, is_url, load_config,
                      register_task_modules, replace_sync_bn, setup_amp)

__all__ = [
    'BF16AmpOptimWrapper', 'autocast_module', 'InitialEvaluationHook', 'NonFiniteLossError', 'NonFiniteLossHook',
    'add_nonfinite_loss_guard', 'RandomStateHook', 'add_random_state_hook', 'UserError', 'adapt_cfg_to_machine',
    'check_checkpoint_file', 'check_data_files', 'check_pretrained_files', 'enable_test_dump',
    'enable_test_visualization', 'enable_tta', 'exit_on_user_error', 'init_distributed', 'is_url', 'load_config',
    'register_task_modules', 'replace_sync_bn', 'setup_amp',
]
