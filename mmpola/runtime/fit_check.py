"""Refuse a checkpoint that fits (almost) none of the model before it is used.

mmengine loads ``load_from`` / tools/test.py's CHECKPOINT with ``strict=False``: a checkpoint of
another model (a classification file, a segmentor for a detector) loads nothing, only logs the
missing keys, and the run trains from scratch or tests random weights (mAP 0.000, exit status 0).
:class:`CheckpointFitHook` (in the shipped configs' ``custom_hooks``) sees the checkpoint mmengine
just read (``after_load_checkpoint``) and raises :class:`mmpola.checkpoint.CheckpointMismatchError`
when less than ``min_loaded`` of the model's weights (parameter elements) would load, naming the
counts and what the file looks like. ``min_loaded`` comes from the hook's argument, else from the
config's top-level ``checkpoint_min_loaded`` (``--cfg-options checkpoint_min_loaded=0`` loads
anything), else 0.5.
"""
import re

from mmengine.hooks import Hook

from mmpola.checkpoint import CheckpointMismatchError, describe_checkpoint
from mmpola.errors import UserError
from mmpola.registry import HOOKS

__all__ = ['CheckpointFitHook', 'checkpoint_fit']

# the config key (``--cfg-options checkpoint_min_loaded=0`` loads anything)
OPTION = 'checkpoint_min_loaded'
DEFAULT_MIN_LOADED = 0.5


def _share(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise UserError(f'{OPTION} (CheckpointFitHook min_loaded) must be a share between 0 and 1, got {value!r}')
    return float(value)


def _bare_model(model):
    """The model inside DDP / test-time-augmentation wrappers."""
    while hasattr(model, 'module') and hasattr(model.module, 'named_parameters'):
        model = model.module
    return model


def _as_loaded(model, checkpoint):
    """The name -> tensor mapping mmengine's loading would match against ``model``: the checkpoint's
    ``state_dict`` (or the checkpoint itself), ``module.`` stripped, then the model's own
    top-level ``load_state_dict`` pre-hooks (e.g. the classifier's mapping of official keys)."""
    state_dict = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else {}
    if not isinstance(state_dict, dict):
        return {}
    state_dict = {re.sub(r'^module\.', '', str(k)): v for k, v in state_dict.items()}
    for hook in getattr(model, '_load_state_dict_pre_hooks', {}).values():
        try:
            hook(state_dict, '', {}, False, [], [], [])
        except Exception:  # the real load will report it
            break
    return state_dict


def checkpoint_fit(model, checkpoint):
    """``(loaded, total, loaded tensors, total tensors)``: parameter elements and tensors of
    ``model`` that ``checkpoint`` provides with the same name and shape, as mmengine's loading
    would use them (:func:`_as_loaded`)."""
    model = _bare_model(model)
    state_dict = _as_loaded(model, checkpoint)
    loaded = total = loaded_n = total_n = 0
    for name, param in model.named_parameters():
        total += param.numel()
        total_n += 1
        value = state_dict.get(name)
        if value is not None and tuple(getattr(value, 'shape', ())) == tuple(param.shape):
            loaded += param.numel()
            loaded_n += 1
    return loaded, total, loaded_n, total_n


def _fix(kind, model_name):
    if 'classification' in kind or 'backbone-only' in kind:
        fix = ('a classification or backbone checkpoint holds the backbone only: train with it as the '
               "backbone's pretrained weights (--cfg-options model.backbone.init_cfg.type=Pretrained "
               'model.backbone.init_cfg.checkpoint=FILE) instead of load_from, and test a checkpoint written '
               'by training this config (work_dirs/<config>/epoch_N.pth)')
        if any(name in kind for name in ('FLatten', 'InLine', 'PolaFormer++')):
            fix += ("; mmpola's Pola backbones do not take FLatten, InLine or PolaFormer++ weights: use a "
                    'PolaFormer file')
        return fix
    if 'detector' in kind or 'segmentor' in kind:
        return f'use a checkpoint of this {model_name} (written by training this config)'
    return f'use a checkpoint of this {model_name} (written by training this config)'


@HOOKS.register_module()
class CheckpointFitHook(Hook):
    """Raise when a loaded checkpoint provides less than ``min_loaded`` of the model's weights."""

    priority = 'VERY_HIGH'

    def __init__(self, min_loaded=None):
        self._given = min_loaded is not None
        self.min_loaded = _share(DEFAULT_MIN_LOADED if min_loaded is None else min_loaded)

    def before_run(self, runner):
        if not self._given:
            self.min_loaded = _share(runner.cfg.get(OPTION, DEFAULT_MIN_LOADED))

    def after_load_checkpoint(self, runner, checkpoint):
        if self.min_loaded <= 0:
            return
        loaded, total, loaded_n, total_n = checkpoint_fit(runner.model, checkpoint)
        if total == 0 or loaded >= self.min_loaded * total:
            return
        model = _bare_model(runner.model)
        backbone = getattr(model, 'backbone', None)
        name = type(model).__name__ + (f' ({type(backbone).__name__} backbone)' if backbone is not None else '')
        source = runner.cfg.get('load_from') or 'the checkpoint'
        kind = describe_checkpoint(checkpoint)
        raise CheckpointMismatchError(
            f'checkpoint {source!r} does not fit the {name}: only {loaded_n} of its {total_n} parameter tensors '
            f'({loaded / total:.1%} of {total / 1e6:.2f}M weights) would load, less than the {self.min_loaded:.0%} '
            f'required, so the run would use random weights. The file looks like {kind}. Fix: '
            f'{_fix(kind, type(model).__name__)}. To load it anyway: --cfg-options {OPTION}=0')
