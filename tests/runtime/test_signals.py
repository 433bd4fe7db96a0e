"""SIGTERM (what slurm and most schedulers send before killing a job), through tools/train.py on the
toy model: the iteration finishes, a resumable checkpoint is written, the run ends with one ``error:``
line and exit status 143; resuming from it (also from the middle of an epoch, with a persistent data
worker, and when stopped again in that epoch) ends equal to an uninterrupted run."""
import os.path as osp

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
