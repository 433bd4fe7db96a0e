"""SIGTERM (what slurm and most schedulers send before killing a job) and Ctrl-C, through tools/train.py
on the toy model: the iteration finishes, a resumable checkpoint is written, the run ends with one
``error:`` line and exit status 143 (130 for Ctrl-C); resuming from it (also from the middle of an
epoch, with a persistent data worker, and when stopped again in that epoch) ends equal to an
uninterrupted run. Sent to the whole process group (the data worker too) the same holds; a second
Ctrl-C stops at once, naming the last checkpoint; the resume point of an interrupted epoch is removed
once a later checkpoint is complete."""
import os
import os.path as osp
import signal

import pytest

from tests.fixtures.toy_runs import assert_same_training, last_named, load, stderr_lines, toy_config, train


# epoch-based cases: the `straight` run's config (one persistent data worker); iteration-based: no worker
@pytest.mark.parametrize('loop,at,saved', [('epoch', 7, 'iter_7.pth'), ('epoch', 10, 'epoch_2.pth'),
                                           ('iter', 5, 'iter_5.pth')])
def test_sigterm_saves_a_resumable_checkpoint_and_exits_nonzero(straight, tmp_path, loop, at, saved):
    if loop == 'epoch':
        config = toy_config(tmp_path, keep=2, workers=1, persistent=True)
        reference = straight['work'] / 'epoch_3.pth'
    else:
        config = toy_config(tmp_path, loop='iter', keep=2, iters=9)
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
    if loop == 'epoch':  # the resume points of interrupted epochs are gone once later checkpoints exist
        assert not list(work.glob('iter_*.pth'))


@pytest.mark.parametrize('signame', ['SIGTERM', 'SIGINT'])
def test_a_signal_to_the_whole_process_group_saves_and_resumes(straight, tmp_path, signame):
    """What schedulers (SIGTERM) and Ctrl-C (SIGINT) do: the signal reaches the data worker too, which
    leaves it to the main process: iteration 7 finishes, iter_7.pth is written; resumed (after Ctrl-C), the
    run ends equal to an uninterrupted one, and iter_7.pth is removed once epoch_2.pth supersedes it."""
    config = toy_config(tmp_path, keep=2, workers=1, persistent=True)
    work = tmp_path / 'work'
    signum = getattr(signal, signame)
    _, out = train(config, work, env=dict(TOY_GROUP_SIGNAL_AT_ITER='7', TOY_SIGNAL=signame), expect=128 + signum,
                   start_new_session=True)
    errors = stderr_lines(out)
    assert len(errors) == 1 and 'Traceback' not in out and 'DataLoader worker' not in out, out[-4000:]
    name = 'SIGINT (Ctrl-C)' if signame == 'SIGINT' else 'SIGTERM'
    assert errors[0] == (f'error: training stopped by {name} after iteration 7/15: the resumable checkpoint '
                         f'{work / "iter_7.pth"} is saved and named in last_checkpoint; continue with tools/train.py '
                         'CONFIG --resume (same --work-dir).')
    assert 'Press Ctrl-C again to stop at once without saving' in out if signame == 'SIGINT' else True
    if signame == 'SIGTERM':
        return  # resumed as after the SIGTERM of the process alone (above)
    _, out = train(config, work, '--resume')
    assert f'Auto resumed from the latest checkpoint {work / "iter_7.pth"}' in out
    assert f'removed {work / "iter_7.pth"}, the resume point of an interrupted epoch, now that ' \
           f'{work / "epoch_2.pth"} is saved' in out
    assert sorted(p.name for p in work.glob('*.pth')) == ['epoch_2.pth', 'epoch_3.pth']
    assert_same_training(straight['work'] / 'epoch_3.pth', work / 'epoch_3.pth')


def test_a_second_ctrl_c_stops_at_once_naming_the_last_checkpoint(straight, tmp_path):
    """Two Ctrl-C in one iteration: no save is waited for; the run ends with one line naming the last
    checkpoint (epoch_1.pth), which --resume continues from."""
    config = toy_config(tmp_path, keep=2, workers=1, persistent=True)
    work = tmp_path / 'work'
    _, out = train(config, work, env=dict(TOY_GROUP_SIGNAL_AT_ITER='7', TOY_SIGNAL='SIGINT', TOY_SIGNAL_TIMES='2'),
                   expect=130, start_new_session=True)
    errors = stderr_lines(out)
    assert len(errors) == 1 and 'Traceback' not in out, out[-4000:]
    assert errors[0] == (f'error: training stopped by a second Ctrl-C in iteration 7/15 without writing a checkpoint: '
                         f'the last checkpoint of this run is {work / "epoch_1.pth"} (named in last_checkpoint); '
                         'continue with tools/train.py CONFIG --resume (same --work-dir).')
    assert 'Press Ctrl-C again to stop at once without saving' in out
    assert not list(work.glob('iter_*.pth'))


def test_an_error_after_a_stop_signal_ends_cleanly():
    """A DataLoader worker that a signal ended anyway (here: simulated) ends the run with one line."""
    from types import SimpleNamespace

    from mmpola.runtime.signals import StopSignals, TrainingInterrupted, stopped_cleanly
    runner = SimpleNamespace(message_hub=SimpleNamespace(get_info=lambda key: '/w/epoch_1.pth'), logger=None,
                             _train_loop=SimpleNamespace(iter=6, max_iters=15))
    stop = StopSignals()
    stop.install()
    try:
        with pytest.raises(TrainingInterrupted) as exc, stopped_cleanly(runner):
            os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError('DataLoader worker (pid 123) is killed by signal: Terminated.')
    finally:
        stop.restore()
    assert exc.value.exit_code == 143
    assert str(exc.value) == ('training stopped by SIGTERM (then RuntimeError: DataLoader worker (pid 123) is killed '
                              'by signal: Terminated.) in iteration 7/15 without writing a checkpoint: the last '
                              'checkpoint of this run is /w/epoch_1.pth (named in last_checkpoint); continue with '
                              'tools/train.py CONFIG --resume (same --work-dir).')
    with pytest.raises(RuntimeError, match='no signal'), stopped_cleanly(runner):  # no signal: not ours to explain
        raise RuntimeError('no signal')
