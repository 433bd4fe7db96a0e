"""An EMA switch a command line can flip."""
from mmengine.hooks import EMAHook

from mmpola.errors import UserError
from mmpola.registry import HOOKS

__all__ = ['SwitchableEMAHook']

_STAGES = ('before_run', 'before_train', 'after_train_iter', 'before_val_epoch', 'after_val_epoch',
           'before_test_epoch', 'after_test_epoch', 'before_save_checkpoint', 'after_load_checkpoint')


@HOOKS.register_module()
class SwitchableEMAHook(EMAHook):
    """mmengine's :class:`~mmengine.hooks.EMAHook` that does nothing unless ``enabled``.

    mmengine's ``--cfg-options`` can change a value inside an existing list entry but cannot add
    a hook, so the classification configs list this hook switched off and one flag turns
    on weight averaging::

        tools/train.py CONFIG --cfg-options custom_hooks.0.enabled=True [custom_hooks.0.momentum=1e-4]

    When enabled, validation, test and the saved ``state_dict`` use the averaged weights (the
    raw ones go to ``ema_state_dict``), exactly as EMAHook does. Switched off, it refuses to resume a run
    that kept an average (the checkpoint's model weights are the average).
    """

    def __init__(self, enabled=False, **kwargs):
        super().__init__(**kwargs)
        self.enabled = enabled


def _only_when_enabled(name):
    stage = getattr(EMAHook, name)

    def run(self, runner, *args, **kwargs):
        if self.enabled:
            return stage(self, runner, *args, **kwargs)

    run.__name__ = name
    run.__doc__ = stage.__doc__
    return run


for _name in _STAGES:
    setattr(SwitchableEMAHook, _name, _only_when_enabled(_name))


def _after_load_checkpoint(self, runner, checkpoint):
    """EMAHook's loading when enabled; switched off, a resume of a run that kept an EMA is refused: the checkpoint's
    model weights are the averaged ones (the raw ones are in ``ema_state_dict``), so the run would go on from the
    average and drop its raw weights at the next save."""
    if self.enabled:
        return EMAHook.after_load_checkpoint(self, runner, checkpoint)
    if not getattr(runner, '_resume', False) or 'ema_state_dict' not in checkpoint:
        return None
    from mmpola.runtime.resume import loaded_checkpoint
    filename = loaded_checkpoint(runner) or 'the checkpoint'
    hooks = runner.cfg.get('custom_hooks') or []
    index = next((i for i, h in enumerate(hooks) if str(h.get('type', '')).endswith('SwitchableEMAHook')), None)
    option = f'custom_hooks.{index}.enabled=True' if index is not None else 'the SwitchableEMAHook with enabled=True'
    raise UserError(
        f'--resume: the run in {filename} kept an exponential moving average of its weights (SwitchableEMAHook), '
        'which this config switches off: the checkpoint\'s model weights are the average (its raw weights are in '
        'ema_state_dict), so the run would go on from the average and drop the raw weights at its next save. Fix: '
        f'resume with the average on: --cfg-options {option}; to go on without it on purpose, start a new run from '
        f'the checkpoint: drop --resume and add --cfg-options load_from={filename}')


_after_load_checkpoint.__name__ = 'after_load_checkpoint'
SwitchableEMAHook.after_load_checkpoint = _after_load_checkpoint
