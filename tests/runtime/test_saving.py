"""SafeCheckpointHook in process: best checkpoints go through the atomic save and the previous best is
removed only after the new one is complete; find_resumable_checkpoint's choice. The tool-level cases
(kills, disk full, SIGTERM, work dir lock) are in tests/tools/test_checkpoint_safety.py."""
import os
import uuid

import torch
from mmengine.dataset import pseudo_collate
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.registry import METRICS
from mmengine.runner import Runner

from mmpola.runtime import SafeCheckpointHook, find_resumable_checkpoint

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
