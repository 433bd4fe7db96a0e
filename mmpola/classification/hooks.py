"""An EMA switch a command line can flip."""
from mmengine.hooks import EMAHook

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
    raw ones go to ``ema_state_dict``), exactly as EMAHook does.
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
