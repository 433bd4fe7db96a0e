"""tools/test.py end to end on the checkpoint of the tiny tools/train.py run: COCO bbox and segm
metrics, --out predictions, --show-dir figures, --tta with masks, --cfg-options data_root, two CPU
processes (tools/dist_test.sh) giving the metrics of one; a missing checkpoint is one line."""
import os.path as osp
import pickle

import mmdet  # noqa: F401  (required: a broken install fails here)
import pytest

from tests.fixtures.paths import PYTHON
from tests.fixtures.runs import DEMO_CONFIG, coco_metrics, free_port, run_tool
from tests.fixtures.tools import load_tool, refused


@pytest.fixture(scope='module')
def tested(tiny, trained):
    out = trained['work_dir'] / 'predictions.pkl'
    show_dir = trained['work_dir'] / 'show'
    log = run_tool([PYTHON, 'tools/test.py', tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'),
                '--work-dir', str(trained['work_dir'] / 'test'), '--out', str(out), '--show-dir', str(show_dir)])
    return dict(log=log, out=out, show_dir=show_dir)


def test_test_reports_bbox_and_segm_and_dumps_and_draws_predictions(tested):
    coco_metrics(tested['log'])
    with open(tested['out'], 'rb') as f:
        predictions = pickle.load(f)
    assert len(predictions) == 4
    assert {'bboxes', 'scores', 'labels', 'masks'} <= set(predictions[0]['pred_instances'])
    assert len(list(tested['show_dir'].glob('*.jpg'))) == 4  # ground truth | prediction per image


def test_test_tta_flips_and_scales_with_masks(tiny, trained):
    """--tta: PolaDetTTAModel over the demo config's tta_pipeline (3 scales x 2 flips), bbox and segm."""
    log = run_tool([PYTHON, 'tools/test.py', tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'),
                '--work-dir', str(trained['work_dir'] / 'test_tta'), '--tta'])
    assert all(0 <= v <= 1 for v in coco_metrics(log).values())


def test_data_root_option_moves_datasets_and_evaluator(tiny, trained, tmp_path):
    """The demo config (data_root data/demo_coco/) on the tiny data: only --cfg-options data_root."""
    out = tmp_path / 'predictions.pkl'
    log = run_tool([PYTHON, 'tools/test.py', DEMO_CONFIG, str(trained['work_dir'] / 'epoch_2.pth'), '--work-dir',
                str(tmp_path), '--out', str(out), '--cfg-options', f"data_root={tiny['root']}/",
                'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False'])
    # the evaluator reads the moved file (the Runner dumps its config into the work dir)
    from mmengine.config import Config
    dumped = Config.fromfile(str(tmp_path / osp.basename(DEMO_CONFIG)))
    evaluators = dumped.test_evaluator if isinstance(dumped.test_evaluator, list) else [dumped.test_evaluator]
    coco = [e for e in evaluators if e.type == 'CocoMetric']  # (--out adds a dump evaluator)
    assert [e.ann_file for e in coco] == [f"{tiny['root']}/annotations/instances_val.json"]
    with open(out, 'rb') as f:
        assert len(pickle.load(f)) == 4  # the tiny test set
    assert all(0 <= v <= 1 for v in coco_metrics(log).values())


def test_dist_test_two_processes_matches_one(tiny, trained, tested):
    log = run_tool(['bash', 'tools/dist_test.sh', tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'), '2',
                '--work-dir', str(trained['work_dir'] / 'dist_test'), '--device', 'cpu'],
               env=dict(PYTHON=PYTHON, PORT=free_port(), OMP_NUM_THREADS='1'))
    assert 'Distributed training: True' in log and 'GPU number: 2' in log  # mmengine's wording
    assert coco_metrics(log) == coco_metrics(tested['log'])


def test_missing_checkpoint(tiny, capsys):
    err = refused(load_tool('test'), [tiny['config'], '/nonexistent/epoch_9.pth'], capsys)
    assert '/nonexistent/epoch_9.pth' in err
