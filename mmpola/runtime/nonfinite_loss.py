"""Non-finite losses: stop with a clear message, or skip the step, before the weights change.

:class:`NonFiniteLossHook` (in the shipped configs' ``custom_hooks``) checks every training loss
where the model computes it, through torch's public module and optimizer hooks (nothing of mmengine is
replaced):

* a forward hook on the model sees the loss dict of each training forward. With ``action='stop'`` it
  computes one finiteness flag of the losses on their device, without waiting for it: the backward
  is queued meanwhile, and the flag is read (one device sync) just before the optimizer step, or at
  the end of the iteration when no step comes (gradient accumulation, or a step that AMP's loss
  scaler skips); a NaN / inf term then stops training before the weights change. With
  ``action='skip'`` the flag is read in the forward hook (the backward must not see the batch), and
  the losses of a non-finite batch are replaced by a zero that has no gradient;
* an optimizer step pre-hook reads the flag (``'stop'``) and leaves the parameters that only a skipped
  batch touched out of the step (their gradient is set back to None), so a skipped batch changes
  neither the weights nor the optimizer state, also for AdamW's weight decay and moments.

Options come from the hook's arguments, else from the config's top-level ``nonfinite_loss``
(``--cfg-options nonfinite_loss.action=skip nonfinite_loss.max_skips=20``, or ``nonfinite_loss=skip``),
else ``action='stop'``, ``max_skips=10``.
"""
import math

import torch
from mmengine import dist as mmdist
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict

from mmpola.errors import MMPolaUserError, UserError
from mmpola.registry import HOOKS

from .options import NONFINITE_LOSS

__all__ = ['NonFiniteLossError', 'NonFiniteLossHook']

OPTION = NONFINITE_LOSS  # the config key of the options
_DEFAULTS = dict(action='stop', max_skips=10)
_UNSET = object()


class NonFiniteLossError(MMPolaUserError, FloatingPointError):
    """A training loss was NaN or infinite; raised before the optimizer step of that iteration."""

    exit_code = 1


_FIXES = (
    'Possible fixes:\n'
    '  * lower the learning rate, or add / lengthen the warm-up (a LinearLR param_scheduler);\n'
    '  * clip gradients: optim_wrapper=dict(..., clip_grad=dict(max_norm=35, norm_type=2));\n'
    '  * check the data of this batch (degenerate boxes or masks, broken images or labels);\n'
    '  * with --amp, try without it;\n'
    '  * or skip such steps instead of stopping: --cfg-options nonfinite_loss.action=skip '
    '[nonfinite_loss.max_skips=10], or NonFiniteLossHook(action=\'skip\', max_skips=10) in custom_hooks.')


def _check_options(action, max_skips, error=ValueError, who='NonFiniteLossHook'):
    if action not in ('stop', 'skip'):
        raise error(f"{who}: action must be 'stop' or 'skip', got {action!r}")
    if max_skips is not None and (isinstance(max_skips, bool) or not isinstance(max_skips, int) or max_skips < 0):
        raise error(f'{who}: max_skips must be a non-negative int or None, got {max_skips!r}')


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


def _finite_flag(terms):
    """Whether every (name, value) term is finite: a Python bool, or a 0-d bool tensor computed on the
    terms' device and not read here (reading it waits for the device)."""
    tensors = [value for _, value in terms if isinstance(value, torch.Tensor)]
    if not all(math.isfinite(value) for _, value in terms if _is_number(value)):
        return False
    if not tensors:
        return True
    device = tensors[0].device
    return torch.isfinite(torch.cat([t.reshape(-1).to(device) for t in tensors])).all()


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

    * ``action='stop'`` (default): raise :class:`NonFiniteLossError` naming the iteration (and
      epoch), each non-finite term with its value, the finite terms, the files of the batch and
      the usual fixes, before the optimizer step of that iteration (its backward has run): the
      weights are those of the last good step and the checkpoints already written are intact.
      The check costs one device sync per iteration, right before the optimizer step.
    * ``action='skip'``: log a warning and skip the step: the batch contributes no gradient and the
      parameters it alone would have updated stay out of the optimizer step; the skipped iterations
      are kept in ``skipped_iters``. More than ``max_skips`` consecutive non-finite iterations
      (``None``: no limit) stop training with the same error. With gradient accumulation the other
      batches of the skipped batch's window are still applied. The log shows 0 for the losses of a
      skipped iteration.

    Every loss entry (keys containing ``'loss'``; tensors, lists of tensors or numbers) and the
    total are checked. In a distributed run all ranks take the same decision (one flag is
    all-reduced per iteration). Validation and testing are not affected. A model whose
    ``train_step`` calls ``self.forward`` directly (bypassing the module's hooks) is still checked,
    after its step, from the losses it returns (training then stops: the step cannot be undone).
    Options: see the module doc.
    """

    priority = 'VERY_HIGH'

    def __init__(self, action=None, max_skips=_UNSET):
        self._given = dict(action=action is not None, max_skips=max_skips is not _UNSET)
        self.action = _DEFAULTS['action'] if action is None else action
        self.max_skips = _DEFAULTS['max_skips'] if max_skips is _UNSET else max_skips
        _check_options(self.action, self.max_skips)
        self.skipped_iters = []  # 1-based iterations whose step was skipped
        self.consecutive_skips = 0
        self._runner = None
        self._handles = []
        self._active = False
        self._checked = False
        self._batch_idx = None
        self._data_batch = None
        self._pending = []  # ('stop') (terms, flag) of this iteration's forwards, not read yet
        self._no_grad_before_skip = {}  # id -> parameter without gradient when a skipped batch came

    # ---------------------------------------------------------------- set-up
    def before_run(self, runner):
        """Take the options the hook was not given from the config's ``nonfinite_loss``."""
        options = runner.cfg.get(OPTION) if runner.cfg is not None else None
        if options is None:
            return
        if isinstance(options, str):
            options = dict(action=options)
        if not isinstance(options, dict) or set(options) - set(_DEFAULTS):
            raise UserError(f"{OPTION} must be 'stop', 'skip' or a dict with action and max_skips, got {options!r}")
        action = self.action if self._given['action'] else options.get('action', self.action)
        max_skips = self.max_skips if self._given['max_skips'] else options.get('max_skips', self.max_skips)
        _check_options(action, max_skips, UserError, f'{OPTION} (NonFiniteLossHook)')
        self.action, self.max_skips = action, max_skips

    @staticmethod
    def _inner_model(runner):
        model = runner.model
        while is_model_wrapper(model) and hasattr(model, 'module'):
            model = model.module
        return model

    @staticmethod
    def _optimizers(runner):
        wrapper = getattr(runner, 'optim_wrapper', None)
        wrappers = list(wrapper.values()) if isinstance(wrapper, OptimWrapperDict) else [wrapper]
        return [w.optimizer for w in wrappers if isinstance(getattr(w, 'optimizer', None), torch.optim.Optimizer)]

    def before_train(self, runner):
        self._runner = runner
        self.consecutive_skips = 0
        self._no_grad_before_skip = {}
        self._remove_handles()
        self._handles.append(self._inner_model(runner).register_forward_hook(self._after_forward))
        for optimizer in self._optimizers(runner):
            self._handles.append(optimizer.register_step_pre_hook(self._before_step))

    def after_train(self, runner):
        self._remove_handles()
        self._active = False
        self._data_batch = None
        self._pending = []

    def _remove_handles(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._active, self._checked = True, False
        self._batch_idx, self._data_batch = batch_idx, data_batch
        self._pending = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._active = False
        try:
            self._decide()  # an iteration without an optimizer step (accumulation, a step AMP skipped)
            if not self._checked and isinstance(outputs, dict):
                # the model's train_step bypassed the forward hook: check what it reports, after its step
                bad, good = self._classify(list(_loss_terms(outputs)))
                if self._any_rank(bool(bad)):
                    raise NonFiniteLossError(self._message(bad, good, step_taken=True))
        finally:
            self._data_batch = None

    # ---------------------------------------------------------------- the check
    def _after_forward(self, module, args, output):
        """Forward hook: the losses of a training forward, checked; replaced when the step is skipped."""
        if not (self._active and module.training and isinstance(output, dict)):
            return None
        terms = list(_loss_terms(output))
        if not terms:
            return None
        self._checked = True
        total = self._total(module, output)
        if total is not None:
            terms.append(('loss', total))
        terms = [(name, value.detach() if isinstance(value, torch.Tensor) else value) for name, value in terms]
        if self.action == 'stop':
            self._pending.append((terms, _finite_flag(terms)))  # read before the optimizer step
            return None
        bad, good = self._classify(terms)
        if not self._any_rank(bool(bad)):
            self.consecutive_skips = 0
            return None
        if self.action == 'stop':
            raise NonFiniteLossError(self._message(bad, good))
        self.consecutive_skips += 1
        if self.max_skips is not None and self.consecutive_skips > self.max_skips:
            raise NonFiniteLossError(self._message(
                bad, good, reason=f'{self.consecutive_skips} consecutive iterations had a non-finite loss '
                f'(NonFiniteLossHook max_skips={self.max_skips}); {len(self.skipped_iters)} steps were '
                'skipped in all'))
        self.skipped_iters.append(self._runner.iter + 1)
        limit = 'no limit' if self.max_skips is None else f'stops after {self.max_skips}'
        self._runner.logger.warning(
            f'{self._where()}: non-finite loss '
            f'({self._terms_text(bad) if bad else "on another rank"}): optimizer step skipped '
            f'({self.consecutive_skips} consecutive, {len(self.skipped_iters)} in all; {limit} consecutive).')
        return self._without_gradient(module, output)

    @staticmethod
    def _total(module, output):
        """The total loss as the model's ``parse_losses`` computes it (None when it cannot)."""
        try:
            total = module.parse_losses(output)[0]
        except Exception:  # noqa: BLE001  (the model's own step will report a malformed loss dict)
            return None
        return total if isinstance(total, torch.Tensor) or _is_number(total) else None

    def _without_gradient(self, module, output):
        """``output`` with every loss term replaced by a zero connected to all parameters (a
        distributed model then still reduces a gradient for each: zeros). The parameters that had no
        gradient yet are remembered: :meth:`_before_step` leaves them out of the step."""
        params = [p for p in module.parameters() if p.requires_grad and p.numel()]
        for p in params:
            if p.grad is None:
                self._no_grad_before_skip[id(p)] = p
        device = next((p.device for p in params), torch.device('cpu'))
        zero = sum((p.reshape(-1)[0] * 0.0 for p in params), torch.zeros((), device=device))
        replaced = dict(output)
        for name, value in output.items():
            if 'loss' in str(name):
                replaced[name] = [zero] * len(value) if isinstance(value, (list, tuple)) else zero
        return replaced

    def _decide(self):
        """``action='stop'``: read the finiteness flags of this iteration's forwards (one device sync)
        and stop when a loss was not finite (on any rank)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        flags = [flag for _, flag in pending]
        tensors = [flag for flag in flags if isinstance(flag, torch.Tensor)]
        finite = all(flag for flag in flags if not isinstance(flag, torch.Tensor)) and \
            (not tensors or bool(torch.stack([t.to(tensors[0].device) for t in tensors]).all()))
        if not self._any_rank(not finite):
            self.consecutive_skips = 0
            return
        bad, good = [], []
        for terms, _ in pending:
            more_bad, more_good = self._classify(terms)
            bad += more_bad
            good += more_good
        raise NonFiniteLossError(self._message(bad, good))

    def _before_step(self, optimizer, args, kwargs):
        """Optimizer step pre-hook: the decision on this iteration's losses (``'stop'``), then a
        parameter whose only gradient came from skipped batches (zeros) gets None, so the optimizer
        leaves it alone (no update, no weight decay, no moment change)."""
        self._decide()
        if not self._no_grad_before_skip:
            return None
        for group in optimizer.param_groups:
            for p in group['params']:
                if self._no_grad_before_skip.pop(id(p), None) is not None and p.grad is not None \
                        and not p.grad.any():
                    p.grad = None
        return None

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
            lines.append("This model's train_step does not call its forward through the module (the check "
                         'came after its optimizer step): the weights may be corrupted. Resume from the last '
                         'checkpoint.')
        else:
            lines.append('The optimizer step of this iteration was NOT taken: the weights are those of the '
                         'last good step and the checkpoints already written are intact.')
        files = _batch_files(self._data_batch)
        if files:
            lines.append(f'Images of this batch: {", ".join(files)}.')
        lines.append(_FIXES)
        return '\n'.join(lines)
