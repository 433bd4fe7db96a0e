"""End to end on tiny generated data: tools/train.py -> tools/test.py -> the checkpoint initialises
the Mask R-CNN and UperNet backbones through init_cfg, with no conversion step."""
import os
import os.path as osp
import pickle
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from mmpola.checkpoint import load_checkpoint
from mmpola.checkpoint.reading import safe_torch_load
from tests.fixtures.paths import REPO as REPO_ROOT  # noqa: E402
from tests.fixtures.tools import load_tool, run_main

DET_CONFIG = osp.join(REPO_ROOT, 'configs', 'detection', 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py')
SEG_CONFIG = osp.join(REPO_ROOT, 'configs', 'segmentation', 'upernet_pola-pvt-t_8xb2-160k_ade20k-512x512.py')


def _run(args, cwd):
    env = dict(os.environ, MMPOLA_NO_COMPILE='1', PYTHONPATH=REPO_ROOT)
    proc = subprocess.run([sys.executable] + args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f'{args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'
    return proc.stdout + proc.stderr


@pytest.fixture(scope='module')
def trained(tiny_imagenet, tmp_path_factory):
    """Two training iterations of the real Pola-PVT-T recipe (RandAugment, random erasing, Mixup/
    CutMix, EMA switched on) at 64 px, validated; returns (config path, checkpoint path, work dir)."""
    work = tmp_path_factory.mktemp('cls_run')
    config = work / 'pola-pvt-t_tiny.py'
    config.write_text(f"""
_base_ = [{osp.join(REPO_ROOT, 'configs', 'classification', 'pola-pvt-t_8xb128_in1k.py')!r}]
data_root = {tiny_imagenet!r}
model = dict(num_classes=6)
data_preprocessor = dict(mixup=dict(num_classes=6))
train_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=64, is_training=True, color_jitter=0.4,
         auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
test_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=64, is_training=False, crop_pct=0.875, crop_mode='squash',
         interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
loader = dict(num_workers=0, persistent_workers=False, pin_memory=False)
train_dataloader = dict(batch_size=4, **loader,
                        dataset=dict(data_root=data_root, indices=8, pipeline=train_pipeline))
val_dataloader = dict(batch_size=6, **loader, dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=1)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=2)]
auto_scale_lr = dict(enable=False)
custom_hooks = [dict(type='SwitchableEMAHook', enabled=True, momentum=0.1, priority='ABOVE_NORMAL')]
default_hooks = dict(logger=dict(interval=1))
""")
    out = _run([osp.join(REPO_ROOT, 'tools', 'train.py'), str(config), '--work-dir', str(work / 'train')],
               cwd=str(work))
    assert 'accuracy/top1' in out
    checkpoint = work / 'train' / 'epoch_1.pth'
    assert checkpoint.is_file(), out[-2000:]
    return str(config), str(checkpoint), work


def test_checkpoint_keeps_backbone_names(trained):
    _, checkpoint, _ = trained
    ckpt = safe_torch_load(checkpoint)
    keys = list(ckpt['state_dict'])
    assert {k.split('.')[0] for k in keys} == {'backbone', 'head'}  # Pola-PVT: no final norm
    assert 'backbone.block1.0.attn.qg.weight' in keys and 'backbone.pos_embed1' in keys
    # EMA on: state_dict holds the averaged weights, the raw ones are kept aside
    assert 'ema_state_dict' in ckpt


def test_resuming_an_averaged_run_without_the_average_is_refused(trained, tmp_path, capsys):
    """The checkpoint's model weights are the EMA's: a resume with the EMA switched off would go on from the average
    and drop the raw weights at its next save; refused with the flag that resumes it as it ran."""
    import shutil

    from tests.fixtures.tools import refused
    config, checkpoint, work = trained
    copy = tmp_path / 'train'
    shutil.copytree(work / 'train', copy)
    resumed = str(copy / 'epoch_1.pth')
    err = refused(load_tool('train'), [config, '--work-dir', str(copy), '--resume', resumed, '--cfg-options',
                                       'custom_hooks.0.enabled=False', 'train_cfg.max_epochs=2'], capsys,
                  unchanged=[resumed])
    assert err == (f'--resume: the run in {resumed} kept an exponential moving average of its weights '
                   "(SwitchableEMAHook), which this config switches off: the checkpoint's model weights are the "
                   'average (its raw weights are in ema_state_dict), so the run would go on from the average and drop '
                   'the raw weights at its next save. Fix: resume with the average on: --cfg-options '
                   'custom_hooks.0.enabled=True; to go on without it on purpose, start a new run from the checkpoint: '
                   f'drop --resume and add --cfg-options load_from={resumed}')
    assert not (copy / 'epoch_2.pth').exists()


def test_tools_test_evaluates_the_checkpoint(trained):
    """tools/test.py (in this process: the imports are already paid) evaluates the checkpoint."""
    config, checkpoint, work = trained
    test_tool = load_tool('test')
    out_file = work / 'preds.pkl'
    metrics = run_main(test_tool, [config, checkpoint, '--work-dir', str(work / 'test'), '--out', str(out_file)])
    assert set(metrics) == {'accuracy/top1', 'accuracy/top5'}
    assert 0 <= metrics['accuracy/top1'] <= metrics['accuracy/top5'] <= 100
    with open(out_file, 'rb') as f:  # our own file, written by mmengine's DumpResults
        predictions = pickle.load(f)
    assert len(predictions) == 12
    assert predictions[0]['pred_score'].shape == (6,)


def _backbone_matches(backbone, checkpoint):
    trained = {k[len('backbone.'):]: v for k, v in safe_torch_load(checkpoint)['state_dict'].items()
               if k.startswith('backbone.')}
    state = backbone.state_dict()
    assert set(state) <= set(trained), sorted(set(state) - set(trained))[:5]
    for key, value in state.items():
        assert torch.equal(value, trained[key]), key


def _build_with_backbone_checkpoint(config_path, scope, checkpoint):
    from mmpola.runtime import register_task_modules, replace_sync_bn
    cfg = Config.fromfile(config_path)
    assert cfg.model.backbone.type == 'PolaPVT' and cfg.model.backbone.init_cfg.type == 'Pretrained'
    cfg.model.backbone.init_cfg.checkpoint = checkpoint  # the only change: where the file is
    replace_sync_bn(cfg.model)
    register_task_modules(cfg)
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(cfg.model)
    model.init_weights()
    return model


def test_checkpoint_initialises_mask_rcnn_backbone(trained):
    _, checkpoint, _ = trained
    assert osp.isfile(DET_CONFIG), f'{DET_CONFIG} is missing'
    detector = _build_with_backbone_checkpoint(DET_CONFIG, 'mmdet', checkpoint)
    _backbone_matches(detector.backbone, checkpoint)


def test_checkpoint_initialises_upernet_backbone(trained):
    _, checkpoint, _ = trained
    assert osp.isfile(SEG_CONFIG), f'{SEG_CONFIG} is missing'
    segmentor = _build_with_backbone_checkpoint(SEG_CONFIG, 'mmseg', checkpoint)
    _backbone_matches(segmentor.backbone, checkpoint)


def test_checkpoint_loads_by_filtering_only(trained):
    """mmpola.checkpoint finds the 'backbone.' prefix itself, leaves the head outside, and loads
    every backbone tensor without resizing or renaming."""
    from mmpola.models import PolaPVT
    _, checkpoint, _ = trained
    backbone = PolaPVT(arch='tiny')
    report = load_checkpoint(backbone, checkpoint, logger=None)
    assert report.prefix == 'backbone.'
    assert not report.missing and not report.unexpected and not report.resized
    assert {k.split('.')[0] for k in report.outside_prefix} == {'head'}
    _backbone_matches(backbone, checkpoint)


def test_checkpoint_loads_into_timm_entry(trained):
    import timm
    _, checkpoint, _ = trained
    model = timm.create_model('pola_pvt_tiny', num_classes=6, checkpoint_path=checkpoint)
    _backbone_matches(model.backbone, checkpoint)
