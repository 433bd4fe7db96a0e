"""One training run per work dir (mmpola.runtime.workdir, through tools/train.py): a second run into a
work dir in use stops, naming the first run's PID and host; the lock of a killed run is taken over
with a warning."""
import os
import socket
import subprocess
import time

from tests.fixtures.paths import PYTHON, REPO
from tests.fixtures.toy_runs import stderr_lines, toy_config, train


def test_second_run_into_a_locked_work_dir_stops_naming_the_first(tmp_path):
    config = toy_config(tmp_path, epochs=200)
    work = tmp_path / 'work'
    env = dict(os.environ, PYTHONPATH=REPO, TOY_SLEEP='0.05')
    first = subprocess.Popen([PYTHON, 'tools/train.py', config, '--work-dir', str(work)], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240  # the first run holds the lock and has started its log
        while not list(work.glob('*/*.log')) and time.time() < deadline and first.poll() is None:
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
    _, out = train(config, work, '--resume-or-start', '--cfg-options', 'train_cfg.max_epochs=1')
    assert f'took over the lock of a run that is no longer running (PID {first.pid} on host' in out


def test_a_work_dir_that_is_a_file_or_not_writable_is_refused_before_anything_is_built(tmp_path, capsys):
    """Before: mmengine's raw FileExistsError (a file) or PermissionError (read-only) when the Runner
    made the folder, after the config check and the pre-flight had run."""
    from mmengine.logging import MMLogger

    from tests.fixtures.tools import load_tool, refused
    MMLogger.get_current_instance()
    tool = load_tool('train')
    config = toy_config(tmp_path)
    busy = tmp_path / 'results'
    busy.write_text('a file\n')
    err = refused(tool, [config, '--work-dir', str(busy)], capsys, [busy])
    assert err == (f"work dir '{busy}' is a file, not a folder: the run writes its checkpoints and logs into a "
                   'folder of that name. Fix: give this run another --work-dir (a folder on a writable disk), or '
                   'move the file away.')
    err = refused(tool, [config, '--work-dir', str(busy / 'run1')], capsys, [busy])
    assert err.startswith(f"work dir '{busy}/run1' cannot be created: '{busy}' on its path is a file, not a folder.")
    # a read-only folder (root writes anywhere a mode allows nothing: a sysfs folder is read-only for it too)
    read_only = tmp_path / 'ro'
    read_only.mkdir()
    os.chmod(read_only, 0o555)
    if os.geteuid() == 0:
        read_only = '/sys/kernel'
    err = refused(tool, [config, '--work-dir', f'{read_only}/work'], capsys)
    assert err.startswith(f"'{read_only}', where the work dir '{read_only}/work' would be created, is not writable (")
    assert err.endswith('Fix: give this run another --work-dir (a folder on a writable disk), or make it writable.')
    assert not os.path.exists(f'{read_only}/work')


def test_a_work_dir_deleted_during_training_is_recreated_and_nothing_more_is_lost(tmp_path):
    """``rm -rf`` of the work dir in iteration 3 of 10 (epoch 1): WorkDirHook recreates it before the next
    log write, with one warning; the checkpoints of epochs 1 and 2 are saved as planned, the log (copied
    back from the open file) still holds the first iterations and the config is dumped again. Before: a
    ``FileNotFoundError`` traceback at the next log write, no checkpoint."""
    from tests.fixtures.toy_runs import last_named, load
    config = toy_config(tmp_path, epochs=2)
    work = tmp_path / 'work'
    _, out = train(config, work, env=dict(TOY_RMTREE_AT_ITER='3'))
    assert 'Traceback' not in out
    warnings = [line for line in out.splitlines() if f'work dir {work} was deleted' in line]
    assert len(warnings) == 1, out[-3000:]
    assert 'recreated it, so the coming checkpoints and logs are saved as planned' in warnings[0]
    assert last_named(work) == str(work / 'epoch_2.pth') and (work / 'epoch_1.pth').is_file()
    assert load(work / 'epoch_2.pth')['meta']['iter'] == 10
    log = next(work.glob('*/*.log')).read_text()
    assert 'Epoch(train) [1][1/5]' in log and 'Epoch(train) [2][5/5]' in log and warnings[0] in log
    assert (work / 'toy.py').is_file()  # the config dumped again
