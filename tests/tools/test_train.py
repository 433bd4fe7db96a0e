"""tools/train.py end to end on a tiny generated COCO set (the demo detector, two epochs of two
iterations): it trains, saves, validates with the COCO metric; --resume restores weights, optimizer and
iteration, and finds the latest checkpoint by itself; two CPU processes (tools/dist_train.sh) train with
--amp; a missing config is one line."""
import copy
import os.path as osp
import shutil

import mmdet  # noqa: F401  (required: a broken install fails here)
import pytest
import torch

from tests.fixtures.bad_data import split_with_float_tiff
from tests.fixtures.paths import PYTHON
from tests.fixtures.runs import coco_metrics, free_port, run_tool
from tests.fixtures.tools import load_tool, own_run, refused, run_main, run_main_logged

NO_VALIDATION = ('val_dataloader=None', 'val_cfg=None', 'val_evaluator=None')


def test_train_saves_and_validates_with_coco_metric(trained):
    metrics = coco_metrics(trained['log'])  # the validation at the end of epoch 2
    assert all(0 <= v <= 1 for v in metrics.values())
    assert 'coco/bbox_mAP' in trained['log']  # a file without `info` is evaluated all the same


def test_resume_restores_weights_optimizer_and_iteration(tiny, trained, tmp_path):
    """Resume from epoch 1 of the finished run (through tools/train.py's --resume): when training
    would start, the model and optimizer state and the iteration equal the checkpoint's.
    (test_resume_auto_finds_the_latest_checkpoint shows that training then goes on.)"""
    from mmengine.hooks import Hook
    work_dir = tmp_path / 'resumed'
    work_dir.mkdir()
    checkpoint = str(trained['work_dir'] / 'epoch_1.pth')

    train = load_tool('train')
    args = train.parse_args(own_run([tiny['config'], '--work-dir', str(work_dir), '--resume', checkpoint,
                                     '--cfg-options', *NO_VALIDATION]))
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
    _, log = run_main_logged(load_tool('train'), [tiny['config'], '--work-dir', str(work_dir), '--resume',
                                                  '--cfg-options', 'train_cfg.max_epochs=3', *NO_VALIDATION], work_dir)
    assert 'resumed epoch: 2, iter: 4' in log
    assert 'Epoch(train) [3][2/2]' in log and 'Epoch(train) [1]' not in log
    assert torch.load(work_dir / 'epoch_3.pth', weights_only=True)['meta']['iter'] == 6


def test_dist_train_two_processes_with_amp(tiny, tmp_path):
    log = run_tool(['bash', 'tools/dist_train.sh', tiny['config'], '2', '--work-dir', str(tmp_path), '--amp',
                '--device', 'cpu', '--cfg-options', 'train_cfg.max_epochs=2', *NO_VALIDATION],
               env=dict(PYTHON=PYTHON, PORT=free_port(), OMP_NUM_THREADS='1'))
    assert 'Distributed training: True' in log and 'GPU number: 2' in log
    assert 'AMP: bfloat16 autocast of the backbone on the CPU' in log  # --device cpu, whatever the machine has
    assert 'WARNING: running on the CPU' not in log  # the CPU was asked for
    assert 'Epoch(train) [2][1/1]' in log  # 4 images / (2 processes x 2 images)
    assert osp.isfile(tmp_path / 'epoch_2.pth')


@pytest.mark.parametrize('tool, more', [('train', []), ('test', ['epoch_1.pth'])])
def test_missing_config_is_the_one_thing_said(tool, more, monkeypatch, capsys):
    """A wrong config path stops the tool with one line naming it, before the device is decided: on a machine
    without a GPU the "running on the CPU" warning (stdout) would otherwise come first."""
    monkeypatch.delenv('MMPOLA_DEVICE', raising=False)
    monkeypatch.setattr('mmpola.runtime.launch.probe_cuda', lambda *a, **k: pytest.fail('the device was probed'))
    with pytest.raises(SystemExit) as exc:
        run_main(load_tool(tool), ['configs/detection/no-such-config.py', *more])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ''
    assert err == ("error: config file 'configs/detection/no-such-config.py' does not exist (configs live in "
                   'configs/detection, configs/segmentation, configs/classification and configs/demo)\n')


def test_training_skips_an_image_with_nan_pixels_when_asked(tiny, tmp_path, capsys):
    """nonfinite_pixels.action=skip: another image of the dataset takes the NaN image's place in its
    batch (losses stay finite: NonFiniteLossHook would stop the run otherwise); the default stops."""
    root = tmp_path / 'data'
    tiff, _ = split_with_float_tiff(tiny, root, 'train', 0, [(3, 4, 1)])
    config = tmp_path / 'float_images.py'
    config.write_text(f"""_base_ = [{tiny['config']!r}]
train_dataloader = dict(dataset=dict(data_root={str(root) + '/'!r}, pipeline=[
    dict(type='LoadImageFromFile', color_type='unchanged'), *_base_.train_pipeline[1:]]))
train_cfg = dict(max_epochs=1)
""")
    train = load_tool('train')
    err = refused(train, [str(config), '--work-dir', str(tmp_path / 'stop'), '--cfg-options', *NO_VALIDATION], capsys)
    assert err.startswith('train_dataloader: iteration ') and f'{tiff}: ' in err and 'NaN pixel value' in err
    run_main(train, [str(config), '--work-dir', str(tmp_path / 'skip'), '--cfg-options', 'nonfinite_pixels.action=skip',
                     *NO_VALIDATION])
    out = capsys.readouterr().out
    assert f'{tiff}: ' in out and 'takes its place (nonfinite_pixels.action=skip)' in out
    saved = torch.load(tmp_path / 'skip' / 'epoch_1.pth', weights_only=True)
    assert saved['meta']['iter'] == 2 and all(torch.isfinite(v).all() for v in saved['state_dict'].values())
