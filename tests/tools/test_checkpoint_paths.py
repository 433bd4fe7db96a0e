"""Every checkpoint load path: a pickle that would run code is refused, naming the file, and
never runs; official PolaFormer files (with their yacs config object) and mmengine runner
checkpoints (numpy values and HistoryBuffers in meta / message_hub) load.

Paths: backbone ``init_cfg=dict(type='Pretrained')`` (PolaPVT, PolaSwin); mmengine's
``load_checkpoint`` / ``Runner.load_checkpoint`` behind ``load_from`` and tools/train.py
``--resume``; tools/test.py CHECKPOINT; timm ``create_model(checkpoint_path=...)``, pretrained
files and ``timm.models.load_checkpoint``.
"""
import os
import os.path as osp
import re

import numpy as np
import pytest
import timm
import torch
import torch.nn as nn

import mmpola  # noqa: F401  (registers the models, installs the safe loaders)
import mmpola.classification  # noqa: F401
from mmpola.checkpoint.safe_load import CheckpointFileError, UnsafeCheckpointError, safe_torch_load
from mmpola.models import PolaClassifier, PolaPVT, PolaSwin
from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
from tests.fixtures.paths import REPO  # noqa: E402
from tests.fixtures.tools import load_tool

DATA = osp.join(REPO, 'tests', 'data')
CLS_CONFIG = osp.join(REPO, 'configs', 'classification', 'pola-pvt-t_8xb128_in1k.py')
ENTRY = {'pvt': 'pola_pvt_tiny', 'swin': 'pola_swin_tiny'}
BACKBONE = {'pvt': PolaPVT, 'swin': PolaSwin}
# what every refusal must say: the file, why, and how to go on with a trusted file
REFUSAL = r'would let the file execute code.*If you trust its origin'


class _RunCode:
    """Unpickling this would run ``os.system``: a stand-in for a malicious checkpoint."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


def _evil(tmp_path, name='evil.pth'):
    """(path, marker): a checkpoint with real weights and a payload that would create marker."""
    marker = tmp_path / f'{name}.pwned'
    path = str(tmp_path / name)
    torch.save({'state_dict': {'backbone.pos_embed1': torch.zeros(1)}, 'meta': _RunCode(marker)}, path)
    return path, marker


def _assert_refused(excinfo_or_text, path, marker):
    text = excinfo_or_text if isinstance(excinfo_or_text, str) else str(excinfo_or_text.value)
    assert f"refused to load checkpoint '{path}'" in text, text
    assert 'posix.system' in text or 'os.system' in text, text
    assert re.search(REFUSAL, text), text
    assert not marker.exists(), 'the pickle ran code'


def _constructor(family):
    return safe_torch_load(osp.join(DATA, f'pola_{family}_mini_expected.pth'))['constructor']


def _official(family):
    """(path, official state dict) of the golden mini checkpoint (has a yacs config object)."""
    path = osp.join(DATA, f'pola_{family}_mini_official.pth')
    if not osp.isfile(path):
        pytest.fail(f'golden file {path} is missing (restore tests/data from the repository)')
    return path, safe_torch_load(path)['model']


def _backbone_kwargs(family):
    c = _constructor(family)
    if family == 'pvt':
        return dict(arch={k: list(c[k]) for k in ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')},
                    la_sr_ratios=c['la_sr_ratios'], attn_type=c['attn_type'])
    return dict(arch=dict(embed_dims=c['embed_dim'], depths=list(c['depths']),
                          num_heads=list(c['num_heads'])),
                window_size=c['window_size'], attn_type=c['attn_type'])


def _timm_kwargs(family):
    kwargs = official_kwargs_to_classifier_kwargs(_constructor(family))
    kwargs.pop('family')
    return kwargs


def _assert_backbone_equals(backbone_state, reference, prefix=''):
    """Every backbone tensor equals the reference's ``prefix + key`` (where it has one)."""
    compared = 0
    for key, value in backbone_state.items():
        ref = reference.get(prefix + key)
        if ref is not None:
            assert torch.equal(value, ref), key
            compared += 1
    assert compared > 0.9 * len(backbone_state), (compared, len(backbone_state))


# --------------------------------------------------------------------------------------------
# mmengine runner checkpoints, written by real mmengine runs

class _ToyClassifier:
    """A tiny mmengine model with PolaClassifier's key layout (backbone.* / norm.* / head.*)."""

    @staticmethod
    def build(family):
        from mmengine.model import BaseModel

        clf = PolaClassifier.from_official_kwargs(_constructor(family))

        class Toy(BaseModel):

            def __init__(self):
                super().__init__()
                self.backbone, self.norm, self.head = clf.backbone, clf.norm, clf.head

            def forward(self, inputs, mode='tensor'):
                feats = self.backbone(inputs)[-1].mean((2, 3))
                out = self.head(feats)
                return dict(loss=out.pow(2).mean()) if mode == 'loss' else out

        return Toy()


def _toy_runner_checkpoint(family, work_dir):
    """Two AdamW iterations of a real mmengine Runner; its CheckpointHook's file, with numpy
    scalars and arrays added to meta and message_hub (as mmdet/mmseg runs store them)."""
    from mmengine.runner import Runner
    from torch.utils.data import Dataset

    class Data(Dataset):

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return dict(inputs=torch.rand(3, 64, 64))

    runner = Runner(
        model=_ToyClassifier.build(family), work_dir=str(work_dir),
        train_dataloader=dict(dataset=Data(), batch_size=1, sampler=dict(type='DefaultSampler'),
                              collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=2, val_interval=100),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        default_scope='mmengine', experiment_name=f'ckpt_paths_toy_{family}')
    runner.train()
    path = osp.join(str(work_dir), 'iter_2.pth')
    return _add_numpy(path)


def _add_numpy(path):
    ckpt = torch.load(path, weights_only=False)  # written by this test: trusted
    ckpt['meta']['np_scalar'] = np.float64(0.5)
    ckpt['meta']['np_array'] = np.arange(6, dtype=np.float32).reshape(2, 3)
    ckpt['message_hub']['runtime_info']['np_value'] = np.int64(3)
    torch.save(ckpt, path)
    from mmengine.logging import HistoryBuffer
    loaded = safe_torch_load(path)
    assert isinstance(loaded['message_hub']['log_scalars']['train/loss'], HistoryBuffer)
    return path


@pytest.fixture(scope='module')
def toy_checkpoints(tmp_path_factory):
    """{'pvt' | 'swin': (path, state dict)} of mmengine runner checkpoints."""
    out = {}
    for family in ('pvt', 'swin'):
        path = _toy_runner_checkpoint(family, tmp_path_factory.mktemp(f'toy_{family}'))
        out[family] = (path, safe_torch_load(path)['state_dict'])
    return out


# --------------------------------------------------------------------------------------------
# 1. backbone init_cfg=dict(type='Pretrained')

@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_init_cfg_pretrained(family, toy_checkpoints, tmp_path):
    cls = BACKBONE[family]
    evil, marker = _evil(tmp_path)
    with pytest.raises(UnsafeCheckpointError) as exc:
        cls(**_backbone_kwargs(family), init_cfg=dict(type='Pretrained', checkpoint=evil)).init_weights()
    _assert_refused(exc, evil, marker)

    path, official = _official(family)
    model = cls(**_backbone_kwargs(family), init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    _assert_backbone_equals(model.state_dict(), official)

    path, state = toy_checkpoints[family]
    model = cls(**_backbone_kwargs(family), init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    _assert_backbone_equals(model.state_dict(), state, prefix='backbone.')


def test_mmengine_load_checkpoint_and_pretrained_init(toy_checkpoints, tmp_path, monkeypatch):
    """mmengine's own loader (load_from, --resume, tools/test.py, Pretrained inits of necks and
    heads) goes through the safe loader: refused with the file named, even when
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 would make plain torch.load unpickle anything."""
    from mmengine.runner import CheckpointLoader, load_checkpoint
    evil, marker = _evil(tmp_path)
    model = _ToyClassifier.build('pvt')
    with pytest.raises(UnsafeCheckpointError) as exc:
        load_checkpoint(model, evil)
    _assert_refused(exc, evil, marker)
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    with pytest.raises(UnsafeCheckpointError) as exc:
        CheckpointLoader.load_checkpoint(evil, map_location='cpu')
    _assert_refused(exc, evil, marker)
    monkeypatch.delenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD')

    path, state = toy_checkpoints['swin']
    model = _ToyClassifier.build('swin')
    ckpt = load_checkpoint(model, path)
    assert ckpt['meta']['np_array'].shape == (2, 3)
    _assert_backbone_equals(model.state_dict(), state)

    # an mmengine Pretrained init of a plain module (what necks / heads use)
    from mmengine.model import BaseModule

    class Head(BaseModule):

        def __init__(self, checkpoint):
            super().__init__(init_cfg=dict(type='Pretrained', checkpoint=checkpoint, prefix='head.'))
            self.weight = nn.Parameter(torch.zeros_like(state['head.weight']))
            self.bias = nn.Parameter(torch.zeros_like(state['head.bias']))

    with pytest.raises(UnsafeCheckpointError) as exc:
        Head(evil).init_weights()
    _assert_refused(exc, evil, marker)
    head = Head(path)
    head.init_weights()
    assert torch.equal(head.weight, state['head.weight'])


def test_refusal_through_other_loaders_names_the_file(tmp_path):
    """A loader mmpola does not replace (mmengine's http / s3 schemes: plain torch.load) still
    reports the refusal with the file, the reason and the way forward."""
    from mmengine.runner import CheckpointLoader
    evil, marker = _evil(tmp_path)
    for prefix in ('https://', 's3://'):
        loader = CheckpointLoader._schemes[[p for p in CheckpointLoader._schemes if prefix in p][0]]
        assert getattr(loader, '_mmpola_guarded', False), prefix
    from mmpola.checkpoint.safe_load import name_refused_file
    plain = name_refused_file(lambda filename, map_location: torch.load(evil, map_location=map_location))
    with pytest.raises(UnsafeCheckpointError) as exc:
        plain(evil, 'cpu')
    _assert_refused(exc, evil, marker)
    # a file that is no checkpoint at all (an HTML error page saved by a failed download)
    html = tmp_path / 'page.pth'
    html.write_text('<html>404</html>')
    with pytest.raises(CheckpointFileError, match=r"'.*page\.pth' is not a PyTorch checkpoint: an HTML/XML page"):
        CheckpointLoader.load_checkpoint(str(html))


# --------------------------------------------------------------------------------------------
# 2. / 3. tools/train.py (--resume, load_from) and tools/test.py on a tiny classification config

@pytest.fixture(scope='module')
def tiny_cls(tmp_path_factory):
    """A classification config of the golden mini Pola-PVT (10 classes, as the official file) on
    a tiny generated dataset, and a 2-iteration tools/train.py run of it (its epoch_1.pth)."""
    from mmpola.classification.demo_imagenet import make_demo_imagenet
    root = str(tmp_path_factory.mktemp('tiny_imagenet'))
    make_demo_imagenet(root, num_train=1, num_val=1, size=64, seed=0)
    c = _constructor('pvt')
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
    args = train.parse_args([str(config), '--work-dir', str(work / 'train')])
    train.build_runner(args).train()
    checkpoint = _add_numpy(str(work / 'train' / 'epoch_1.pth'))
    return dict(config=str(config), checkpoint=checkpoint, work=work)


def _probe_train(train, argv):
    """Build tools/train.py's runner and run it up to before_train: (iter, model state)."""
    from mmengine.hooks import Hook
    runner = train.build_runner(train.parse_args(argv))
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
    evil, marker = _evil(tmp_path)
    for extra in (['--resume', evil], ['--cfg-options', f'load_from={evil}']):
        with pytest.raises(UnsafeCheckpointError) as exc:
            _probe_train(train, base + extra)
        _assert_refused(exc, evil, marker)

    # an mmengine runner checkpoint: --resume restores weights and iteration
    saved = safe_torch_load(tiny_cls['checkpoint'])
    seen = _probe_train(train, base + ['--resume', tiny_cls['checkpoint']])
    assert seen['iter'] == 2 == saved['meta']['iter']
    for key, value in saved['state_dict'].items():
        assert torch.equal(seen['model'][key], value), key

    # an official file: --resume says it holds weights only and how to start from them
    path, official = _official('pvt')
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
    evil, marker = _evil(tmp_path)
    with pytest.raises(SystemExit) as exc:
        test.main([tiny_cls['config'], evil, '--work-dir', str(tmp_path / 'evil')])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and 'Traceback' not in err
    _assert_refused(err, evil, marker)

    path, official = _official('pvt')
    saved = safe_torch_load(tiny_cls['checkpoint'])['state_dict']
    for checkpoint, reference in ((tiny_cls['checkpoint'], saved),
                                  (path, {f'backbone.{k}': v for k, v in official.items()})):
        runner = test.build_runner(test.parse_args([tiny_cls['config'], checkpoint,
                                                    '--work-dir', str(tmp_path / 'test')]))
        metrics = runner.test()
        assert 'accuracy/top1' in metrics
        _assert_backbone_equals(runner.model.state_dict(), reference)
    assert torch.equal(runner.model.state_dict()['head.weight'], official['head.weight'])


# --------------------------------------------------------------------------------------------
# 4. timm: create_model(checkpoint_path=...), pretrained files, timm.models.load_checkpoint

@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_timm_paths(family, toy_checkpoints, tmp_path):
    kwargs = _timm_kwargs(family)
    evil, marker = _evil(tmp_path)
    with pytest.raises(UnsafeCheckpointError) as exc:
        timm.create_model(ENTRY[family], checkpoint_path=evil, **kwargs)
    _assert_refused(exc, evil, marker)
    with pytest.raises(UnsafeCheckpointError) as exc:
        timm.create_model(ENTRY[family], pretrained=True, pretrained_cfg_overlay=dict(file=evil), **kwargs)
    _assert_refused(exc, evil, marker)
    model = timm.create_model(ENTRY[family], **kwargs)
    with pytest.raises(UnsafeCheckpointError) as exc:
        timm.models.load_checkpoint(model, evil)
    _assert_refused(exc, evil, marker)

    path, official = _official(family)
    model = timm.create_model(ENTRY[family], checkpoint_path=path, **kwargs)
    _assert_backbone_equals(model.backbone.state_dict(), official)
    assert torch.equal(model.head.weight, official['head.weight'])

    path, state = toy_checkpoints[family]
    model = timm.create_model(ENTRY[family], checkpoint_path=path, **kwargs)  # strict
    _assert_backbone_equals(model.state_dict(), state)
    model = timm.create_model(ENTRY[family], **kwargs)
    timm.models.load_checkpoint(model, path)
    _assert_backbone_equals(model.state_dict(), state)
