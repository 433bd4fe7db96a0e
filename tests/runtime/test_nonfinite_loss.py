"""NonFiniteLossHook: a NaN / inf loss stops training before the optimizer step with a clear
message, or the step is skipped when configured; the shipped configs name it, and tools/train.py
runs it from the config (``--cfg-options nonfinite_loss.action=skip``).

A tiny mmengine Runner trains a two-parameter model whose ``loss_mask`` turns NaN (or inf) at
chosen iterations.
"""
import os.path as osp
import uuid

import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, MODELS
from mmengine.runner import Runner
from mmengine.structures import BaseDataElement
from torch.utils.data import DataLoader

from mmpola.runtime import NonFiniteLossError, NonFiniteLossHook, UserError
from tests.fixtures.tools import load_tool, own_run, run_main
from tests.fixtures.toy_runs import RUNTIME_BASE

NUM_SAMPLES, BATCH = 8, 2  # 4 iterations per epoch


@MODELS.register_module(force=True)
class NonFiniteToyModel(BaseModel):
    """``loss_mask`` is multiplied by ``bad_value`` at the (1-based) training forwards in ``bad_iters``."""

    def __init__(self, bad_iters=(), bad_value=float('nan'), bad_as_float=False):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5, -0.25]))
        self.bad_iters, self.bad_value, self.bad_as_float = set(bad_iters), bad_value, bad_as_float
        self.forwards = 0

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = torch.stack(list(inputs)) @ self.w
        if mode != 'loss':
            return out
        self.forwards += 1
        losses = dict(loss_cls=0.1 * (out ** 2).mean(), loss_mask=((out - 1) ** 2).mean(),
                      acc=torch.tensor(float('nan')))  # not a loss: never checked
        if self.forwards in self.bad_iters:
            losses['loss_mask'] = losses['loss_mask'] * self.bad_value
            if self.bad_as_float:  # a model reporting a plain number for a term
                losses['loss_extra'] = [torch.tensor(0.5), self.bad_value]
        return losses

    def parse_losses(self, losses):
        if any(isinstance(v, list) for v in losses.values()):  # mmengine's refuses plain numbers
            losses = {k: (sum(torch.as_tensor(x) for x in v) if isinstance(v, list) else v)
                      for k, v in losses.items()}
        return super().parse_losses(losses)


@DATASETS.register_module(force=True)
class NonFiniteToyDataset(torch.utils.data.Dataset):
    def __init__(self, num=NUM_SAMPLES):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(num, 2, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return dict(inputs=self.x[i], data_samples=BaseDataElement(metainfo=dict(img_path=f'data/img_{i}.jpg')))


def _runner(tmp_path, hook=None, epochs=3, optimizer='SGD', accumulate=1, **model_kwargs):
    loader = DataLoader(NonFiniteToyDataset(), batch_size=BATCH, shuffle=False, collate_fn=pseudo_collate)
    lr = 0.05 if optimizer == 'SGD' else 0.01
    return Runner(
        model=NonFiniteToyModel(**model_kwargs), work_dir=str(tmp_path / 'work'), train_dataloader=loader,
        optim_wrapper=dict(optimizer=dict(type=optimizer, lr=lr), accumulative_counts=accumulate),
        train_cfg=dict(by_epoch=True, max_epochs=epochs), custom_hooks=[hook] if hook is not None else None,
        default_hooks=dict(checkpoint=None, logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=0), experiment_name=f'nonfinite_{uuid.uuid4().hex}', log_level='INFO')


def _params(runner):
    return runner.model.w.detach().clone()


class _Recorder:
    """Weights after every training iteration, kept by a hook that runs after the step."""

    def __init__(self, runner):
        from mmengine.hooks import Hook
        self.after = {}
        rec = self

        class Record(Hook):
            priority = 'LOWEST'

            def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
                rec.after[runner.iter + 1] = _params(runner)

        runner.register_hook(Record())


def _log(runner):
    with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
        return f.read()


def test_stop_raises_before_the_step_and_names_iteration_term_and_files(tmp_path):
    runner = _runner(tmp_path, dict(type='NonFiniteLossHook'), bad_iters={6})
    rec = _Recorder(runner)
    with pytest.raises(NonFiniteLossError) as info:
        runner.train()
    message = str(info.value)
    assert isinstance(info.value, FloatingPointError)
    assert message.startswith('Iteration 6/12 (epoch 2, batch 2/4): non-finite training loss: loss_mask=nan, '
                              'loss=nan (the total).'), message
    assert 'Finite terms: loss_cls=' in message and 'acc' not in message
    assert 'NOT taken' in message and 'checkpoints already written are intact' in message
    assert 'data/img_2.jpg, data/img_3.jpg' in message  # the batch's files
    assert 'clip_grad' in message and "action='skip'" in message and 'learning rate' in message
    assert sorted(rec.after) == [1, 2, 3, 4, 5]
    # no NaN got in: the weights are exactly those after the last good step
    assert torch.isfinite(_params(runner)).all() and torch.equal(_params(runner), rec.after[5])
    # the flag is read just before the step (no device sync in the forward): the bad batch's backward ran,
    # its step did not
    assert torch.isnan(runner.model.w.grad).all()
    # outside a training iteration the check is off
    assert runner.model.parse_losses({'loss_a': torch.tensor(float('nan'))})[0].isnan()


@pytest.mark.parametrize('value', [float('inf'), -float('inf')])
def test_inf_is_caught_too(tmp_path, value):
    runner = _runner(tmp_path, NonFiniteLossHook(), epochs=1, optimizer='AdamW', bad_iters={2}, bad_value=value)
    rec = _Recorder(runner)
    with pytest.raises(NonFiniteLossError, match=r'Iteration 2/4 .*loss_mask=-?inf, loss=-?inf \(the total\)'):
        runner.train()
    assert torch.equal(_params(runner), rec.after[1])


def test_plain_numbers_and_lists_are_checked(tmp_path):
    runner = _runner(tmp_path, NonFiniteLossHook(), epochs=1, bad_iters={3}, bad_as_float=True)
    with pytest.raises(NonFiniteLossError, match=r'Iteration 3/4 .*loss_mask=nan, loss_extra\[1\]=nan, loss=nan'):
        runner.train()


def test_skip_skips_the_steps_logs_them_and_finishes(tmp_path):
    hook = NonFiniteLossHook(action='skip', max_skips=2)
    runner = _runner(tmp_path, hook, bad_iters={3, 7, 8})
    rec = _Recorder(runner)
    runner.train()
    assert hook.skipped_iters == [3, 7, 8] and runner.iter == 12
    for it in (3, 7, 8):  # a skipped step leaves the weights as they were
        assert torch.equal(rec.after[it], rec.after[it - 1]), it
    assert not torch.equal(rec.after[4], rec.after[3])  # the good steps still train
    assert all(torch.isfinite(w).all() for w in rec.after.values())
    log = _log(runner)
    assert ('Iteration 3/12 (epoch 1, batch 3/4): non-finite loss (loss_mask=nan, loss=nan (the total)): '
            'optimizer step skipped (1 consecutive, 1 in all; stops after 2 consecutive)') in log
    assert 'optimizer step skipped (2 consecutive, 3 in all' in log


def _sgd_step(w, batches, lr=0.05, scale=1.0):
    model = NonFiniteToyModel()
    with torch.no_grad():
        model.w.copy_(w)
    for indices in batches:
        batch = pseudo_collate([NonFiniteToyDataset()[i] for i in indices])
        (model.parse_losses(model(batch['inputs'], mode='loss'))[0] * scale).backward()
    return w - lr * model.w.grad


def test_a_skipped_batch_is_as_if_it_never_came(tmp_path):
    """Plain SGD: the step after a skipped one starts from the weights before the skipped one."""
    runner = _runner(tmp_path, NonFiniteLossHook(action='skip'), epochs=1, bad_iters={2})
    rec = _Recorder(runner)
    runner.train()
    assert torch.equal(rec.after[2], rec.after[1])
    assert torch.allclose(rec.after[3], _sgd_step(rec.after[1], [(4, 5)]), atol=0, rtol=1e-6)  # iteration 3's batch


@pytest.mark.parametrize('bad', [3, 4])
def test_skip_with_gradient_accumulation(tmp_path, bad):
    """Windows of 2 iterations: the skipped batch adds no gradient, the other one of its window
    is applied at the window's end (iteration 4)."""
    runner = _runner(tmp_path, NonFiniteLossHook(action='skip'), epochs=1, accumulate=2, bad_iters={bad})
    rec = _Recorder(runner)
    runner.train()
    assert torch.equal(rec.after[3], rec.after[2])
    good = (6, 7) if bad == 3 else (4, 5)
    assert torch.allclose(rec.after[4], _sgd_step(rec.after[2], [good], scale=0.5), atol=0, rtol=1e-6)


@pytest.mark.parametrize('bad', [3, 4])
def test_stop_with_gradient_accumulation(tmp_path, bad):
    """Windows of 2 iterations: a non-finite loss stops training at its own iteration, whether that
    iteration ends with an optimizer step (4: read before the step) or not (3: read at its end), and
    the window's step is never taken."""
    runner = _runner(tmp_path, NonFiniteLossHook(), epochs=1, accumulate=2, bad_iters={bad})
    rec = _Recorder(runner)
    with pytest.raises(NonFiniteLossError, match=rf'^Iteration {bad}/4 .*loss_mask=nan'):
        runner.train()
    assert sorted(rec.after) == list(range(1, bad)) and torch.equal(_params(runner), rec.after[2])


def test_too_many_consecutive_skips_stop(tmp_path):
    hook = NonFiniteLossHook(action='skip', max_skips=2)
    runner = _runner(tmp_path, hook, bad_iters={5, 6, 7, 8})
    rec = _Recorder(runner)
    with pytest.raises(NonFiniteLossError) as info:
        runner.train()
    message = str(info.value)
    assert message.startswith('Iteration 7/12 (epoch 2, batch 3/4): non-finite training loss: loss_mask=nan')
    assert '3 consecutive iterations had a non-finite loss (NonFiniteLossHook max_skips=2); 2 steps were ' \
           'skipped in all' in message
    assert hook.skipped_iters == [5, 6] and torch.equal(_params(runner), rec.after[4])


class _FakeDist:
    """Rank 1 of 2 whose peer has a non-finite loss at the iterations in ``peer_bad``."""

    def __init__(self, peer_bad):
        self.peer_bad, self.calls = set(peer_bad), 0

    is_distributed = staticmethod(lambda: True)
    get_world_size = staticmethod(lambda: 2)
    get_rank = staticmethod(lambda: 1)

    def all_reduce(self, data, op='sum'):
        assert op == 'sum'
        self.calls += 1  # one flag per iteration
        data += int(self.calls in self.peer_bad)


@pytest.mark.parametrize('action', ['stop', 'skip'])
def test_all_ranks_take_the_same_decision(tmp_path, monkeypatch, action):
    from mmpola.runtime import nonfinite_loss
    monkeypatch.setattr(nonfinite_loss, 'mmdist', _FakeDist(peer_bad={3}))
    hook = NonFiniteLossHook(action=action)
    runner = _runner(tmp_path, hook, epochs=1)  # this rank's losses are all finite
    rec = _Recorder(runner)
    if action == 'stop':
        with pytest.raises(NonFiniteLossError, match=r"Iteration 3/4 \(epoch 1, batch 3/4\) \[rank 1\]: "
                           r"non-finite training loss on another rank \(this rank's losses are finite\)"):
            runner.train()
        assert torch.equal(_params(runner), rec.after[2])
    else:
        runner.train()
        assert hook.skipped_iters == [3] and torch.equal(rec.after[3], rec.after[2])
        assert 'Iteration 3/4 (epoch 1, batch 3/4) [rank 1]: non-finite loss (on another rank)' in _log(runner)


@pytest.mark.parametrize('action,optimizer', [('stop', 'SGD'), ('skip', 'AdamW')])
def test_finite_run_is_bit_identical_with_and_without_the_hook(tmp_path, action, optimizer):
    plain = _runner(tmp_path / 'plain', epochs=2, optimizer=optimizer)
    plain.train()
    guarded = _runner(tmp_path / 'guarded', NonFiniteLossHook(action=action), epochs=2, optimizer=optimizer)
    guarded.train()
    assert torch.equal(_params(plain), _params(guarded))
    # nothing of the model or the optimizer wrapper was replaced, and the hook's torch hooks are gone
    assert 'parse_losses' not in vars(guarded.model) and 'update_params' not in vars(guarded.optim_wrapper)
    assert not guarded.model._forward_hooks and not guarded.optim_wrapper.optimizer._optimizer_step_pre_hooks


def test_validation_is_not_checked(tmp_path):
    hook = NonFiniteLossHook()
    runner = _runner(tmp_path, hook, epochs=1)
    runner.train()
    hook.before_train(runner)  # installed, but outside a training iteration nothing is checked
    parsed = runner.model.parse_losses({'loss_a': torch.tensor(float('nan'))})
    assert parsed[0].isnan()


class _OwnStepModel(NonFiniteToyModel):
    """A train_step of its own: its forward through the module (``self(...)``), or past its hooks
    (``self.forward(...)``, which the check sees only in the step's outputs)."""

    def train_step(self, data, optim_wrapper):
        inputs = self.data_preprocessor(data, True)
        losses = self(**inputs, mode='loss') if self.through_module else self.forward(**inputs, mode='loss')
        loss = losses['loss_cls'] + losses['loss_mask']
        loss.backward()
        optim_wrapper.step()
        optim_wrapper.zero_grad()
        return dict(loss=loss.detach(), loss_mask=losses['loss_mask'].detach())


@pytest.mark.parametrize('through_module', [True, False])
def test_models_with_their_own_train_step_do_not_continue_silently(tmp_path, through_module):
    hook = NonFiniteLossHook(action='skip')
    runner = _runner(tmp_path, hook, epochs=1)
    model = _OwnStepModel(bad_iters={2})
    model.through_module = through_module
    runner.model = model
    rec = _Recorder(runner)
    if through_module:  # the forward hook sees the losses: the step is skipped, also without parse_losses
        runner.train()
        assert hook.skipped_iters == [2] and torch.equal(rec.after[2], rec.after[1])
        return
    with pytest.raises(NonFiniteLossError) as info:
        runner.train()
    message = str(info.value)
    assert message.startswith('Iteration 2/4 (epoch 1, batch 2/4)')
    assert 'loss_mask=nan' in message and 'weights may be corrupted' in message


def test_options_come_from_the_hook_then_the_config():
    class Runner:
        def __init__(self, **cfg):
            self.cfg = Config(cfg)

    hook = NonFiniteLossHook()
    hook.before_run(Runner(nonfinite_loss=dict(action='skip', max_skips=4)))
    assert (hook.action, hook.max_skips) == ('skip', 4)
    hook = NonFiniteLossHook()
    hook.before_run(Runner(nonfinite_loss='skip'))  # --cfg-options nonfinite_loss=skip
    assert (hook.action, hook.max_skips) == ('skip', 10)
    hook = NonFiniteLossHook(action='stop', max_skips=None)  # the hook's own arguments win
    hook.before_run(Runner(nonfinite_loss=dict(action='skip', max_skips=3)))
    assert (hook.action, hook.max_skips) == ('stop', None)
    hook = NonFiniteLossHook()
    hook.before_run(Runner())
    assert (hook.action, hook.max_skips) == ('stop', 10)
    for bad in ('ignore', dict(action='skip', max_skip=3), dict(max_skips=-2)):
        with pytest.raises(UserError, match='nonfinite_loss|max_skips'):
            NonFiniteLossHook().before_run(Runner(nonfinite_loss=bad))


def _toy_config(tmp_path, bad_iters, name):
    config = tmp_path / f'{name}.py'  # one name per run: mmengine keys its logger by config name and time
    config.write_text(f"""
_base_ = [{RUNTIME_BASE!r}]
default_scope = 'mmengine'
model = dict(type='NonFiniteToyModel', bad_iters={sorted(bad_iters)!r})
train_dataloader = dict(dataset=dict(type='NonFiniteToyDataset'), sampler=dict(type='DefaultSampler', shuffle=False),
                        collate_fn=dict(type='pseudo_collate'), batch_size={BATCH}, num_workers=0)
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.05))
train_cfg = dict(by_epoch=True, max_epochs=2)
default_hooks = dict(logger=dict(type='LoggerHook', interval=1))
""")
    return str(config)


def test_tools_train_runs_the_configs_guard_and_stops_with_the_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('MMPOLA_MALLOC_TUNING', '0')
    train = load_tool('train')
    args = train.parse_args(own_run([_toy_config(tmp_path, {3}, 'toy_skip'), '--work-dir', str(tmp_path / 'skip'),
                                     '--cfg-options', 'nonfinite_loss.action=skip', 'nonfinite_loss.max_skips=4']))
    runner = train.build_runner(args)
    hooks = [h for h in runner.hooks if isinstance(h, NonFiniteLossHook)]
    hooks[0].before_run(runner)  # the hook reads the config's settings when the run starts
    assert len(hooks) == 1 and (hooks[0].action, hooks[0].max_skips) == ('skip', 4)

    work_dir = tmp_path / 'stop'
    with pytest.raises(SystemExit) as info:
        run_main(train, [_toy_config(tmp_path, {3}, 'toy_stop'), '--work-dir', str(work_dir)])
    assert info.value.code == 1
    logs = list(work_dir.glob('*/*.log'))
    assert len(logs) == 1
    log = logs[0].read_text()
    assert 'Iteration 3/8 (epoch 1, batch 3/4): non-finite training loss: loss_mask=nan' in log
    assert 'NOT taken' in log and 'nonfinite_loss.action=skip' in log
    assert 'Traceback' not in capsys.readouterr().err
    # the dumped config tells what ran: the hooks of the runtime base and their settings, nothing added
    dumped = Config.fromfile(str(work_dir / 'toy_stop.py'))
    assert dumped.custom_hooks == [dict(type='mmpola.RandomStateHook'), dict(type='mmpola.NonFiniteLossHook'),
                                   dict(type='mmpola.NonFinitePixelsHook'), dict(type='mmpola.CheckpointFitHook'),
                                   dict(type='mmpola.WorkDirHook')]
    assert dumped.nonfinite_loss == dict(action='stop', max_skips=10)
    assert dumped.default_hooks.get('checkpoint') is None  # the toy config's choice: not replaced


def test_argument_checks():
    with pytest.raises(ValueError):
        NonFiniteLossHook(action='warn')
    with pytest.raises(ValueError):
        NonFiniteLossHook(max_skips=-1)
