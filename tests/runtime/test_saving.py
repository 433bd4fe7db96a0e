"""SafeCheckpointHook: checkpoints that survive kills and full disks.

* in process: best checkpoints go through the atomic save and the previous best is removed only
  after the new one is complete;
* through tools/train.py (subprocesses on the toy model of tests/fixtures/toy/toy_training.py): a
  SIGKILL while a checkpoint is written (max_keep_ckpts 1 and 3) leaves the previous checkpoint and
  ``last_checkpoint`` intact, and ``--resume`` continues and ends equal to an uninterrupted run; a disk
  that fills during a save ends with one ``error:`` line, the previous checkpoint intact and no
  partial file.
"""
import os
import os.path as osp
import resource
import signal
import uuid

import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.registry import METRICS
from mmengine.runner import Runner

from mmpola.runtime import SafeCheckpointHook
from tests.fixtures.toy_runs import assert_same_training, last_named, load, stderr_lines, toy_config, train

SCORES = [0.1, 0.5, 0.3, 0.7]  # per validation: new bests at epochs 1, 2 and 4


class TinyModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = torch.stack(list(inputs)) @ self.w
        return dict(loss=(out ** 2).mean()) if mode == 'loss' else [out]


@METRICS.register_module(force=True)
class ScriptedScore(BaseMetric):
    calls = 0

    def process(self, data_batch, data_samples):
        self.results.append(0)

    def compute_metrics(self, results):
        score = SCORES[ScriptedScore.calls % len(SCORES)]
        ScriptedScore.calls += 1
        return dict(score=score)


def _runner(work_dir, removed_while_new_incomplete):
    loader = dict(dataset=[dict(inputs=torch.randn(2)) for _ in range(4)], sampler=dict(type='DefaultSampler'),
                  batch_size=2, collate_fn=pseudo_collate)
    runner = Runner(
        model=TinyModel(), work_dir=str(work_dir), train_dataloader=loader, val_dataloader=loader,
        val_evaluator=dict(type='ScriptedScore'), val_cfg=dict(),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)), train_cfg=dict(by_epoch=True, max_epochs=4),
        default_hooks=dict(checkpoint=dict(type='SafeCheckpointHook', interval=1, max_keep_ckpts=1,
                                           save_best='score', rule='greater')),
        experiment_name=f'best_{uuid.uuid4().hex}', log_level='WARNING')
    hook = next(h for h in runner.hooks if isinstance(h, SafeCheckpointHook))
    original = hook._write

    def checked_write(runner_, filename, **kwargs):  # the files present while a save is under way
        path = original(runner_, filename, **kwargs)
        removed_while_new_incomplete.append((filename, sorted(os.listdir(work_dir))))
        return path

    hook._write = checked_write
    return runner


def test_best_and_regular_checkpoints_are_written_before_old_ones_go(tmp_path):
    ScriptedScore.calls = 0
    seen = []
    _runner(tmp_path, seen).train()
    files = sorted(n for n in os.listdir(tmp_path) if n.endswith(('.pth', '.part')))
    assert files == ['best_score_epoch_4.pth', 'epoch_4.pth']
    # when best_score_epoch_2.pth was complete the previous best was still there; when epoch_2.pth was
    # (its first write), epoch_1.pth was
    written = dict(reversed(seen))
    assert {'best_score_epoch_1.pth', 'best_score_epoch_2.pth'} <= set(written['best_score_epoch_2.pth'])
    assert {'epoch_1.pth', 'epoch_2.pth'} <= set(written['epoch_2.pth'])
    assert not any(n.endswith('.part') for names in written.values() for n in names)
    with open(tmp_path / 'last_checkpoint') as f:
        assert f.read() == str(tmp_path / 'epoch_4.pth')


# --------------------------------------------------------------------------------------------
# through tools/train.py

@pytest.mark.parametrize('keep', [1, 3])
def test_kill_while_saving_keeps_previous_checkpoint_and_resume_continues(straight, tmp_path, keep):
    config = toy_config(tmp_path, keep=keep, workers=1, persistent=True)
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
    config = toy_config(tmp_path, keep=1, workers=1, persistent=True)
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
