"""Exact resume (RandomStateHook): a run killed after a checkpoint and resumed ends with the same
weights as an uninterrupted run.

* in process, on a toy model whose loss and data draw torch / numpy / python random numbers: with
  the hook the resumed run repeats the uninterrupted one, without it it does not;
* through tools/train.py, the tiny demo detector (Mask R-CNN + a narrow Pola-PVT, shrunk heads: random
  flips, drop-path, RPN and RoI sampling all draw random numbers) on a tiny generated COCO set, killed
  (SIGKILL from outside, as a node failure would) as soon as its first checkpoint is on disk, then
  resumed: both loop types, with one persistent data worker (the settings of the real detection
  configs; it covers data loaded in the main process and in workers started anew each epoch too:
  the same states and seeds travel in the checkpoint);
* a toy model trained by two processes (tools/dist_train.sh, gloo), killed and resumed the same way:
  each rank continues its own random streams.
"""
import os
import os.path as osp
import random
import signal
import subprocess
import time
import uuid

import mmdet  # noqa: F401  (required: a broken install fails here)
import numpy as np
import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.model import BaseModel
from mmengine.runner import Runner

from mmpola.runtime import RandomStateHook
from mmpola.runtime.random_state import CHECKPOINT_KEY
from tests.fixtures.paths import PYTHON, REPO
from tests.fixtures.runs import free_port
from tests.fixtures.runs import run_tool as _run
from tests.fixtures.toy_runs import load, toy_config


class NoisyToyModel(BaseModel):
    """The loss uses a random mask (torch RNG) like dropout / drop-path / RoI sampling."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        x = torch.stack(list(inputs))
        out = self.linear(x * (torch.rand_like(x) > 0.3))
        if mode == 'loss':
            return dict(loss=((out - 1) ** 2).mean())
        return out


class AugmentedToyDataset(torch.utils.data.Dataset):
    """Random augmentations with numpy and python RNGs (like RandomFlip / RandomResize)."""

    def __init__(self):
        self.x = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        scale = float(np.random.uniform(0.5, 1.5)) * random.choice([1.0, -1.0])
        return dict(inputs=self.x[i] * scale)


def _runner(work_dir, resume=False, load_from=None, hooks=True, max_iters=6):
    torch.manual_seed(0)  # the model is built here, before the Runner seeds: same initial weights
    return Runner(
        model=NoisyToyModel(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=AugmentedToyDataset(), sampler=dict(type='DefaultSampler', shuffle=True),
                              batch_size=2, num_workers=0, collate_fn=pseudo_collate),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.05)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters), resume=resume, load_from=load_from,
        custom_hooks=[RandomStateHook()] if hooks else None,
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=1), experiment_name=f'rng_{uuid.uuid4().hex}', log_level='WARNING')


def _weights(runner):
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


@pytest.mark.parametrize('hooks', [True, False])
def test_resume_repeats_the_uninterrupted_run_only_with_the_hook(tmp_path, hooks):
    straight = _runner(tmp_path / 'a', hooks=hooks)
    straight.train()  # 6 iterations: 1 epoch of 5 batches and one more; checkpoints at 2, 4, 6
    expected = _weights(straight)

    interrupted = _runner(tmp_path / 'b', hooks=hooks, max_iters=2)
    interrupted.train()
    resumed = _runner(tmp_path / 'b', hooks=hooks, resume=True, load_from=str(tmp_path / 'b' / 'iter_2.pth'))
    resumed.train()
    assert resumed.iter == 6
    same = all(torch.equal(v, expected[k]) for k, v in _weights(resumed).items())
    assert same is hooks  # without the RNG states, the masks and augmentations after iteration 2 differ


def test_checkpoint_holds_the_states_and_load_from_leaves_them_alone(tmp_path):
    _runner(tmp_path / 'a', max_iters=2).train()
    saved = torch.load(tmp_path / 'a' / 'iter_2.pth', map_location='cpu', weights_only=True)
    state = saved[CHECKPOINT_KEY]
    assert set(state) >= {'python', 'numpy', 'torch', 'generators'} and 'train' in state['generators']

    # load_from (fine-tuning) starts its own random stream
    hook = RandomStateHook()
    runner = _runner(tmp_path / 'c', load_from=str(tmp_path / 'a' / 'iter_2.pth'), hooks=False)
    runner.register_hook(hook)
    runner.load_or_resume()
    assert hook._pending is None


def test_resuming_a_checkpoint_without_states_warns(tmp_path):
    _runner(tmp_path / 'a', hooks=False, max_iters=2).train()
    runner = _runner(tmp_path / 'a', resume=True, max_iters=3)
    warnings = []
    runner.logger.warning = warnings.append
    runner.train()
    assert runner.iter == 3
    assert any('no random generator states' in w for w in warnings), warnings


# ----------------------------------------------------------------------------------------------
# the demo detector through tools/train.py, killed after its first checkpoint

LOOPS = {
    # 2 epochs of 2 iterations, a checkpoint per epoch, one persistent data worker
    'epoch': dict(body="""
train_cfg = dict(max_epochs=2, val_interval=100)
default_hooks = dict(checkpoint=dict(interval=1, by_epoch=True, max_keep_ckpts=5))
""", first='epoch_1.pth', last='epoch_2.pth', meta_iter=4),
    # 4 iterations (the loader restarts after 2), a checkpoint every 2, one persistent data worker
    'iter': dict(body="""
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=4, val_interval=100)
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3)]
default_hooks = dict(checkpoint=dict(interval=2, by_epoch=False, max_keep_ckpts=5))
""", first='iter_2.pth', last='iter_4.pth', meta_iter=4),
}
COMMON = """
randomness = dict(seed=3, deterministic=True)
train_dataloader = dict(num_workers=1, persistent_workers=True)
val_dataloader = None
val_cfg = None
val_evaluator = None
"""


def _config(tiny, tmp_path, loop):
    path = tmp_path / f'kill_resume_{loop}.py'
    path.write_text(f"_base_ = [{tiny['config']!r}]\n" + COMMON + LOOPS[loop]['body'])
    return str(path)


def _train_cmd(config, work_dir, *extra):
    return [PYTHON, 'tools/train.py', config, '--work-dir', str(work_dir), *extra]


def _process_tree(pid):
    """``pid`` and all its descendants (torchrun starts its workers in sessions of their own)."""
    children = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    ppid = int(f.read().rsplit(')', 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def _kill_tree(pid):
    for member in _process_tree(pid):
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _kill_after_first_checkpoint(cmd, work_dir, first, timeout=300, env=None):
    """Start training, SIGKILL it (and every process it started) once ``first`` is saved and named in
    last_checkpoint."""
    env = dict(os.environ, **dict(dict(PYTHONPATH=REPO), **(env or {})))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = osp.join(work_dir, 'last_checkpoint')
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None:
            if osp.isfile(marker):
                with open(marker) as f:
                    if f.read().strip().endswith(first):
                        _kill_tree(proc.pid)
                        break
            time.sleep(0.02)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
            proc.wait()
    stderr = proc.stderr.read().decode(errors='replace')
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, \
        f'the run was not killed in the middle (exit {proc.returncode}); stderr tail:\n{stderr[-3000:]}'


def _state(path):
    return torch.load(path, map_location='cpu', weights_only=True)


@pytest.mark.parametrize('loop', list(LOOPS))
def test_sigkill_then_resume_equals_uninterrupted(tiny, tmp_path, loop):
    spec = LOOPS[loop]
    config = _config(tiny, tmp_path, loop)

    straight = tmp_path / 'straight'
    _run(_train_cmd(config, straight), timeout=600)

    killed = tmp_path / 'killed'
    killed.mkdir()
    _kill_after_first_checkpoint(_train_cmd(config, killed), killed, spec['first'])
    assert not osp.isfile(killed / spec['last'])
    with open(killed / 'last_checkpoint') as f:
        resumed_from = f.read().strip()

    log = _run(_train_cmd(config, killed, '--resume'), timeout=600)
    assert f'Auto resumed from the latest checkpoint {resumed_from}' in log
    resumed_iter = _state(resumed_from)['meta']['iter']
    assert f'iter: {resumed_iter}' in log and resumed_iter < spec['meta_iter']

    expected, actual = _state(straight / spec['last']), _state(killed / spec['last'])
    assert actual['meta']['iter'] == expected['meta']['iter'] == spec['meta_iter']
    assert expected['state_dict'].keys() == actual['state_dict'].keys()
    differing = [k for k, v in expected['state_dict'].items() if not torch.equal(v, actual['state_dict'][k])]
    assert not differing, f'{len(differing)} tensors differ after resuming, e.g. {differing[:5]}'
    for index, entries in expected['optimizer']['state'].items():
        for name, value in entries.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(actual['optimizer']['state'][index][name]))
    # the run did change the weights (the comparison is not between two untouched models)
    first = _state(straight / spec['first'])['state_dict']
    assert any(not torch.equal(v, first[k]) for k, v in expected['state_dict'].items())


# ----------------------------------------------------------------------------------------------
# two processes (gloo): every rank's random generators are saved and restored

def test_two_processes_killed_and_resumed_equal_uninterrupted(tmp_path):
    """Ranks draw different amounts of random numbers (data-dependent), so restoring rank 0's states on
    every rank would not repeat the run; with per-rank states the resumed run ends bit-identical."""
    config = toy_config(tmp_path, loop='iter', keep=3, iters=8, interval=2)
    env = dict(PYTHON=PYTHON, OMP_NUM_THREADS='1', PYTHONPATH=REPO, MMPOLA_DEVICE='cpu')

    def dist_train(work_dir, *extra):
        return ['bash', 'tools/dist_train.sh', config, '2', '--work-dir', str(work_dir), *extra]

    def run(cmd, **extra):
        proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, **env, **extra), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f'{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
        return proc.stdout + proc.stderr

    straight = tmp_path / 'straight'
    run(dist_train(straight), PORT=free_port())
    killed = tmp_path / 'killed'
    killed.mkdir()
    _kill_after_first_checkpoint(dist_train(killed), killed, 'iter_2.pth',
                                 env=dict(env, PORT=free_port(), TOY_SLEEP='0.3'))
    assert not osp.isfile(killed / 'iter_8.pth')
    saved = load(killed / 'iter_2.pth')['mmpola_rng_state']
    assert len(saved['per_rank']) == 2 and not torch.equal(saved['per_rank'][0]['torch'], saved['per_rank'][1]['torch'])

    log = run(dist_train(killed, '--resume'), PORT=free_port())
    assert 'Distributed training: True' in log and 'resumed epoch: 0, iter: ' in log
    expected, actual = load(straight / 'iter_8.pth'), load(killed / 'iter_8.pth')
    for key, value in expected['state_dict'].items():
        assert torch.equal(value, actual['state_dict'][key]), f'{key} differs after resuming'
