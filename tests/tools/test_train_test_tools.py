"""tools/train.py, tools/test.py and tools/dist_*.sh end to end on a tiny generated COCO dataset.

One module-scoped run trains the demo detector (Mask R-CNN + Pola-PVT-T, shrunk heads) for two
epochs of four iterations in a subprocess; the other tests test, resume and distribute from it.
"""
import copy
import os.path as osp
import pickle
import re
import shutil

import mmdet  # noqa: E402,F401  (required: a broken install fails here)
import pytest
import torch

from tests.fixtures.paths import PYTHON, REPO
from tests.fixtures.runs import DEMO_CONFIG
from tests.fixtures.runs import free_port as _free_port  # noqa: F401
from tests.fixtures.runs import run_tool as _run
from tests.fixtures.tools import load_tool

NO_VALIDATION = ('val_dataloader=None', 'val_cfg=None', 'val_evaluator=None')
METRIC_RE = re.compile(r'coco/(bbox|segm)_mAP: (-?[0-9.]+)')


def _metrics(log):
    found = dict(METRIC_RE.findall(log))
    assert set(found) == {'bbox', 'segm'}, log[-3000:]
    return {k: float(v) for k, v in found.items()}


@pytest.fixture(scope='module')
def trained(tiny, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('train')
    log = _run([PYTHON, 'tools/train.py', tiny['config'], '--work-dir', str(work_dir)])
    assert 'Epoch(train) [2][2/2]' in log
    assert osp.isfile(work_dir / 'epoch_1.pth') and osp.isfile(work_dir / 'epoch_2.pth')
    return dict(work_dir=work_dir, log=log)


def test_train_saves_and_validates_with_coco_metric(trained):
    metrics = _metrics(trained['log'])  # the validation at the end of epoch 2
    assert all(0 <= v <= 1 for v in metrics.values())
    assert 'coco/bbox_mAP' in trained['log']  # a file without `info` is evaluated all the same


@pytest.fixture(scope='module')
def tested(tiny, trained):
    out = trained['work_dir'] / 'predictions.pkl'
    show_dir = trained['work_dir'] / 'show'
    log = _run([PYTHON, 'tools/test.py', tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'),
                '--work-dir', str(trained['work_dir'] / 'test'), '--out', str(out), '--show-dir', str(show_dir)])
    return dict(log=log, out=out, show_dir=show_dir)


def test_test_reports_bbox_and_segm_and_dumps_and_draws_predictions(tested):
    _metrics(tested['log'])
    with open(tested['out'], 'rb') as f:
        predictions = pickle.load(f)
    assert len(predictions) == 4
    assert {'bboxes', 'scores', 'labels', 'masks'} <= set(predictions[0]['pred_instances'])
    assert len(list(tested['show_dir'].glob('*.jpg'))) == 4  # ground truth | prediction per image


def test_test_tta_flips_and_scales_with_masks(tiny, trained):
    """--tta: PolaDetTTAModel over the demo config's tta_pipeline (3 scales x 2 flips), bbox and segm."""
    log = _run([PYTHON, 'tools/test.py', tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'),
                '--work-dir', str(trained['work_dir'] / 'test_tta'), '--tta'])
    assert all(0 <= v <= 1 for v in _metrics(log).values())


def test_data_root_option_moves_datasets_and_evaluator(tiny, trained, tmp_path):
    """The demo config (data_root data/demo_coco/) on the tiny data: only --cfg-options data_root."""
    out = tmp_path / 'predictions.pkl'
    log = _run([PYTHON, 'tools/test.py', DEMO_CONFIG, str(trained['work_dir'] / 'epoch_2.pth'), '--work-dir',
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
    assert all(0 <= v <= 1 for v in _metrics(log).values())


def test_resume_restores_weights_optimizer_and_iteration(tiny, trained, tmp_path):
    """Resume from epoch 1 of the finished run (through tools/train.py's --resume): when training
    would start, the model and optimizer state and the iteration equal the checkpoint's.
    (test_resume_auto_finds_the_latest_checkpoint shows that training then goes on.)"""
    from mmengine.hooks import Hook
    work_dir = tmp_path / 'resumed'
    work_dir.mkdir()
    checkpoint = str(trained['work_dir'] / 'epoch_1.pth')

    train = load_tool('train')
    args = train.parse_args([tiny['config'], '--work-dir', str(work_dir), '--resume', checkpoint,
                             '--cfg-options', *NO_VALIDATION])
    runner = train.build_runner(args)
    seen = {}

    class Probe(Hook):
        priority = 'VERY_LOW'

        def before_train(self, runner):
            seen['iter'], seen['epoch'] = runner.iter, runner.epoch
            seen['model'] = {k: v.clone() for k, v in runner.model.state_dict().items()}
            seen['optim'] = copy.deepcopy(runner.optim_wrapper.state_dict())
            runner.train_loop.stop_training = True  # the state is all we need

    runner.register_hook(Probe())
    runner.train()

    saved = torch.load(checkpoint, map_location='cpu', weights_only=True)
    assert (seen['iter'], seen['epoch']) == (2, 1)
    assert saved['meta']['iter'] == 2
    assert seen['model'].keys() == saved['state_dict'].keys()
    for key, value in saved['state_dict'].items():
        assert torch.equal(seen['model'][key], value), key
    state, saved_state = seen['optim']['state'], saved['optimizer']['state']
    assert state.keys() == saved_state.keys() and len(state) > 0
    for index, entries in saved_state.items():
        for name, value in entries.items():
            assert torch.equal(torch.as_tensor(state[index][name]), torch.as_tensor(value)), (index, name)
    assert [g['lr'] for g in seen['optim']['param_groups']] == [g['lr'] for g in saved['optimizer']['param_groups']]


def test_resume_auto_finds_the_latest_checkpoint(tiny, trained, tmp_path):
    work_dir = tmp_path / 'auto'
    shutil.copytree(trained['work_dir'], work_dir, ignore=shutil.ignore_patterns('test', '*.pkl'))
    log = _run([PYTHON, 'tools/train.py', tiny['config'], '--work-dir', str(work_dir), '--resume',
                '--cfg-options', 'train_cfg.max_epochs=3', *NO_VALIDATION])
    assert 'resumed epoch: 2, iter: 4' in log
    assert 'Epoch(train) [3][2/2]' in log and 'Epoch(train) [1]' not in log
    assert torch.load(work_dir / 'epoch_3.pth', weights_only=True)['meta']['iter'] == 6


def test_dist_test_two_processes_matches_one(tiny, trained, tested):
    log = _run(['bash', 'tools/dist_test.sh', tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'), '2',
                '--work-dir', str(trained['work_dir'] / 'dist_test'), '--device', 'cpu'],
               env=dict(PYTHON=PYTHON, PORT=_free_port(), OMP_NUM_THREADS='1'))
    assert 'Distributed training: True' in log and 'GPU number: 2' in log  # mmengine's wording
    assert _metrics(log) == _metrics(tested['log'])


def test_dist_train_two_processes_with_amp(tiny, tmp_path):
    log = _run(['bash', 'tools/dist_train.sh', tiny['config'], '2', '--work-dir', str(tmp_path), '--amp',
                '--device', 'cpu', '--cfg-options', 'train_cfg.max_epochs=2', *NO_VALIDATION],
               env=dict(PYTHON=PYTHON, PORT=_free_port(), OMP_NUM_THREADS='1'))
    assert 'Distributed training: True' in log and 'GPU number: 2' in log
    assert 'AMP: bfloat16 autocast of the backbone on the CPU' in log  # --device cpu, whatever the machine has
    assert 'WARNING: running on the CPU' not in log  # the CPU was asked for
    assert 'Epoch(train) [2][1/1]' in log  # 4 images / (2 processes x 2 images)
    assert osp.isfile(tmp_path / 'epoch_2.pth')


# ----------------------------------------------------------------------------------------------
# user errors: one line on stderr, exit status 2, no traceback

def _user_error(tool, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        load_tool(tool).main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and 'Traceback' not in err
    return err


def test_missing_config(capsys):
    err = _user_error('train', ['configs/detection/no-such-config.py'], capsys)
    assert 'does not exist' in err


def test_missing_checkpoint(tiny, capsys):
    err = _user_error('test', [tiny['config'], '/nonexistent/epoch_9.pth'], capsys)
    assert '/nonexistent/epoch_9.pth' in err


def test_missing_pretrained_backbone_says_how_to_train_from_scratch(capsys, tmp_path):
    path = osp.join(REPO, 'configs', 'detection', 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py')
    err = _user_error('train', [path, '--work-dir', str(tmp_path),
                                '--cfg-options', 'model.backbone.init_cfg.checkpoint=checkpoints/missing.pth'],
                      capsys)
    assert 'checkpoints/missing.pth' in err and 'model.backbone.init_cfg=None' in err


def test_missing_coco_and_demo_data_say_where_to_get_them(capsys, tmp_path):
    path = osp.join(REPO, 'configs', 'detection', 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py')
    err = _user_error('train', [path, '--work-dir', str(tmp_path), '--cfg-options', 'model.backbone.init_cfg=None',
                                'train_dataloader.dataset.data_root=/nonexistent/coco/'], capsys)
    assert '/nonexistent/coco/' in err and 'COCO' in err
    err = _user_error('train', [DEMO_CONFIG, '--work-dir', str(tmp_path),
                                '--cfg-options', 'train_dataloader.dataset.data_root=/nonexistent/demo/'], capsys)
    assert 'tools/make_demo_coco.py' in err
