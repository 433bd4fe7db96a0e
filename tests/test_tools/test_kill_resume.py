"""A training run killed with SIGKILL after a checkpoint and resumed with ``--resume`` ends with the
same weights as an uninterrupted run.

tools/train.py trains the demo detector (Mask R-CNN + Pola-PVT-T, shrunk heads: random flips,
drop-path, RPN and RoI sampling all draw random numbers) on a tiny generated COCO set, once without
interruption and once killed (SIGKILL from outside, as a node failure would) as soon as its first
checkpoint is on disk, then resumed from the latest checkpoint. Both loop types are covered, with the
data loaded in the main process (epoch-based) and in a worker (iteration-based).
"""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

from test_train_test_tools import PYTHON, REPO, _run, tiny  # noqa: F401  (tiny is a fixture)

import mmdet  # noqa: E402,F401  (required: a broken install fails here)

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


def _kill_after_first_checkpoint(cmd, work_dir, first, timeout=300):
    """Start training, SIGKILL it once ``first`` is saved and named in last_checkpoint."""
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = osp.join(work_dir, 'last_checkpoint')
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None:
            if osp.isfile(marker):
                with open(marker) as f:
                    if f.read().strip().endswith(first):
                        proc.send_signal(signal.SIGKILL)
                        break
            time.sleep(0.02)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
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


if __name__ == '__main__':
    sys.exit(pytest.main([__file__, '-q']))
