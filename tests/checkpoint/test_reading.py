"""Checkpoint files are read weights-only through mmpola's allowlist (mmpola.checkpoint.reading); code
never runs. ``import mmpola`` adds the allowlist to torch's, so every loader (a backbone's
``init_cfg=dict(type='Pretrained')``, mmengine's ``load_checkpoint`` behind ``load_from`` / ``--resume``
/ tools/test.py and the Pretrained inits of necks and heads, timm's ``create_model(checkpoint_path=...)``,
pretrained files and ``timm.models.load_checkpoint``) reads official PolaFormer files (with their yacs
config object) and mmengine runner checkpoints (numpy values and HistoryBuffers in meta /
message_hub), and refuses anything else: mmpola's loaders naming the file, mmengine's and timm's in
torch's words."""
import os.path as osp
import pickle

import numpy as np
import pytest
import timm
import torch
import torch.nn as nn

import mmpola  # noqa: F401  (adds the allowlist to torch's)
import mmpola.classification  # noqa: F401  (the timm entries)
from mmpola.checkpoint.reading import (
    CheckpointFileError,
    UnsafeCheckpointError,
    check_checkpoint_file,
    refused_globals,
    safe_torch_load,
)
from mmpola.models import ImageClassifier
from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
from tests.fixtures.checkpoints import (
    UNREADABLE,
    RunCode,
    add_numpy,
    assert_refused,
    classifier_from_official,
    evil_checkpoint,
    golden_constructor,
    golden_official,
    unreadable_checkpoints,
)
from tests.fixtures.paths import DATA


class _GetattrEscape:
    """Tries to reach a method other than HistoryBuffer's statistics through ``getattr``."""

    def __reduce__(self):
        from mmengine.logging import HistoryBuffer
        return (getattr, (HistoryBuffer, 'register_statistics'))


def _toy_runner_checkpoint(work_dir):
    """A real mmengine run (2 iterations) that saves a checkpoint, plus numpy values in meta."""
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    from torch.utils.data import Dataset

    class Toy(BaseModel):

        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 1)

        def forward(self, x, y, mode='tensor'):
            out = self.linear(x)
            if mode == 'loss':
                return dict(loss=((out - y) ** 2).mean())
            return out

    class Data(Dataset):

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return dict(x=torch.full((2, ), float(i)), y=torch.ones(1))

    runner = Runner(
        model=Toy(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=Data(), batch_size=2, sampler=dict(type='DefaultSampler'),
                              collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=2, val_interval=100),
        param_scheduler=[dict(type='LinearLR', start_factor=0.1, by_epoch=False, end=2)],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False)),
        default_scope='mmengine')
    runner.train()
    path = osp.join(str(work_dir), 'iter_2.pth')
    ckpt = torch.load(path, weights_only=False)  # written by us in this test: trusted
    ckpt['meta']['np_scalar'] = np.float64(0.5)
    ckpt['meta']['np_int'] = np.int64(3)
    ckpt['meta']['np_array'] = np.arange(6, dtype=np.float32).reshape(2, 3)
    ckpt['message_hub']['runtime_info']['np_value'] = np.float32(1.5)
    torch.save(ckpt, path)
    return path


def test_mmengine_runner_checkpoint_loads_weights_only(tmp_path):
    path = _toy_runner_checkpoint(tmp_path)
    ckpt = safe_torch_load(path)
    assert ckpt['meta']['np_array'].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert ckpt['meta']['np_scalar'] == 0.5
    hub = ckpt['message_hub']
    assert 'train/lr' in hub['log_scalars']
    assert hub['log_scalars']['train/lr'].mean() > 0  # HistoryBuffer restored and usable
    # mmengine's own loader (used by --resume, load_from, init_cfg) calls plain torch.load, whose
    # default is weights_only=True on torch >= 2.6: it succeeds through torch's allowlist.
    from mmengine.runner import CheckpointLoader
    loaded = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    assert set(loaded['state_dict']) == {'linear.weight', 'linear.bias'}
    loaded = torch.load(path, weights_only=True)
    assert loaded['meta']['np_int'] == 3


def test_official_checkpoint_loads_without_yacs():
    with pytest.raises(ImportError):
        import yacs  # noqa: F401  (the point: yacs is not installed)
    ckpt = safe_torch_load(osp.join(DATA, 'pola_pvt_mini_official.pth'))
    assert isinstance(ckpt['config'], dict)
    assert ckpt['config']['MODEL']['TYPE'] == 'pola_pvt_mini'
    assert all(isinstance(v, torch.Tensor) for v in ckpt['model'].values())


@pytest.mark.parametrize('loader', ['safe_torch_load', 'torch.load', 'mmengine'])
def test_code_running_pickle_is_refused(tmp_path, loader):
    marker = tmp_path / 'pwned'
    path = str(tmp_path / 'evil.pth')
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': RunCode(marker)}, path)
    if loader == 'safe_torch_load':
        with pytest.raises(UnsafeCheckpointError, match='refused to load'):
            safe_torch_load(path)
    elif loader == 'torch.load':
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path)  # the default (weights_only=True) with our allowlist added
    else:  # mmengine's own loader: torch's refusal, in torch's words
        from mmengine.runner import CheckpointLoader
        with pytest.raises(pickle.UnpicklingError, match='Weights only load failed'):
            CheckpointLoader.load_checkpoint(path, map_location='cpu')
    assert not marker.exists(), 'the pickle ran code'


def test_getattr_is_restricted_to_history_buffer_statistics(tmp_path):
    path = str(tmp_path / 'getattr.pth')
    torch.save({'meta': _GetattrEscape()}, path)
    with pytest.raises(UnsafeCheckpointError):
        safe_torch_load(path)


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match='does not exist'):
        safe_torch_load(str(tmp_path / 'nope.pth'))


def test_refusal_is_seen_without_loading_and_names_the_file(tmp_path):
    """What the tools check before a run: the refused globals, from the pickle alone."""
    marker = tmp_path / 'pwned'
    path = str(tmp_path / 'evil.pth')
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': RunCode(marker)}, path)
    assert refused_globals(path) == ['posix.system']
    with pytest.raises(UnsafeCheckpointError, match=f"refused to load checkpoint '{path}'.*posix.system"):
        check_checkpoint_file(path)
    good = str(tmp_path / 'good.pth')
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': {'np': np.float64(1.0)}}, good)
    assert refused_globals(good) == []
    check_checkpoint_file(good)
    legacy = str(tmp_path / 'legacy.pth')  # no zip: only loading it tells
    torch.save({'meta': RunCode(marker)}, legacy, _use_new_zipfile_serialization=False)
    assert refused_globals(legacy) is None
    with pytest.raises(UnsafeCheckpointError):
        check_checkpoint_file(legacy)
    assert not marker.exists()


def test_safe_loading_holds_whatever_the_environment_says(tmp_path, monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 turns torch.load's default off (torch's own switch, which
    mmpola leaves to torch); mmpola's own loader and check still refuse."""
    marker = tmp_path / 'pwned'
    path = str(tmp_path / 'evil.pth')
    torch.save({'meta': RunCode(marker)}, path)
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    with pytest.raises(UnsafeCheckpointError):
        safe_torch_load(path)
    with pytest.raises(UnsafeCheckpointError):
        check_checkpoint_file(path)
    assert not marker.exists()


def test_unreadable_files_are_named_by_mmpolas_readers(tmp_path):
    """mmpola's readers (safe_torch_load, read_checkpoint, the tools' check) name the file and the
    problem; mmengine's and timm's loaders raise their own errors for such files (the tools check every
    file before mmengine reads it)."""
    from mmpola.checkpoint import read_checkpoint
    for kind, path in unreadable_checkpoints(tmp_path).items():
        for read in (safe_torch_load, read_checkpoint, check_checkpoint_file):
            with pytest.raises(CheckpointFileError, match=f"'{path}' " + UNREADABLE[kind]):
                read(path)
    with pytest.raises(CheckpointFileError, match='does not exist'):
        check_checkpoint_file(str(tmp_path / 'nope.pth'))
    # a URL without network: the download failed, and how to pass a local file instead
    with pytest.raises(CheckpointFileError, match=r"downloading checkpoint 'http://127\.0\.0\.1:9/w\.pth' failed "
                                                  r'\(URLError: .*\)\. Without network access, download it on '
                                                  r'another machine and pass the local file'):
        read_checkpoint('http://127.0.0.1:9/w.pth')


# --------------------------------------------------------------------------------------------
# every loader: mmpola's backbones (init_cfg Pretrained), mmengine's, timm's

ENTRY = {'pvt': 'pola_pvt_tiny', 'swin': 'pola_swin_tiny'}


def _backbone(family):
    from mmpola.models import PolaPVT, PolaSwin
    return {'pvt': PolaPVT, 'swin': PolaSwin}[family]


def _backbone_kwargs(family):
    c = golden_constructor(family)
    if family == 'pvt':
        return dict(arch={k: list(c[k]) for k in ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')},
                    la_sr_ratios=c['la_sr_ratios'], attn_type=c['attn_type'])
    return dict(arch=dict(embed_dims=c['embed_dim'], depths=list(c['depths']),
                          num_heads=list(c['num_heads'])),
                window_size=c['window_size'], attn_type=c['attn_type'])


def _timm_kwargs(family):
    kwargs = official_kwargs_to_classifier_kwargs(golden_constructor(family))
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


class _ToyClassifier:
    """A tiny mmengine model with ImageClassifier's key layout (backbone.* / norm.* / head.*)."""

    @staticmethod
    def build(family):
        from mmengine.model import BaseModel

        clf = classifier_from_official(ImageClassifier, golden_constructor(family))

        class Toy(BaseModel):

            def __init__(self):
                super().__init__()
                self.backbone, self.norm, self.head = clf.backbone, clf.norm, clf.head

            def forward(self, inputs, mode='tensor'):
                feats = self.backbone(inputs)[-1].mean((2, 3))
                out = self.head(feats)
                return dict(loss=out.pow(2).mean()) if mode == 'loss' else out

        return Toy()


def _classifier_runner_checkpoint(family, work_dir):
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
    return add_numpy(path)


@pytest.fixture(scope='module')
def toy_checkpoints(tmp_path_factory):
    """{'pvt' | 'swin': (path, state dict)} of mmengine runner checkpoints."""
    out = {}
    for family in ('pvt', 'swin'):
        path = _classifier_runner_checkpoint(family, tmp_path_factory.mktemp(f'toy_{family}'))
        out[family] = (path, safe_torch_load(path)['state_dict'])
    return out


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_init_cfg_pretrained(family, toy_checkpoints, tmp_path):
    cls = _backbone(family)
    evil, marker = evil_checkpoint(tmp_path)
    with pytest.raises(UnsafeCheckpointError) as exc:
        cls(**_backbone_kwargs(family), init_cfg=dict(type='Pretrained', checkpoint=evil)).init_weights()
    assert_refused(exc, evil, marker)

    path, official = golden_official(family)
    model = cls(**_backbone_kwargs(family), init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    _assert_backbone_equals(model.state_dict(), official)

    path, state = toy_checkpoints[family]
    model = cls(**_backbone_kwargs(family), init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    _assert_backbone_equals(model.state_dict(), state, prefix='backbone.')


def test_mmengine_load_checkpoint_and_pretrained_init(toy_checkpoints, tmp_path, monkeypatch):
    """mmengine's own loader (load_from, --resume, tools/test.py, Pretrained inits of necks and
    heads) reads weights-only by torch's default: mmengine and official checkpoints load through
    torch's allowlist, a code-running pickle is refused in torch's words (the tools name the file
    before mmengine reads it: tests/runtime/preflight/test_checkpoints.py)."""
    from mmengine.runner import CheckpointLoader, load_checkpoint
    evil, marker = evil_checkpoint(tmp_path)
    model = _ToyClassifier.build('pvt')
    with pytest.raises(pickle.UnpicklingError, match='Weights only load failed'):
        load_checkpoint(model, evil)
    with pytest.raises(pickle.UnpicklingError, match='Weights only load failed'):
        CheckpointLoader.load_checkpoint(evil, map_location='cpu')
    assert not marker.exists()

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

    with pytest.raises(pickle.UnpicklingError):
        Head(evil).init_weights()
    assert not marker.exists()
    head = Head(path)
    head.init_weights()
    assert torch.equal(head.weight, state['head.weight'])


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_timm_paths(family, toy_checkpoints, tmp_path):
    kwargs = _timm_kwargs(family)
    evil, marker = evil_checkpoint(tmp_path)  # refused by timm's weights-only reader, in its own words
    refusal = (pickle.UnpicklingError, RuntimeError)
    with pytest.raises(refusal, match='posix.system'):
        timm.create_model(ENTRY[family], checkpoint_path=evil, **kwargs)
    with pytest.raises(refusal, match='posix.system'):
        timm.create_model(ENTRY[family], pretrained=True, pretrained_cfg_overlay=dict(file=evil), **kwargs)
    model = timm.create_model(ENTRY[family], **kwargs)
    with pytest.raises(refusal, match='posix.system'):
        timm.models.load_checkpoint(model, evil)
    assert not marker.exists()

    path, official = golden_official(family)
    model = timm.create_model(ENTRY[family], checkpoint_path=path, **kwargs)
    _assert_backbone_equals(model.backbone.state_dict(), official)
    assert torch.equal(model.head.weight, official['head.weight'])

    path, state = toy_checkpoints[family]
    model = timm.create_model(ENTRY[family], checkpoint_path=path, **kwargs)  # strict
    _assert_backbone_equals(model.state_dict(), state)
    model = timm.create_model(ENTRY[family], **kwargs)
    timm.models.load_checkpoint(model, path)
    _assert_backbone_equals(model.state_dict(), state)
