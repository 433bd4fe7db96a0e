"""tools/demo_detection.py end to end at toy scale: data generation, untrained and trained COCO
metrics, the figure, the summary and the default run's check that the model learned (the real demo
trains 6 epochs on 320 images)."""
import json
import os.path as osp

import mmdet  # noqa: E402,F401  (required: a broken install fails here)

from tests.fixtures.tools import demo_that_did_not_learn, load_tool


def test_demo_runs_reports_before_and_after_and_checks_that_it_learned(tmp_path, monkeypatch):
    """The default run (no --epochs), shortened to one epoch with minimums no run reaches
    (:func:`demo_that_did_not_learn`): it writes its results, then ends in the one line that names the box and
    mask mAP."""
    demo = load_tool('demo_detection')
    demo_that_did_not_learn(demo, ['--work-dir', str(tmp_path / 'work'), '--data-root', str(tmp_path / 'data'),
                                   '--num-train', '4', '--num-val', '2', '--num-figure-images', '2'], 'epochs', 1,
                            monkeypatch)
    assert osp.isfile(tmp_path / 'data' / 'annotations' / 'instances_train.json')  # generated on demand
    with open(tmp_path / 'work' / 'summary.json') as f:
        summary = json.load(f)
    assert summary['iterations'] == 1 and summary['epochs'] == 1
    for when in ('before', 'after'):
        assert set(summary[when]) == {'box mAP', 'box mAP@0.5', 'mask mAP', 'mask mAP@0.5'}
        assert all(-1 <= v <= 1 for v in summary[when].values())
    assert osp.isfile(summary['figure'])


def test_demo_with_epochs_given_returns_its_summary_without_the_check(tmp_path, monkeypatch):
    """--epochs is a run of the user's length: no minimum applies (here one no run reaches), main returns the
    summary it wrote."""
    demo = load_tool('demo_detection')
    monkeypatch.setattr(demo, 'LEARNED', {name: 1e9 for name in demo.LEARNED})
    summary = demo.main(['--work-dir', str(tmp_path / 'work'), '--data-root', str(tmp_path / 'data'),
                         '--num-train', '4', '--num-val', '2', '--epochs', '1', '--num-figure-images', '2'])
    with open(tmp_path / 'work' / 'summary.json') as f:
        assert json.load(f)['after'] == summary['after']
