"""Checkpoints and work dirs lose nothing, through tools/train.py (subprocesses on a toy model).

* a SIGKILL while a checkpoint is written (max_keep_ckpts 1 and 3) leaves the previous checkpoint and
  ``last_checkpoint`` intact; ``--resume`` continues and ends equal to an uninterrupted run;
* a disk that fills during a save (a file size limit) ends with one ``error:`` line, the previous
  checkpoint intact and no partial file;
* ``--resume`` skips a missing or truncated latest checkpoint with a warning;
* a second run into a work dir in use stops, naming the first run's PID and host; the lock of a
  killed run is taken over with a warning;
* SIGTERM: the iteration finishes, a resumable checkpoint is written, exit status 143; resuming
  from it (also from the middle of an epoch) ends equal to an uninterrupted run.

The toy model, dataset and fault-injection hook live in toy_training.py (imported by the configs).
"""
import os
import os.path as osp
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.fixtures.paths import FIXTURES as HERE
from tests.fixtures.paths import PYTHON, REPO
from tests.fixtures.toy_runs import assert_same_training, last_named, load, stderr_lines, toy_config, train


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    """Uninterrupted epoch-based run (3 epochs x 5 iterations), checkpoints of every epoch kept."""
    tmp = tmp_path_factory.mktemp('straight')
    config = toy_config(tmp, keep=3)
    train(config, tmp / 'work')
    return dict(config=config, work=tmp / 'work')


# --------------------------------------------------------------------------------------------
# kill while saving, disk full, broken latest checkpoint

@pytest.mark.parametrize('keep', [1, 3])
def test_kill_while_saving_keeps_previous_checkpoint_and_resume_continues(straight, tmp_path, keep):
    config = toy_config(tmp_path, keep=keep)
    work = tmp_path / 'work'
    status, out = train(config, work, env=dict(TOY_KILL_AT_SAVE='2'), expect=None)
    assert status == -signal.SIGKILL, out[-3000:]
    # epoch_2.pth was being written: epoch_1.pth is complete and still the latest
    assert not osp.exists(work / 'epoch_2.pth')
    assert last_named(work) == str(work / 'epoch_1.pth')
    assert load(work / 'epoch_1.pth')['meta']['epoch'] == 1
    assert not [n for n in os.listdir(work) if n.endswith('.part')]

    _, out = train(config, work, '--resume')
    assert f'Auto resumed from the latest checkpoint {work / "epoch_1.pth"}' in out
    assert 'resumed epoch: 1, iter: 5' in out
    assert_same_training(straight['work'] / 'epoch_3.pth', work / 'epoch_3.pth')
    kept = sorted(n for n in os.listdir(work) if n.endswith('.pth'))
    assert kept == (['epoch_3.pth'] if keep == 1 else ['epoch_1.pth', 'epoch_2.pth', 'epoch_3.pth'])
    assert not [n for n in os.listdir(work) if n.endswith('.part')]


def _file_size_limit(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes beyond the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_disk_full_during_save_keeps_previous_checkpoint_one_line_error(tmp_path):
    config = toy_config(tmp_path, keep=1)
    work = tmp_path / 'work'
    status, out = train(config, work, env=dict(TOY_PAD_AT_SAVE='2', TOY_PAD_MB='4'), expect=1,
                        preexec_fn=_file_size_limit(1 << 20))
    errors = stderr_lines(out)
    assert len(errors) == 1 and 'Traceback' not in out, out[-4000:]
    assert errors[0].startswith(f'error: could not save checkpoint {work / "epoch_2.pth"}: File too large')
    assert f'the previous checkpoint {work / "epoch_1.pth"} is intact' in errors[0]
    assert last_named(work) == str(work / 'epoch_1.pth')
    assert sorted(n for n in os.listdir(work) if 'pth' in n) == ['epoch_1.pth']  # no partial file
    assert load(work / 'epoch_1.pth')['meta']['epoch'] == 1


@pytest.mark.parametrize('damage', ['missing', 'truncated'])
def test_resume_skips_a_missing_or_truncated_latest_checkpoint(straight, tmp_path, damage):
    work = tmp_path / 'work'
    shutil.copytree(straight['work'], work)
    latest = work / 'epoch_3.pth'
    with open(work / 'last_checkpoint', 'w') as f:
        f.write(str(latest))
    if damage == 'missing':
        latest.unlink()
    else:
        data = latest.read_bytes()
        latest.write_bytes(data[:len(data) // 2])
    _, out = train(straight['config'], work, '--resume', '--cfg-options', 'train_cfg.max_epochs=4')
    assert f'--resume: last_checkpoint names {latest}, which is {damage if damage == "missing" else "unread"}' \
        in out, out[-3000:]
    assert f'Auto resumed from the latest checkpoint {work / "epoch_2.pth"}' in out
    assert 'resumed epoch: 2, iter: 10' in out
    assert load(work / 'epoch_4.pth')['meta']['iter'] == 20


# --------------------------------------------------------------------------------------------
# one run per work dir

def test_second_run_into_a_locked_work_dir_stops_naming_the_first(tmp_path):
    config = toy_config(tmp_path, epochs=200)
    work = tmp_path / 'work'
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, HERE]), TOY_SLEEP='0.05')
    first = subprocess.Popen([PYTHON, 'tools/train.py', config, '--work-dir', str(work)], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not osp.isfile(work / 'epoch_1.pth') and time.time() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert first.poll() is None, 'the first run ended early'
        _, out = train(config, work, expect=2)
        errors = stderr_lines(out)
        assert len(errors) == 1 and 'Traceback' not in out, out[-3000:]
        assert errors[0].startswith(f'error: work dir {work} is in use by another training run '
                                    f'(PID {first.pid} on host {socket.gethostname()}')
        assert len(list(work.glob('*/*.log'))) == 1  # the second run wrote no log into it
    finally:
        first.kill()
        first.wait()
    # the killed run's lock is stale: taken over, with a warning naming it
    _, out = train(config, work, '--resume', '--cfg-options', 'train_cfg.max_epochs=1')
    assert f'took over the lock of a run that is no longer running (PID {first.pid} on host' in out


# --------------------------------------------------------------------------------------------
# SIGTERM

@pytest.mark.parametrize('loop,at,saved', [('epoch', 7, 'iter_7.pth'), ('epoch', 10, 'epoch_2.pth'),
                                           ('iter', 5, 'iter_5.pth'), ('epoch-persistent-worker', 7, 'iter_7.pth')])
def test_sigterm_saves_a_resumable_checkpoint_and_exits_nonzero(straight, tmp_path, loop, at, saved):
    workers = 1 if loop.endswith('worker') else 0
    config = toy_config(tmp_path, loop=loop.split('-')[0], keep=2, iters=9, workers=workers, persistent=True)
    if loop == 'epoch':
        reference = straight['work'] / 'epoch_3.pth'
    elif loop.startswith('epoch'):  # the middle of epoch 2 with a persistent worker: replay, then go on
        train(config, tmp_path / 'straight')
        reference = tmp_path / 'straight' / 'epoch_3.pth'
    else:
        train(config, tmp_path / 'straight')
        reference = tmp_path / 'straight' / 'iter_9.pth'
    work = tmp_path / 'work'
    _, out = train(config, work, env=dict(TOY_SIGTERM_AT_ITER=str(at)), expect=143)
    errors = stderr_lines(out)
    assert len(errors) == 1 and 'Traceback' not in out, out[-4000:]
    assert errors[0].startswith(f'error: training stopped by SIGTERM after iteration {at}/')
    assert f'checkpoint {work / saved} is saved and named in last_checkpoint' in errors[0]
    assert 'WARNING - [mmpola] training stopped by SIGTERM' in out  # in the log too
    assert last_named(work) == str(work / saved)
    assert load(work / saved)['meta']['iter'] == at

    if (loop, at) == ('epoch', 7):  # stopped again in the epoch resumed in its middle (batches 3..5 of 5)
        _, out = train(config, work, '--resume', env=dict(TOY_SIGTERM_AT_ITER='9'), expect=143)
        assert f'Auto resumed from the latest checkpoint {work / saved}' in out
        saved = 'iter_9.pth'
        assert load(work / saved)['meta']['mmpola_epoch_batches_done'] == 4

    _, out = train(config, work, '--resume')
    assert f'Auto resumed from the latest checkpoint {work / saved}' in out
    assert_same_training(reference, work / osp.basename(reference))


if __name__ == '__main__':
    sys.exit(pytest.main([__file__, '-q']))
