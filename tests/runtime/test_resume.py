"""Which checkpoint --resume continues from (mmpola.runtime.resume): the newest readable one when the
file ``last_checkpoint`` names is missing or truncated, in process and through tools/train.py."""
import os
import shutil

import pytest
import torch

from mmpola.runtime import find_resumable_checkpoint
from tests.fixtures.toy_runs import load, train_here


def test_find_resumable_checkpoint_falls_back_to_the_newest_readable(tmp_path):
    assert find_resumable_checkpoint(str(tmp_path)) == (None, [])
    for step in (1, 2, 3):
        torch.save({'meta': {'epoch': step}}, tmp_path / f'epoch_{step}.pth')
        os.utime(tmp_path / f'epoch_{step}.pth', (step, step))
    (tmp_path / 'epoch_3.pth').write_bytes((tmp_path / 'epoch_3.pth').read_bytes()[:40])  # cut short
    os.utime(tmp_path / 'epoch_3.pth', (3, 3))
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'epoch_4.pth'))  # deleted
    path, warnings = find_resumable_checkpoint(str(tmp_path))
    assert path == str(tmp_path / 'epoch_2.pth')
    assert warnings[0] == f'last_checkpoint names {tmp_path / "epoch_4.pth"}, which is missing'
    assert warnings[1].startswith(f'{tmp_path / "epoch_3.pth"} is unreadable')


@pytest.mark.parametrize('damage', ['missing', 'truncated'])
def test_resume_skips_a_missing_or_truncated_latest_checkpoint(straight, tmp_path, damage, capsys):
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
    out = train_here(capsys, straight['config'], work, '--resume', '--cfg-options', 'train_cfg.max_epochs=4')
    assert f'--resume: last_checkpoint names {latest}, which is {damage if damage == "missing" else "unread"}' \
        in out, out[-3000:]
    assert f'Auto resumed from the latest checkpoint {work / "epoch_2.pth"}' in out
    assert 'resumed epoch: 2, iter: 10' in out
    assert load(work / 'epoch_4.pth')['meta']['iter'] == 20


def test_resume_into_a_work_dir_without_checkpoints_stops(tmp_path):
    from mmpola.errors import UserError
    from mmpola.runtime.resume import check_resume_work_dir
    (tmp_path / 'mask-rcnn_run1').mkdir()
    (tmp_path / 'mask-rcnn_run1' / 'epoch_1.pth').write_bytes(b'')
    (tmp_path / 'empty').mkdir()
    check_resume_work_dir(str(tmp_path / 'mask-rcnn_run1'))
    with pytest.raises(UserError, match=r"mask-rcnn_rnu1 does not exist, so there is nothing to resume: the run "
                                        r"would start from scratch\. A mistyped --work-dir, or a run that ended before "
                                        r"its first checkpoint\? Did you mean '.*/mask-rcnn_run1' \(holding "
                                        r"checkpoints\)\? To start a new run there .* use --resume-or-start "
                                        r'\(with another train.py: --resume --cfg-options resume_or_start=True\)\.'):
        check_resume_work_dir(str(tmp_path / 'mask-rcnn_rnu1'))
    with pytest.raises(UserError, match=r'empty holds no checkpoint \(no last_checkpoint, no epoch_\*.pth or '):
        check_resume_work_dir(str(tmp_path / 'empty'))
    check_resume_work_dir(str(tmp_path / 'empty'), allow_new=True)


def test_resume_into_a_mistyped_work_dir_through_the_tool(straight, tmp_path, capsys):
    """Nothing is created where the mistyped dir would be; --resume-or-start starts a new run there and
    continues it the next time."""
    from tests.fixtures.tools import load_tool, refused
    typo = straight['work'].parent / 'wrok'
    err = refused(load_tool('train'), [straight['config'], '--work-dir', str(typo), '--resume'], capsys)
    assert err == (
        f'--resume: the work dir {typo} does not exist, so there is nothing to resume: the run would start '
        "from scratch. A mistyped --work-dir, or a run that ended before its first checkpoint? Did you mean "
        f"'{straight['work']}' (holding checkpoints)? To start a new run there when it holds no checkpoint yet (a job "
        'script that always resumes), use --resume-or-start (with another train.py: --resume --cfg-options '
        'resume_or_start=True).')
    assert not typo.exists()
    work = tmp_path / 'work'
    out = train_here(capsys, straight['config'], work, '--resume-or-start', '--cfg-options', 'train_cfg.max_epochs=1')
    assert f'--resume: no checkpoint in {work} yet; a new run starts there (resume_or_start=True)' in out
    out = train_here(capsys, straight['config'], work, '--resume-or-start', '--cfg-options', 'train_cfg.max_epochs=2')
    assert f'Auto resumed from the latest checkpoint {work / "epoch_1.pth"}' in out
    assert load(work / 'epoch_2.pth')['meta']['iter'] == 10


def test_a_new_run_into_a_work_dir_with_checkpoints_stops(straight, tmp_path, capsys):
    """Without --resume, tools/train.py into a work dir that holds an earlier run's checkpoints stops before
    it changes any of them (mmengine would overwrite them one by one and leave the others: two runs in one folder);
    --resume in a copied work dir continues from the copy's checkpoint, not the original folder's."""
    from mmpola.runtime.workdir import LOCK_NAME
    from tests.fixtures.tools import load_tool, refused
    work = tmp_path / 'work'
    shutil.copytree(straight['work'], work)
    before = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    err = refused(load_tool('train'), [straight['config'], '--work-dir', str(work)], capsys)
    assert err == (
        f"the work dir {work} holds an earlier run's checkpoints (epoch_1.pth, epoch_2.pth, epoch_3.pth, "
        "last_checkpoint): a new run there would overwrite them one by one and mix the two runs' files. --resume "
        'continues that run (--resume-or-start in job scripts), --work-dir DIR starts the new one elsewhere; to '
        'start over in this folder, move or delete its *.pth files and last_checkpoint first.')
    after = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file() and p.name != LOCK_NAME}
    assert after == before  # the earlier run's config copy too
    # the copy's last_checkpoint names the original folder's file: the copy resumes from its own
    out = train_here(capsys, straight['config'], work, '--resume', '--cfg-options', 'train_cfg.max_epochs=4')
    assert (f'--resume: last_checkpoint names {straight["work"] / "epoch_3.pth"}, outside the work dir (a copied or '
            'moved work dir), which holds its own epoch_3.pth; skipped.') in out
    assert f'Auto resumed from the latest checkpoint {work / "epoch_3.pth"}' in out
    assert (work / 'last_checkpoint').read_text().strip() == str(work / 'epoch_4.pth')


def test_resume_after_changing_the_lr_says_the_checkpoints_lr_wins(straight, tmp_path, capsys):
    """The checkpoint's optimizer and scheduler states are restored, lr included (mmengine's behaviour): the
    resumed run goes on with the old lr; one warning says so and how to train with the new one."""
    work = tmp_path / 'work'
    shutil.copytree(straight['work'], work)
    (work / 'last_checkpoint').write_text(str(work / 'epoch_2.pth'))
    out = train_here(capsys, straight['config'], work, '--resume', '--cfg-options', 'train_cfg.max_epochs=3',
                     'optim_wrapper.optimizer.lr=0.01')
    note = (f"--resume: the config's lr is 0.01, but the run in {work / 'epoch_2.pth'} started with 0.05: resuming "
            "restores the checkpoint's optimizer and lr scheduler states, lr included, so this run goes on with 0.05 "
            'and its schedule; the new lr is not used. To train with the new lr, start a new run from the '
            f"checkpoint's weights: drop --resume and add --cfg-options load_from={work / 'epoch_2.pth'} (its "
            'schedule starts again at epoch / iteration 0).')
    assert out.count(note) == 1, out[-3000:]
    saved = load(work / 'epoch_3.pth')['optimizer']['param_groups'][0]
    assert saved['initial_lr'] == pytest.approx(0.05) and saved['lr'] == pytest.approx(0.05)  # as said
    # the same lr: no word
    out = train_here(capsys, straight['config'], work, '--resume', '--cfg-options', 'train_cfg.max_epochs=4')
    assert "the config's lr" not in out
