"""The checkpoint files a run reads (mmpola.runtime.preflight.checkpoints), through tools/train.py and
tools/test.py: a pickle that would run code is refused, naming the file, whatever
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD says; a truncated zip or pickle, a text file (HTML page, Git LFS
pointer), an empty file, a directory, a URL without network are named with the problem and the fix;
official PolaFormer files and mmengine runner checkpoints load. Every refusal exits with status 2,
one ``error:`` line, and leaves the files as they were."""
import os.path as osp

import pytest
import torch
from mmengine.logging import MMLogger

from mmpola.checkpoint.reading import UnsafeCheckpointError, safe_torch_load
from tests.fixtures.checkpoints import (
    add_numpy,
    assert_refused,
    evil_checkpoint,
    golden_constructor,
    golden_official,
    unreadable_checkpoints,
)
from tests.fixtures.detection import coco_options, make_tool_coco
from tests.fixtures.paths import REPO
from tests.fixtures.tools import load_tool, own_run, refused, run_main

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN, TEST = load_tool('train'), load_tool('test')


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    return make_tool_coco(tmp_path_factory)


def test_unreadable_checkpoints_through_the_tools(coco, tmp_path, capsys):
    files = unreadable_checkpoints(tmp_path)
    work = str(tmp_path / 'work')
    test_opts = [o for o in coco_options(coco) if not o.startswith('val')]
    for name in ('truncated', 'text', 'empty', 'directory'):
        err = refused(TEST, [DET_DEMO, files[name], '--work-dir', work] + test_opts, capsys, [files[name]], work)
        assert err.startswith(f"checkpoint: checkpoint{' file' if name != 'directory' else ''} '{files[name]}' ")
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work, '--resume', files['directory']] + coco_options(coco), capsys,
                  [files['directory']], work)
    assert err.startswith(f"--resume checkpoint: checkpoint '{files['directory']}' is a directory")
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work] + coco_options(coco) + [f"load_from={files['lfs']}"], capsys,
                  [files['lfs']], work)
    assert err.startswith(f"load_from checkpoint: checkpoint file '{files['lfs']}' is not a PyTorch checkpoint: a Git "
                          'LFS pointer')
    config = tmp_path / 'pretrained.py'
    config.write_text(f"_base_ = [{DET_DEMO!r}]\nmodel = dict(backbone=dict(init_cfg=dict(_delete_=True, "
                      f"type='Pretrained', checkpoint={files['empty']!r})))\n")
    err = refused(TRAIN, [str(config), '--work-dir', work] + coco_options(coco), capsys, [files['empty']], work)
    assert err.startswith(f"pretrained checkpoint (model.backbone.init_cfg): checkpoint file '{files['empty']}' is "
                          'empty (0 bytes)')
    # a truncated legacy pickle passes the first-bytes check and fails inside the Runner, still named
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work] + coco_options(coco)
                  + [f"load_from={files['legacy_truncated']}"], capsys, [files['legacy_truncated']], work)
    assert err.startswith(f"load_from checkpoint: checkpoint file '{files['legacy_truncated']}' is truncated or "
                          'damaged')
    # --resume without a path: the work dir's last checkpoint, cut short (the Runner reads it)
    resume_dir = tmp_path / 'resume_work'
    resume_dir.mkdir()
    (resume_dir / 'epoch_1.pth').write_bytes(open(files['truncated'], 'rb').read())
    (resume_dir / 'last_checkpoint').write_text(str(resume_dir / 'epoch_1.pth'))
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(resume_dir), '--resume'] + coco_options(coco), capsys,
                  [str(resume_dir / 'epoch_1.pth')])
    # (the only checkpoint there: no readable one to fall back to; the message names it and why)
    assert err.startswith(f'--resume: no readable checkpoint in {resume_dir}')
    assert f"'{resume_dir / 'epoch_1.pth'}' is a truncated or damaged zip archive" in err
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work] + coco_options(coco) + ['load_from=http://127.0.0.1:9/w.pth'],
                  capsys, [], work)
    assert err.startswith("load_from checkpoint: downloading checkpoint 'http://127.0.0.1:9/w.pth' failed (URLError: ")


# --------------------------------------------------------------------------------------------
# tools/train.py (--resume, load_from) and tools/test.py on a tiny classification config

CLS_CONFIG = osp.join(REPO, 'configs', 'classification', 'pola-pvt-t_8xb128_in1k.py')


def _assert_backbone_equals(backbone_state, reference, prefix=''):
    """Every backbone tensor equals the reference's ``prefix + key`` (where it has one)."""
    compared = 0
    for key, value in backbone_state.items():
        ref = reference.get(prefix + key)
        if ref is not None:
            assert torch.equal(value, ref), key
            compared += 1
    assert compared > 0.9 * len(backbone_state), (compared, len(backbone_state))


@pytest.fixture(scope='module')
def tiny_cls(tmp_path_factory):
    """A classification config of the golden mini Pola-PVT (10 classes, as the official file) on
    a tiny generated dataset, and a 2-iteration tools/train.py run of it (its epoch_1.pth)."""
    from mmpola.classification.demo_imagenet import make_demo_imagenet
    root = str(tmp_path_factory.mktemp('tiny_imagenet'))
    make_demo_imagenet(root, num_train=1, num_val=1, size=64, seed=0)
    c = golden_constructor('pvt')
    arch = {k: list(c[k]) for k in ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')}
    work = tmp_path_factory.mktemp('cls')
    config = work / 'mini_cls.py'
    config.write_text(f"""
_base_ = [{CLS_CONFIG!r}]
data_root = {root!r}
model = dict(arch=dict(_delete_=True, **{arch!r}), num_classes=10, drop_path_rate=0.0)
data_preprocessor = dict(random_erasing=None, mixup=None)
pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=64, is_training=False, crop_pct=1.0, crop_mode='squash',
         interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
loader = dict(num_workers=0, persistent_workers=False, pin_memory=False)
train_dataloader = dict(batch_size=2, **loader,
                        dataset=dict(data_root=data_root, indices=4, pipeline=pipeline))
val_dataloader = dict(batch_size=6, **loader, dataset=dict(data_root=data_root, pipeline=pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=1, val_interval=100)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=2)]
auto_scale_lr = dict(enable=False)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1, save_best=None))
""")
    train = load_tool('train')
    args = train.parse_args(own_run([str(config), '--work-dir', str(work / 'train')]))
    train.build_runner(args).train()
    checkpoint = add_numpy(str(work / 'train' / 'epoch_1.pth'))
    return dict(config=str(config), checkpoint=checkpoint, work=work)


def _probe_train(train, argv):
    """Build tools/train.py's runner and run it up to before_train: (iter, model state)."""
    from mmengine.hooks import Hook
    runner = train.build_runner(train.parse_args(own_run(argv)))
    seen = {}

    class Probe(Hook):
        priority = 'VERY_LOW'

        def before_train(self, runner):
            seen['iter'] = runner.iter
            seen['model'] = {k: v.clone() for k, v in runner.model.state_dict().items()}
            runner.train_loop.stop_training = True

    runner.register_hook(Probe())
    runner.train()
    return seen


def test_train_resume_and_load_from(tiny_cls, tmp_path):
    train = load_tool('train')
    base = [tiny_cls['config'], '--work-dir', str(tmp_path / 'work')]
    evil, marker = evil_checkpoint(tmp_path)
    for extra in (['--resume', evil], ['--cfg-options', f'load_from={evil}']):
        with pytest.raises(UnsafeCheckpointError) as exc:
            _probe_train(train, base + extra)
        assert_refused(exc, evil, marker)

    # an mmengine runner checkpoint: --resume restores weights and iteration
    saved = safe_torch_load(tiny_cls['checkpoint'])
    seen = _probe_train(train, base + ['--resume', tiny_cls['checkpoint']])
    assert seen['iter'] == 2 == saved['meta']['iter']
    for key, value in saved['state_dict'].items():
        assert torch.equal(seen['model'][key], value), key

    # an official file: --resume says it holds weights only and how to start from them
    path, official = golden_official('pvt')
    with pytest.raises(train.UserError, match=r'not a training checkpoint.*load_from='):
        _probe_train(train, base + ['--resume', path])

    # an official file: load_from initialises the classifier (head included)
    seen = _probe_train(train, base + ['--cfg-options', f'load_from={path}'])
    assert seen['iter'] == 0
    _assert_backbone_equals(seen['model'], {f'backbone.{k}': v for k, v in official.items()} |
                            {k: v for k, v in official.items() if k.startswith(('head.', 'norm.'))})
    assert torch.equal(seen['model']['head.weight'], official['head.weight'])


def test_test_tool(tiny_cls, tmp_path, capsys):
    test = load_tool('test')
    evil, marker = evil_checkpoint(tmp_path)
    with pytest.raises(SystemExit) as exc:
        run_main(test, [tiny_cls['config'], evil, '--work-dir', str(tmp_path / 'evil')])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and 'Traceback' not in err
    assert_refused(err, evil, marker)

    path, official = golden_official('pvt')
    saved = safe_torch_load(tiny_cls['checkpoint'])['state_dict']
    for checkpoint, reference in ((tiny_cls['checkpoint'], saved),
                                  (path, {f'backbone.{k}': v for k, v in official.items()})):
        runner = test.build_runner(test.parse_args(own_run([tiny_cls['config'], checkpoint,
                                                            '--work-dir', str(tmp_path / 'test')])))
        metrics = runner.test()
        assert 'accuracy/top1' in metrics
        _assert_backbone_equals(runner.model.state_dict(), reference)
    assert torch.equal(runner.model.state_dict()['head.weight'], official['head.weight'])


def test_missing_pretrained_backbone_says_how_to_train_from_scratch(capsys, tmp_path):
    path = osp.join(REPO, 'configs', 'detection', 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py')
    err = refused(TRAIN, [path, '--work-dir', str(tmp_path),
                          '--cfg-options', 'model.backbone.init_cfg.checkpoint=checkpoints/missing.pth'], capsys)
    assert 'checkpoints/missing.pth' in err and 'model.backbone.init_cfg=None' in err


def test_the_backbone_option_of_a_message_works_on_a_config_without_init_cfg(coco, tmp_path, capsys):
    """The demo detector has init_cfg=None, where `model.backbone.init_cfg.checkpoint=X` stops mmengine
    with a TypeError: --resume with a weights-only file names an option that works, and training then
    starts from those weights."""
    from tests.fixtures.detection import build_detector
    from tests.fixtures.detection import load_config as load_det_config
    backbone = build_detector(load_det_config(DET_DEMO)).backbone
    weights = tmp_path / 'backbone.pth'
    torch.save({'state_dict': backbone.state_dict()}, weights)
    capsys.readouterr()  # the build's log
    work = tmp_path / 'work'
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work), '--resume', str(weights)] + coco_options(coco), capsys,
                  [weights], work)
    option = (f'model.backbone.init_cfg._delete_=True model.backbone.init_cfg.type=Pretrained '
              f'model.backbone.init_cfg.checkpoint={weights}')
    assert err.startswith(f'--resume {weights}: this is not a training checkpoint')
    assert f'or {option} (official PolaFormer / ImageNet weights for the backbone)' in err
    seen = _probe_train(TRAIN, [DET_DEMO, '--work-dir', str(work)] + coco_options(coco) + option.split())
    _assert_backbone_equals({k[len('backbone.'):]: v for k, v in seen['model'].items() if k.startswith('backbone.')},
                            backbone.state_dict())
