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
