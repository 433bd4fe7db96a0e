"""The config against what it builds (mmpola.runtime.config_check): a misspelled type or argument is one
line with the close matches, before anything is built; scoped ``mmpola.X`` names resolve from every
task library's default scope; the shipped configs pass (no false alarm) and carry mmpola's hooks, also
when a task library's own tools/train.py runs them (mmengine's ``Runner.from_cfg``)."""
import glob
import inspect
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.registry import DefaultScope
from mmengine.runner import Runner

from mmpola.errors import UserError
from mmpola.runtime import SafeCheckpointHook, load_config, register_task_modules
from mmpola.runtime.config_check import accepted_arguments, check_config, runtime_hook_notes
from tests.fixtures.detection import coco_options, make_tool_coco
from tests.fixtures.paths import REPO
from tests.fixtures.tools import load_tool, refused

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN = load_tool('train')


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    return make_tool_coco(tmp_path_factory)


def test_misspelled_type_and_argument_name_the_close_matches(coco, tmp_path, capsys):
    work = str(tmp_path / 'work')
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work] + coco_options(coco) + ['model.backbone.type=PolaPVTT'], capsys,
                  [], work)
    assert err.startswith("model.backbone.type='PolaPVTT': no model of that name is registered (scope 'mmdet'); "
                          "did you mean 'PolaPVT'")
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work] + coco_options(coco) + ['model.backbone.drop_path_rat=0.1'],
                  capsys, [], work)
    assert err == "model.backbone.drop_path_rat: PolaPVT has no argument 'drop_path_rat'; " \
                  "did you mean 'drop_path_rate' or 'drop_rate'?"
    # built much later by the Runner (the datasets, in runner.train()): found before anything is built too
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work] + coco_options(coco)
                  + ['train_dataloader.dataset.type=CocoDatset'], capsys, [], work)
    assert err.startswith("train_dataloader.dataset.type='CocoDatset': no dataset of that name is registered "
                          "(scope 'mmdet')")
    assert "did you mean 'CocoDataset'" in err


@pytest.mark.parametrize('option, expected', [
    ('train_cfg.max_epoch=2', "train_cfg.max_epoch: EpochBasedTrainLoop has no argument 'max_epoch'; "
                              "did you mean 'max_epochs'?"),
    ('optim_wrapper.optimizer.weight_decy=0.1', "optim_wrapper.optimizer.weight_decy: AdamW has no argument "
                                                "'weight_decy'; did you mean 'weight_decay'?"),
    ('optim_wrapper.clip_grads=None', "optim_wrapper.clip_grads: OptimWrapper has no argument 'clip_grads'; "
                                      "did you mean 'clip_grad'?"),
    ('param_scheduler.0.star_factor=0.1', "param_scheduler.0.star_factor: LinearLR has no argument "
                                          "'star_factor'; did you mean 'start_factor' or 'end_factor'?"),
    ('train_dataloader.num_worker=2', "train_dataloader.num_worker: DataLoader has no argument 'num_worker'; "
                                      "did you mean 'num_workers'"),
    ('default_hooks.checkpoint.max_keep_ckpt=1', "default_hooks.checkpoint.max_keep_ckpt: SafeCheckpointHook has no "
                                                 "argument 'max_keep_ckpt'; did you mean 'max_keep_ckpts'?"),
    ('train_dataloader.num_workers=0', "train_dataloader.num_workers=0 with persistent_workers=True: torch's "
                                       'DataLoader allows persistent_workers only with worker processes; set '
                                       'train_dataloader.persistent_workers=False too, or num_workers to 1 or more'),
], ids=['train_cfg', 'optimizer', 'optim_wrapper', 'param_scheduler', 'dataloader', 'checkpoint_hook', 'workers'])
def test_misspelled_arguments_of_what_the_runner_builds(coco, tmp_path, capsys, option, expected):
    """The training loop, the optimizer wrapper and optimizer, the lr schedulers and the dataloader's own
    arguments (torch's DataLoader) are checked as well, before the Runner exists (else: a raw TypeError
    once the Runner builds that part, for the optimizer after the model was built)."""
    work = str(tmp_path / 'work')
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work] + coco_options(coco) + [option], capsys, [], work)
    assert err.startswith(expected), err
    assert not osp.exists(work)


def test_a_test_run_does_not_judge_the_training_parts(coco, tmp_path):
    """tools/test.py builds no training loop, optimizer or training loader: a typo there does not stop it."""
    cfg = load_config(DET_DEMO, {'train_cfg.max_epoch': 2, 'train_dataloader.num_worker': 2})
    with DefaultScope.overwrite_default_scope(register_task_modules(cfg)):
        check_config(cfg, training=False)
        with pytest.raises(UserError, match="train_cfg.max_epoch: EpochBasedTrainLoop has no argument"):
            check_config(cfg)
        cfg.test_dataloader.num_worker = 2
        with pytest.raises(UserError, match="test_dataloader.num_worker: DataLoader has no argument"):
            check_config(cfg, training=False)


def test_the_check_can_be_skipped(coco, tmp_path):
    """--skip-config-check: the config goes to the Runner as it is (which fails, or not, when it
    builds that part)."""
    args = TRAIN.parse_args([DET_DEMO, '--work-dir', str(tmp_path), '--skip-config-check'] + coco_options(coco)
                            + ['train_dataloader.dataset.type=CocoDatset'])
    cfg, _, _ = TRAIN.build_train_config(args)
    assert cfg.train_dataloader.dataset.type == 'CocoDatset'


def test_the_run_notes_its_op_implementations_and_refuses_an_unknown_one(coco, tmp_path, capsys, monkeypatch):
    """The train tool's notes (which the Runner logs into the run's log) name the implementation each of mmpola's
    MMPOLA_* variables chooses, so that two runs' logs say what ran; an unknown value stops the run in one line
    before anything is built."""
    for variable in ('MMPOLA_DEPTHWISE_CONV', 'MMPOLA_SDPA', 'MMPOLA_TRITON_AUTOTUNE'):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'triton')
    _, _, notes = TRAIN.build_train_config(TRAIN.parse_args([DET_DEMO, '--work-dir', str(tmp_path / 'a')]
                                                            + coco_options(coco)))
    assert notes[0] == ("op implementations: MMPOLA_DEPTHWISE_CONV=auto, MMPOLA_RECOMPUTE=triton, MMPOLA_SDPA=auto; "
                        "Triton's tuning on (MMPOLA_TRITON_AUTOTUNE)")
    assert not any('model.backbone.recompute' in note for note in notes)
    # a backbone's own choice of its linear layers, which the line above does not say, is a note of its own
    _, _, notes = TRAIN.build_train_config(TRAIN.parse_args([DET_DEMO, '--work-dir', str(tmp_path / 'c')]
                                                            + coco_options(coco) + ['model.backbone.recompute=torch']))
    assert ("model.backbone.recompute='torch': the backbone's choice of its linear layers, in place of "
            "MMPOLA_RECOMPUTE's") in notes
    monkeypatch.setenv('MMPOLA_SDPA', 'cudnn')
    work = str(tmp_path / 'b')
    err = refused(TRAIN, [DET_DEMO, '--work-dir', work] + coco_options(coco), capsys, [], work)
    assert err.startswith("MMPOLA_SDPA='cudnn' is not an implementation of the softmax kinds' "
                          'scaled_dot_product_attention; use one of auto, torch'), err


def test_no_false_alarm_on_the_shipped_configs(monkeypatch):
    """Every task config passes the config check and the pre-flight model checks (classes vs
    num_classes, channels); the channel check really sees every dense backbone's outputs."""
    from mmengine.registry import DefaultScope

    from mmpola.runtime.preflight import model as preflight
    seen = []
    build = preflight._backbone_out_channels
    monkeypatch.setattr(preflight, '_backbone_out_channels', lambda cfg: seen.append(build(cfg)) or seen[-1])
    paths = sorted(p for p in glob.glob(osp.join(REPO, 'configs', '*', '*.py')) if '/_base_/' not in p)
    assert len(paths) > 20
    for path in paths:
        cfg = load_config(path)
        seen.clear()
        with DefaultScope.overwrite_default_scope(register_task_modules(cfg)):
            check_config(cfg)
            preflight.check_num_classes(cfg, ['train_dataloader', 'val_dataloader', 'test_dataloader'])
            preflight.check_model_channels(cfg)
        if 'backbone' in cfg.model:
            assert len(seen) == 1 and seen[0] is not None, path
        assert runtime_hook_notes(cfg) == [], path


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmengine'])
def test_mmpola_scoped_names_resolve_from_each_default_scope(scope):
    """``type='mmpola.X'`` is found from mmdet's, mmseg's and mmengine's scopes (mmpola's child
    registries), as the configs write mmpola's hooks; a misspelled one gets its close match."""
    from mmengine.registry import HOOKS, MODELS, DefaultScope

    from mmpola.runtime import NonFiniteLossHook
    cfg = Config(dict(default_scope=scope, model=dict(type='mmpola.PolaPVT', arch='tiny'),
                      default_hooks=dict(checkpoint=dict(type='mmpola.SafeCheckpointHook', interval=1)),
                      custom_hooks=[dict(type='mmpola.NonFiniteLossHook', action='skip')]))
    with DefaultScope.overwrite_default_scope(register_task_modules(cfg)):
        check_config(cfg)
        assert isinstance(HOOKS.build(cfg.default_hooks.checkpoint), SafeCheckpointHook)
        assert isinstance(HOOKS.build(cfg.custom_hooks[0]), NonFiniteLossHook)
        with MODELS.switch_scope_and_registry(None) as registry:
            assert registry.get('mmpola.PolaPVT').__name__ == 'PolaPVT'
        cfg.model.type = 'mmpola.PolaPVTT'
        with pytest.raises(UserError, match=r"model.type='mmpola.PolaPVTT': no model of that name .*'PolaPVT'"):
            check_config(cfg)


def test_mixup_needs_even_training_batches():
    """An odd batch, or a kept odd last batch, with Mixup / CutMix: named before the run (the data preprocessor's
    ValueError at the first step, or at the end of an epoch)."""
    cfg = Config(dict(data_preprocessor=dict(mixup=dict(num_classes=4)),
                      train_dataloader=dict(batch_size=3, drop_last=True)))
    with pytest.raises(UserError, match=r'^train_dataloader\.batch_size=3 with Mixup / CutMix .* Fix: an even'):
        check_config(cfg)
    cfg.train_dataloader.batch_size = 4
    cfg.train_dataloader.drop_last = False
    with pytest.raises(UserError, match=r'^train_dataloader\.drop_last=False with Mixup / CutMix'):
        check_config(cfg)
    cfg.train_dataloader.drop_last = True
    check_config(cfg)
    check_config(Config(dict(data_preprocessor=dict(mixup=dict(num_classes=4)),
                             train_dataloader=dict(batch_size=3))), training=False)  # a test run trains nothing


def test_arguments_follow_the_kwargs_a_class_passes_on():
    class Base:
        def __init__(self, depth, init_cfg=None):
            pass

    class PassesOn(Base):
        def __init__(self, width=1, **kwargs):
            super().__init__(**kwargs)

    class KeepsThem(Base):
        def __init__(self, width=1, **options):
            super().__init__(depth=2)
            self.options = options

    def builder(a, b=2):
        return a

    assert accepted_arguments(PassesOn) == (['width', 'depth', 'init_cfg'], True)
    # mmengine's CheckpointHook keeps its **kwargs for Runner.save_checkpoint, every parameter of which it passes
    # itself: they can take nothing more (else a misspelled key fails at the first save, after an epoch)
    names, complete = accepted_arguments(SafeCheckpointHook)
    assert complete and {'save_on_sigterm', 'interval', 'max_keep_ckpts', 'save_best'} <= set(names)
    assert list(inspect.signature(Runner.save_checkpoint).parameters) == [
        'self', 'out_dir', 'filename', 'file_client_args', 'save_optimizer', 'save_param_scheduler', 'meta',
        'by_epoch', 'backend_args']
    assert accepted_arguments(KeepsThem) == (['width'], False)  # its options may be anything
    assert accepted_arguments(builder) == (['a', 'b'], True)


def test_task_libraries_own_train_script_gets_mmpolas_hooks(tmp_path):
    """What mmdet's / mmseg's tools/train.py do (load the config, ``Runner.from_cfg``): the run has
    SafeCheckpointHook, RandomStateHook, NonFiniteLossHook, NonFinitePixelsHook and CheckpointFitHook,
    from the config."""
    from mmengine.runner import Runner

    from mmpola.runtime import (
        CheckpointFitHook,
        NonFiniteLossHook,
        NonFinitePixelsHook,
        RandomStateHook,
        SafeCheckpointHook,
    )
    wanted = {SafeCheckpointHook, RandomStateHook, NonFiniteLossHook, NonFinitePixelsHook, CheckpointFitHook}
    for task, config in (('detection', 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py'),
                         ('segmentation', 'upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py'),
                         ('classification', 'pola-pvt-t_8xb128_in1k.py')):
        cfg = Config.fromfile(osp.join(REPO, 'configs', task, config))
        cfg.work_dir = str(tmp_path / task)
        cfg.launcher = 'none'
        runner = Runner.from_cfg(cfg)
        assert wanted <= {type(h) for h in runner.hooks}, (task, [type(h).__name__ for h in runner.hooks])
        assert sum(isinstance(h, SafeCheckpointHook) for h in runner.hooks) == 1  # in place of CheckpointHook


def test_a_config_without_the_hooks_is_told_so():
    notes = runtime_hook_notes(Config(dict(default_hooks=dict(checkpoint=dict(type='CheckpointHook')))))
    assert len(notes) == 6 and all('configs/_base_/runtime.py' in n for n in notes)
    assert 'SafeCheckpointHook in default_hooks.checkpoint' in notes[0]
    assert len(runtime_hook_notes(Config(dict()), training=False)) == 2  # testing: the pixel and fit checks


def test_mmpola_names_resolve_in_the_mmpola_scope_of_inherited_configs():
    """A config inherited through ``mmpola::`` gives its dicts ``_scope_='mmpola'``; mmengine then looks
    ``mmpola.X`` up in mmpola's registries only, and plain names there and in their parents: both work,
    and mmpola's classes are in the root registries too (plain names from every other scope)."""
    from mmengine.registry import HOOKS, MODELS

    from mmpola import registry
    from mmpola.runtime import SafeCheckpointHook
    hook = HOOKS.build(dict(type='mmpola.SafeCheckpointHook', _scope_='mmpola', interval=1))
    assert isinstance(hook, SafeCheckpointHook)
    assert MODELS.build(dict(type='PolaPVT', _scope_='mmpola', arch='tiny')).__class__.__name__ == 'PolaPVT'
    for name in ('SafeCheckpointHook', 'RandomStateHook', 'NonFiniteLossHook', 'CheckpointFitHook',
                 'NonFinitePixelsHook', 'WorkDirHook'):
        assert registry.HOOKS.get(f'mmpola.{name}') is HOOKS.get(name) is not None
