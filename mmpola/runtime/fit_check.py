"""Refuse a checkpoint that does not fit the model before it is used.

mmengine loads ``load_from`` / tools/test.py's CHECKPOINT with ``strict=False``: a checkpoint of
another model (a classification file, a segmentor for a detector) loads nothing, only logs the
missing keys, and the run trains from scratch or tests random weights (mAP 0.000, exit status 0).
:class:`CheckpointFitHook` (in the shipped configs' ``custom_hooks``) sees the checkpoint mmengine
just read (``after_load_checkpoint``) and raises :class:`mmpola.checkpoint.CheckpointMismatchError`

* always, when less than ``min_loaded`` of the model's weights (parameter elements) would load;
* when the checkpoint is evaluated (tools/test.py, a validation run) or resumed, also when any part
  of the model that this needs (backbone, neck, heads; a segmentor's auxiliary head only for a
  resume) is missing from the file or has tensors of another shape, whatever share of the backbone
  matches: a Mask R-CNN file tested with a RetinaNet config of the same backbone loads the
  backbone and would score a random neck and head (:func:`part_fit`).

* when the model's backbone (one of mmpola's) and the file's differ in their blocks (another depth,
  width or per-stage layout: a Pola-PVT-S detector tested with the Pola-PVT-T config, whose weights all
  have a tensor of their name and shape in the file), with the backbone loader's message
  (:meth:`mmpola.checkpoint.KeySignature.check_layout`);
* always, when a weight that would load is NaN or infinite (:func:`mmpola.checkpoint.check_finite`).

The message names the counts, the parts and what the file looks like. Fine-tuning from another
model (``load_from`` in training) needs only the share and the same blocks. ``min_loaded`` comes from
the hook's argument, else from the config's top-level ``checkpoint_min_loaded`` (``--cfg-options
checkpoint_min_loaded=0`` loads anything finite and checks no part), else 0.5.
"""
import re

from mmengine.hooks import Hook

from mmpola.checkpoint import CheckpointMismatchError, check_finite, checkpoint_source, describe_checkpoint
from mmpola.errors import UserError
from mmpola.registry import HOOKS

from .options import CHECKPOINT_MIN_LOADED
from .preflight.checkpoints import pretrained_option
from .resume import loaded_checkpoint

__all__ = ['CheckpointFitHook', 'checkpoint_fit', 'part_fit', 'check_inference_weights', 'TRAINING_ONLY_PARTS']

OPTION = CHECKPOINT_MIN_LOADED  # the config key (``--cfg-options checkpoint_min_loaded=0`` loads anything)
DEFAULT_MIN_LOADED = 0.5
# parts of a model that only its losses use: an evaluation does without them (mmseg's auxiliary heads)
TRAINING_ONLY_PARTS = ('auxiliary_head',)


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


def part_fit(model, checkpoint, skip=()):
    """``[(part, loaded tensors, tensors, [(name, file shape, model shape)] of another shape)]`` for
    every top-level part of ``model`` (its named children with parameters, ``skip`` left out) that
    ``checkpoint`` does not provide completely (as mmengine's loading would use it)."""
    model = _bare_model(model)
    state_dict = _as_loaded(model, checkpoint)
    incomplete = []
    for part, module in model.named_children():
        if part in skip:
            continue
        params = list(module.named_parameters(prefix=part))
        if not params:
            continue
        loaded, other_shape = 0, []
        for name, param in params:
            value = state_dict.get(name)
            shape = tuple(getattr(value, 'shape', ())) if value is not None else None
            if shape == tuple(param.shape):
                loaded += 1
            elif value is not None:
                other_shape.append((name, shape, tuple(param.shape)))
        if loaded < len(params):
            incomplete.append((part, loaded, len(params), other_shape))
    return incomplete


def _parts_text(incomplete):
    texts = []
    for part, loaded, total, other_shape in incomplete:
        if loaded == 0 and not other_shape:
            texts.append(f'model.{part} is missing from the file (0 of its {total} parameter tensors)')
            continue
        text = f'model.{part}: only {loaded} of its {total} parameter tensors load'
        if other_shape:
            name, file_shape, model_shape = other_shape[0]
            text += (f' ({len(other_shape)} have another shape, e.g. {name}: {list(file_shape)} in the file, '
                     f'{list(model_shape)} in the model)')
        texts.append(text)
    return '; '.join(texts)


def check_inference_weights(model, checkpoint, named='the weights'):
    """Raise :class:`~mmpola.checkpoint.CheckpointMismatchError` when ``checkpoint`` does not provide every part
    ``model`` predicts with (its training-only parts left out): a checkpoint of another model or task would
    otherwise predict with random weights (and lend the model its class names)."""
    model = _bare_model(model)
    incomplete = part_fit(model, checkpoint, skip=TRAINING_ONLY_PARTS)
    if not incomplete:
        return
    parts = ', '.join(n for n, m in model.named_children() if any(True for _ in m.parameters()))
    raise CheckpointMismatchError(
        f'{named} does not fit the {type(model).__name__}: {_parts_text(incomplete)}, so the predictions would come '
        f"from random weights. The file holds {', '.join(_file_parts(checkpoint)) or 'no parts'} (the model: {parts}) "
        f'and looks like {describe_checkpoint(checkpoint)}. Fix: give the checkpoint written by training this config '
        '(work_dirs/<config>/epoch_N.pth or iter_N.pth)')


def _file_parts(checkpoint):
    state_dict = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else {}
    if not isinstance(state_dict, dict):
        return []
    return list(dict.fromkeys(re.sub(r'^module\.', '', str(k)).split('.')[0] for k in state_dict))


def _other_classes_fix(cfg, checkpoint, incomplete):
    """The fix when the file differs from the model in the width of its heads only (every tensor there, some of
    another shape) and names the classes it was trained on: the run's ``num_classes``; else None."""
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    classes = ((meta or {}).get('dataset_meta') or {}).get('classes') if isinstance(meta, dict) else None
    if not classes or not all(loaded + len(other) == total and other for _, loaded, total, other in incomplete):
        return None
    from .preflight.model import head_num_classes
    heads = [path for path, n in head_num_classes(cfg.get('model') or {}) if n != len(classes)]
    if not heads:
        return None
    return (f'the file was trained on {len(classes)} classes: run with as many, --cfg-options '
            + ' '.join(f'{path}={len(classes)}' for path in heads))


def _purpose(runner):
    """'resume', 'train' (load_from before training) or 'evaluate' (tools/test.py, a validation run)."""
    from mmengine.runner import BaseLoop
    if getattr(runner, '_resume', False):
        return 'resume'
    return 'train' if isinstance(getattr(runner, '_train_loop', None), BaseLoop) else 'evaluate'


def _fix(kind, model_name, backbone_option):
    if 'classification' in kind or 'backbone-only' in kind:
        fix = ('a classification or backbone checkpoint holds the backbone only: train with it as the '
               f"backbone's pretrained weights (--cfg-options {backbone_option}) instead of load_from, and test a "
               'checkpoint written by training this config (work_dirs/<config>/epoch_N.pth)')
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
        model = _bare_model(runner.model)
        path = loaded_checkpoint(runner)
        named = checkpoint_source(path) if path else 'the checkpoint'  # how the messages name it
        state_dict = _as_loaded(model, checkpoint)
        model_state = model.state_dict()
        check_finite({k: v for k, v in state_dict.items() if k in model_state}, named)
        if self.min_loaded <= 0:
            return
        loaded, total, loaded_n, total_n = checkpoint_fit(runner.model, checkpoint)
        if total == 0:
            return
        backbone = getattr(model, 'backbone', None)
        name = type(model).__name__ + (f' ({type(backbone).__name__} backbone)' if backbone is not None else '')
        if loaded >= self.min_loaded * total:
            if hasattr(backbone, 'checkpoint_signature'):
                tensors = {k[len('backbone.'):]: v for k, v in state_dict.items() if k.startswith('backbone.')}
                backbone.checkpoint_signature().check_layout(tensors, named,
                                                             partial_option=f'--cfg-options {OPTION}=0')
            purpose = _purpose(runner)
            if purpose == 'train':
                return
            incomplete = part_fit(model, checkpoint, skip=TRAINING_ONLY_PARTS if purpose == 'evaluate' else ())
            if not incomplete:
                return
            use = 'Resuming from it' if purpose == 'resume' else 'Evaluating it'
            parts = ', '.join(n for n, m in model.named_children() if any(True for _ in m.parameters()))
            raise CheckpointMismatchError(
                f'{named} does not fit the {name}: {_parts_text(incomplete)}. {use} would run '
                f'{"this part" if len(incomplete) == 1 else "these parts"} with random weights, although '
                f'{loaded / total:.1%} of the weights load. The file holds '
                f"{', '.join(_file_parts(checkpoint)) or 'no parts'} (the model: {parts}) and looks like "
                f'{describe_checkpoint(checkpoint)}. Fix: '
                + (_other_classes_fix(runner.cfg, checkpoint, incomplete)
                   or f'use a checkpoint of this {type(model).__name__} (written by training this config)')
                + f'. To load it anyway: --cfg-options {OPTION}=0')
        kind = describe_checkpoint(checkpoint)
        raise CheckpointMismatchError(
            f'{named} does not fit the {name}: only {loaded_n} of its {total_n} parameter tensors '
            f'({loaded / total:.1%} of {total / 1e6:.2f}M weights) would load, less than the {self.min_loaded:.0%} '
            f'required, so the run would use random weights. The file looks like {kind}. Fix: '
            f"{_fix(kind, type(model).__name__, pretrained_option(runner.cfg, runner.cfg.get('load_from') or 'FILE'))}"
            f'. To load it anyway: --cfg-options {OPTION}=0')
