"""tools/demo_classification.py end to end at toy scale: data generation, untrained and trained accuracy, the
accuracy per class, the checkpoint, the summary and the default run's check that the model learned (the real demo
trains 12 epochs on 300 images)."""
import json
import os.path as osp

import pytest

from mmpola.classification.demo_imagenet import DEMO_CLASSES
from tests.fixtures.tools import demo_that_did_not_learn, load_tool


def test_demo_runs_reports_before_and_after_and_checks_that_it_learned(tmp_path, monkeypatch):
    """The default run (no --epochs), shortened to one epoch with a minimum no run reaches
    (:func:`demo_that_did_not_learn`): it writes its results and checkpoint, then ends in the one line that names
    the top-1 accuracy."""
    demo = load_tool('demo_classification')
    work_dir = tmp_path / 'work'
    # 3 images per class: 18, one batch of the config's 16 (the last incomplete batch is dropped)
    demo_that_did_not_learn(demo, ['--work-dir', str(work_dir), '--data-root', str(tmp_path / 'data'),
                                   '--num-train', '3', '--num-val', '1'], 'epochs', 1, monkeypatch)
    with open(work_dir / 'summary.json') as f:
        summary = json.load(f)
    assert summary['epochs'] == 1 and summary['iterations'] >= 1
    assert set(demo.LEARNED) <= set(summary['after']) == set(summary['before'])  # the checked metric is reported
    assert all(0 <= v <= 100 for v in summary['after'].values())
    assert list(summary['per_class_top1']) == list(DEMO_CLASSES)
    assert osp.isfile(summary['checkpoint'])


def test_fewer_training_images_than_one_batch_are_refused_in_one_line(tmp_path, capsys):
    """--num-train 2: 12 generated training images, fewer than the config's batch of 16 (the incomplete last batch is
    dropped): one line with the sizes and the fix, before any training."""
    demo = load_tool('demo_classification')
    with pytest.raises(SystemExit) as exc:
        demo.main(['--work-dir', str(tmp_path / 'work'), '--data-root', str(tmp_path / 'data'), '--num-train', '2',
                   '--num-val', '1'])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count('\n') == 1 and 'Traceback' not in err, err[-3000:]
    assert err.startswith('error: train_dataloader gives no batch: the training set has 12 samples, fewer than one '
                          'batch of 16'), err
    assert not list((tmp_path / 'work').rglob('*.pth'))  # nothing trained
