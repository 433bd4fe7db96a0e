"""Hooks used by the tools and the demos: the non-finite loss guard, the initial evaluation."""
import copy
import math
import time

import torch
from mmengine import dist as mmdist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmpola.errors import MMPolaUserError

__all__ = ['InitialEvaluationHook', 'NonFiniteLossError', 'NonFiniteLossHook', 'add_nonfinite_loss_guard']


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


# --------------------------------------------------------------------------------------------
# non-finite losses: stop with a clear message, or skip the step, before the weights change

class NonFiniteLossError(MMPolaUserError, FloatingPointError):
    """A training loss was NaN or infinite; raised before the optimizer step of that iteration."""

    exit_code = 1


_FIXES = (
    'Possible fixes:\n'
    '  * lower the learning rate, or add / lengthen the warm-up (a LinearLR param_scheduler);\n'
    '  * clip gradients: optim_wrapper=dict(..., clip_grad=dict(max_norm=35, norm_type=2));\n'
    '  * check the data of this batch (degenerate boxes or masks, broken images or labels);\n'
    '  * with --amp, try without it;\n'
    '  * or skip such steps instead of stopping: '
    "custom_hooks=[dict(type='NonFiniteLossHook', action='skip', max_skips=10)] in the config, "
    'or --cfg-options nonfinite_loss.action=skip [nonfinite_loss.max_skips=10] with tools/train.py.')


def _loss_terms(losses):
    """(name, value) of every loss entry of a raw loss dict: tensors, lists of them, numbers."""
    if not isinstance(losses, dict):
        return
    for name, value in losses.items():
        if 'loss' not in str(name):
            continue
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                yield f'{name}[{i}]', item
        else:
            yield str(name), value


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _value_text(value):
    if isinstance(value, torch.Tensor):
        value = value.detach().float().mean().item() if value.numel() else float('nan')
    return f'{float(value):.6g}'


def _batch_files(data_batch, limit=8):
    """The image paths of a batch, when its data samples carry them (mmdet, mmseg, mmpretrain)."""
    samples = data_batch.get('data_samples') if isinstance(data_batch, dict) else None
    if not isinstance(samples, (list, tuple)):
        return []
    files = []
    for sample in samples:
        meta = getattr(sample, 'metainfo', None)
        if meta is None and isinstance(sample, dict):
            meta = sample
        path = (meta or {}).get('img_path') or (meta or {}).get('filename')
        if path is not None:
            files.append(str(path))
    if len(files) > limit:
        files = files[:limit] + [f'... ({len(files) - limit} more)']
    return files


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Stop training at a NaN / infinite loss with a clear message, or skip that step.

    The check runs inside the model's ``train_step``, between ``parse_losses`` and
    ``optim_wrapper.update_params`` (mmengine's ``BaseModel`` and its DDP / FSDP wrappers all
    take that path), so a non-finite loss never reaches the weights:

    * ``action='stop'`` (default): raise :class:`NonFiniteLossError` naming the iteration (and
      epoch), each non-finite term with its value, the finite terms, the files of the batch and
      the usual fixes. No backward pass and no optimizer step happen for that iteration: the
      weights are those of the last good step and the checkpoints already written are intact.
    * ``action='skip'``: log a warning and skip the step (no backward, no optimizer step, the
      gradients are cleared); the skipped iterations are kept in ``skipped_iters``. More than
      ``max_skips`` consecutive non-finite iterations (``None``: no limit) stop training with the
      same error. With gradient accumulation the skipped batch contributes no gradient; the
      other batches of its window are still applied.

    Every loss entry (keys containing ``'loss'``; tensors, lists of tensors or numbers) and the
    total are checked. In a distributed run all ranks take the same decision (one flag is
    all-reduced per iteration). Validation and testing are not affected. A model whose
    ``train_step`` does not call ``parse_losses`` is still checked, after its step, from the
    losses it returns (training then stops: the step cannot be undone).

    tools/train.py and the demos add this hook to every run (:func:`add_nonfinite_loss_guard`).
    """

    priority = 'VERY_HIGH'

    def __init__(self, action='stop', max_skips=10):
        if action not in ('stop', 'skip'):
            raise ValueError(f"NonFiniteLossHook: action must be 'stop' or 'skip', got {action!r}")
        if max_skips is not None and (not isinstance(max_skips, int) or max_skips < 0):
            raise ValueError(f'NonFiniteLossHook: max_skips must be a non-negative int or None, got {max_skips!r}')
        self.action = action
        self.max_skips = max_skips
        self.skipped_iters = []  # 1-based iterations whose step was skipped
        self.consecutive_skips = 0
        self._runner = None
        self._active = False
        self._checked = False
        self._pending_skip = False
        self._batch_idx = None
        self._data_batch = None
        self._window_has_grad = {}

    # ---------------------------------------------------------------- installation
    @staticmethod
    def _inner_model(runner):
        from mmengine.model import is_model_wrapper
        model = runner.model
        while is_model_wrapper(model) and hasattr(model, 'module'):
            model = model.module
        return model

    @staticmethod
    def _optim_wrappers(runner):
        from mmengine.optim import OptimWrapperDict
        wrapper = getattr(runner, 'optim_wrapper', None)
        if isinstance(wrapper, OptimWrapperDict):
            return list(wrapper.values())
        return [wrapper] if hasattr(wrapper, 'update_params') else []

    @staticmethod
    def _patch(obj, name, make):
        """Replace ``obj.name`` by ``make(original)`` as an instance attribute (undone by _unpatch)."""
        NonFiniteLossHook._unpatch(obj, name)
        had, previous = name in vars(obj), vars(obj).get(name)
        patched = make(getattr(obj, name))
        patched._nonfinite_restore = (had, previous)
        setattr(obj, name, patched)

    @staticmethod
    def _unpatch(obj, name):
        current = vars(obj).get(name)
        restore = getattr(current, '_nonfinite_restore', None)
        if restore is None:
            return
        had, previous = restore
        if had:
            setattr(obj, name, previous)
        else:
            delattr(obj, name)

    def before_train(self, runner):
        self._runner = runner
        self.consecutive_skips = 0
        self._window_has_grad = {}
        model = self._inner_model(runner)
        if hasattr(model, 'parse_losses'):
            self._patch(model, 'parse_losses', self._wrap_parse_losses)
        if self.action == 'skip':
            for wrapper in self._optim_wrappers(runner):
                self._patch(wrapper, 'update_params', lambda original, w=wrapper: self._wrap_update(w, original))

    def after_train(self, runner):
        self._unpatch(self._inner_model(runner), 'parse_losses')
        for wrapper in self._optim_wrappers(runner):
            self._unpatch(wrapper, 'update_params')
        self._active = False
        self._data_batch = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._active, self._checked, self._pending_skip = True, False, False
        self._batch_idx, self._data_batch = batch_idx, data_batch

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._active = False
        try:
            if self._pending_skip:
                self._pending_skip = False
                raise NonFiniteLossError(
                    f'{self._where()}: a non-finite loss was found but the step could not be skipped: '
                    "this model's train_step does not call optim_wrapper.update_params after parse_losses, "
                    'so the weights may have been updated with it. Resume from the last checkpoint with '
                    "NonFiniteLossHook(action='stop') to find the cause.\n" + _FIXES)
            if not self._checked and isinstance(outputs, dict):
                # the model's train_step bypasses parse_losses: check what it reports, after its step
                bad, good = self._classify(list(_loss_terms(outputs)))
                if self._any_rank(bool(bad)):
                    raise NonFiniteLossError(self._message(bad, good, step_taken=True))
        finally:
            self._data_batch = None

    # ---------------------------------------------------------------- the check
    def _wrap_parse_losses(self, original):
        def parse_losses(losses, *args, **kwargs):
            parsed = original(losses, *args, **kwargs)
            if self._active and not self._checked:
                parsed = self._check(losses, parsed)
            return parsed
        return parse_losses

    def _wrap_update(self, wrapper, original):
        def update_params(loss, *args, **kwargs):
            if not self._pending_skip:
                original(loss, *args, **kwargs)
                self._window_has_grad[id(wrapper)] = not wrapper.should_update()
                return
            self._pending_skip = False
            # no backward, no step: the skipped batch adds nothing. The accumulation counter
            # still advances, and a window that ends here applies its other batches' gradients.
            step_kwargs = kwargs.get('step_kwargs') or (args[0] if args else None) or {}
            zero_kwargs = kwargs.get('zero_kwargs') or (args[1] if len(args) > 1 else None) or {}
            wrapper._inner_count += 1
            if wrapper.should_update():
                if self._window_has_grad.get(id(wrapper)):
                    wrapper.step(**step_kwargs)
                wrapper.zero_grad(**zero_kwargs)
                self._window_has_grad[id(wrapper)] = False
        return update_params

    @staticmethod
    def _classify(terms):
        """Split (name, value) pairs into non-finite and finite ones; one device sync at most."""
        flags = [None] * len(terms)
        tensors, where = [], []
        for i, (name, value) in enumerate(terms):
            if isinstance(value, torch.Tensor):
                tensors.append(value.detach())
                where.append(i)
            elif _is_number(value):
                flags[i] = math.isfinite(value)
        if tensors:
            device = tensors[0].device
            finite = torch.stack([torch.isfinite(t).all().to(device) for t in tensors]).tolist()
            for i, ok in zip(where, finite):
                flags[i] = ok
        bad = [(n, v) for (n, v), ok in zip(terms, flags) if ok is False]
        good = [(n, v) for (n, v), ok in zip(terms, flags) if ok is True]
        return bad, good

    @staticmethod
    def _any_rank(flag):
        if not (mmdist.is_distributed() and mmdist.get_world_size() > 1):
            return flag
        count = torch.tensor([1 if flag else 0], dtype=torch.int32)
        mmdist.all_reduce(count, op='sum')
        return bool(count.item())

    def _check(self, losses, parsed):
        self._checked = True
        total = parsed[0] if isinstance(parsed, (tuple, list)) and parsed else None
        terms = list(_loss_terms(losses))
        if isinstance(total, torch.Tensor) or _is_number(total):
            terms.append(('loss', total))
        bad, good = self._classify(terms)
        if not self._any_rank(bool(bad)):
            self.consecutive_skips = 0
            return parsed
        if self.action == 'stop':
            raise NonFiniteLossError(self._message(bad, good))
        self.consecutive_skips += 1
        if self.max_skips is not None and self.consecutive_skips > self.max_skips:
            raise NonFiniteLossError(self._message(
                bad, good, reason=f'{self.consecutive_skips} consecutive iterations had a non-finite loss '
                f'(NonFiniteLossHook max_skips={self.max_skips}); {len(self.skipped_iters)} steps were '
                'skipped in all'))
        self.skipped_iters.append(self._runner.iter + 1)
        self._pending_skip = True
        limit = 'no limit' if self.max_skips is None else f'stops after {self.max_skips}'
        self._runner.logger.warning(
            f'{self._where()}: non-finite loss '
            f'({self._terms_text(bad) if bad else "on another rank"}): optimizer step skipped '
            f'({self.consecutive_skips} consecutive, {len(self.skipped_iters)} in all; {limit} consecutive). '
            'The smoothed losses of the log read nan while this iteration is in their window.')
        return parsed

    # ---------------------------------------------------------------- the message
    def _where(self):
        from mmengine.runner import EpochBasedTrainLoop
        runner = self._runner
        text = f'Iteration {runner.iter + 1}/{runner.max_iters}'
        loop = getattr(runner, 'train_loop', None)
        if isinstance(loop, EpochBasedTrainLoop) and self._batch_idx is not None:
            try:
                per_epoch = f'/{len(loop.dataloader)}'
            except TypeError:
                per_epoch = ''
            text += f' (epoch {runner.epoch + 1}, batch {self._batch_idx + 1}{per_epoch})'
        if mmdist.is_distributed() and mmdist.get_world_size() > 1:
            text += f' [rank {mmdist.get_rank()}]'
        return text

    @staticmethod
    def _terms_text(terms):
        return ', '.join(f'{name}={_value_text(value)}' + (' (the total)' if name == 'loss' else '')
                         for name, value in terms)

    def _message(self, bad, good, reason='', step_taken=False):
        lines = [f'{self._where()}: non-finite training loss: {self._terms_text(bad)}.' if bad else
                 f"{self._where()}: non-finite training loss on another rank (this rank's losses are finite)."]
        if reason:
            lines.append(f'Training stopped: {reason}.')
        if good:
            lines.append(f'Finite terms: {self._terms_text(good)}.')
        if step_taken:
            lines.append("This model's train_step does not call parse_losses, so the check came after its "
                         'optimizer step: the weights may be corrupted. Resume from the last checkpoint.')
        else:
            lines.append('The optimizer step of this iteration was NOT taken: the weights are those of the '
                         'last good step and the checkpoints already written are intact.')
        files = _batch_files(self._data_batch)
        if files:
            lines.append(f'Images of this batch: {", ".join(files)}.')
        lines.append(_FIXES)
        return '\n'.join(lines)


def add_nonfinite_loss_guard(cfg):
    """Make sure ``cfg`` trains with a :class:`NonFiniteLossHook` (tools/train.py and the demos).

    Appends ``dict(type='NonFiniteLossHook')`` (stop at the first NaN / inf loss) to
    ``cfg.custom_hooks`` unless the config already has one. A top-level ``nonfinite_loss`` entry
    (what ``--cfg-options nonfinite_loss.action=skip nonfinite_loss.max_skips=20`` or
    ``--cfg-options nonfinite_loss=skip`` creates) is moved into the hook's arguments, so the
    dumped config shows what ran. Returns the hook's config entry.
    """
    from mmpola.errors import UserError
    options = cfg.pop('nonfinite_loss', None) if 'nonfinite_loss' in cfg else None
    if isinstance(options, str):
        options = dict(action=options)
    elif options is not None and not isinstance(options, dict):
        raise UserError(f"nonfinite_loss must be 'stop', 'skip' or a dict of NonFiniteLossHook arguments, "
                        f'got {options!r}')
    hooks = list(cfg.get('custom_hooks') or [])
    entry = next((h for h in hooks if isinstance(h, dict) and h.get('type') in
                  ('NonFiniteLossHook', NonFiniteLossHook)), None)
    if entry is None:
        entry = dict(type='NonFiniteLossHook')
        hooks.append(entry)
    entry.update(options or {})
    try:  # a typo in the options fails now, not after the model and data are built
        NonFiniteLossHook(**{k: v for k, v in entry.items() if k not in ('type', 'priority')})
    except (TypeError, ValueError) as e:
        raise UserError(f'NonFiniteLossHook options {dict(options or entry)!r}: {e}') from e
    cfg['custom_hooks'] = hooks
    # a config dumped by the run, loaded elsewhere, must find the hook again
    imports = cfg.get('custom_imports')
    if imports is None:
        cfg['custom_imports'] = dict(imports=['mmpola.runtime'], allow_failed_imports=False)
    elif 'mmpola.runtime' not in imports.get('imports', []):
        imports['imports'] = list(imports.get('imports', [])) + ['mmpola.runtime']
    return entry
