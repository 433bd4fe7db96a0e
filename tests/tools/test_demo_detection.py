"""tools/demo_detection.py end to end at toy scale: data generation, untrained and trained COCO
metrics, the figure and the summary (the real demo trains 6 epochs on 320 images)."""
import json
import os.path as osp

import mmdet  # noqa: E402,F401  (required: a broken install fails here)

from tests.fixtures.tools import load_tool


def test_demo_runs_and_reports_before_and_after(tmp_path):
    demo = load_tool('demo_detection')
    summary = demo.main(['--work-dir', str(tmp_path / 'work'), '--data-root', str(tmp_path / 'data'),
                         '--num-train', '4', '--num-val', '2', '--epochs', '1', '--num-figure-images', '2'])
    assert osp.isfile(tmp_path / 'data' / 'annotations' / 'instances_train.json')  # generated on demand
    assert summary['iterations'] == 1 and summary['epochs'] == 1
    for when in ('before', 'after'):
        assert set(summary[when]) == {'box mAP', 'box mAP@0.5', 'mask mAP', 'mask mAP@0.5'}
        assert all(-1 <= v <= 1 for v in summary[when].values())
    assert osp.isfile(summary['figure'])
    with open(tmp_path / 'work' / 'summary.json') as f:
        assert json.load(f)['after'] == summary['after']
