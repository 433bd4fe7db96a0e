"""A training run killed with SIGKILL after a checkpoint and resumed with ``--resume`` ends with the
same weights as an uninterrupted run.

tools/train.py trains the demo detector (Mask R-CNN + Pola-PVT-T, shrunk heads: random flips,
drop-path, RPN and RoI sampling all draw random numbers) on a tiny generated COCO set, once without
interruption and once killed (SIGKILL from outside, as a node failure would) as soon as its first
checkpoint is on disk, then resumed from the latest checkpoint. Both loop types are covered, with the
data loaded in the main process (epoch-based), in a worker started anew each epoch (iteration-based),
and in one persistent worker (both loop types: the settings of the real detection configs).

A toy model trained by two processes (tools/dist_train.sh, gloo) is killed and resumed the same way:
each rank continues its own random streams.
"""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import mmdet  # noqa: E402,F401  (required: a broken install fails here)
import pytest
import torch

from tests.fixtures.paths import FIXTURES as HERE
from tests.fixtures.paths import PYTHON, REPO
from tests.fixtures.runs import free_port as _free_port
from tests.fixtures.runs import run_tool as _run
from tests.fixtures.toy_runs import load, toy_config

LOOPS = {
    # 3 epochs of 2 iterations, a checkpoint per epoch
    'epoch': dict(body="""
train_cfg = dict(max_epochs=3, val_interval=100)
default_hooks = dict(checkpoint=dict(interval=1, by_epoch=True, max_keep_ckpts=5))
train_dataloader = dict(num_workers=0)
""", first='epoch_1.pth', last='epoch_3.pth', meta_iter=6),
    # 7 iterations, a checkpoint every 2, data in a worker process
    'iter': dict(body="""
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=7, val_interval=100)
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3)]
default_hooks = dict(checkpoint=dict(interval=2, by_epoch=False, max_keep_ckpts=5))
train_dataloader = dict(num_workers=1, persistent_workers=False)
""", first='iter_2.pth', last='iter_7.pth', meta_iter=7),
}
# the same with one persistent data worker: its random augmentations must not depend on the epochs
# it served before the kill (RandomStateHook re-seeds workers per epoch) and the replay must match
PERSISTENT = "train_dataloader = dict(num_workers=1, persistent_workers=True)\n"
LOOPS['epoch-persistent-worker'] = dict(LOOPS['epoch'], body=LOOPS['epoch']['body'] + PERSISTENT)
LOOPS['iter-persistent-worker'] = dict(LOOPS['iter'], body=LOOPS['iter']['body'] + PERSISTENT)

COMMON = """
randomness = dict(seed=3, deterministic=True)
val_dataloader = None
val_cfg = None
val_evaluator = None
"""


def _config(tiny, tmp_path, loop):  # noqa: F811
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
def test_sigkill_then_resume_equals_uninterrupted(tiny, tmp_path, loop):  # noqa: F811
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
    env = dict(PYTHON=PYTHON, OMP_NUM_THREADS='1', PYTHONPATH=HERE, MMPOLA_DEVICE='cpu')

    def dist_train(work_dir, *extra):
        return ['bash', 'tools/dist_train.sh', config, '2', '--work-dir', str(work_dir), *extra]

    def run(cmd, **extra):
        proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, **env, **extra), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f'{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
        return proc.stdout + proc.stderr

    straight = tmp_path / 'straight'
    run(dist_train(straight), PORT=_free_port())
    killed = tmp_path / 'killed'
    killed.mkdir()
    _kill_after_first_checkpoint(dist_train(killed), killed, 'iter_2.pth',
                                 env=dict(env, PORT=_free_port(), TOY_SLEEP='0.3'))
    assert not osp.isfile(killed / 'iter_8.pth')
    saved = load(killed / 'iter_2.pth')['mmpola_rng_state']
    assert len(saved['per_rank']) == 2 and not torch.equal(saved['per_rank'][0]['torch'], saved['per_rank'][1]['torch'])

    log = run(dist_train(killed, '--resume'), PORT=_free_port())
    assert 'Distributed training: True' in log and 'resumed epoch: 0, iter: ' in log
    expected, actual = load(straight / 'iter_8.pth'), load(killed / 'iter_8.pth')
    for key, value in expected['state_dict'].items():
        assert torch.equal(value, actual['state_dict'][key]), f'{key} differs after resuming'


if __name__ == '__main__':
    sys.exit(pytest.main([__file__, '-q']))
