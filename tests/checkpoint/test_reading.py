"""Checkpoint files are read weights-only through mmpola's allowlist (mmpola.checkpoint.reading); code
never runs. ``import mmpola`` adds the allowlist to torch's, so mmengine's and timm's loaders read
mmengine and official checkpoints too, and still refuse anything else (with torch's own message)."""
import os
import os.path as osp
import pickle

import numpy as np
import pytest
import torch
import torch.nn as nn

import mmpola  # noqa: F401  (adds the allowlist to torch's)
from mmpola.checkpoint.reading import (
    CheckpointFileError,
    UnsafeCheckpointError,
    check_checkpoint_file,
    refused_globals,
    safe_torch_load,
)
from tests.fixtures.paths import DATA


class _RunCode:
    """Unpickling this would run ``os.system``: a stand-in for a malicious checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


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
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': _RunCode(marker)}, path)
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
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': _RunCode(marker)}, path)
    assert refused_globals(path) == ['posix.system']
    with pytest.raises(UnsafeCheckpointError, match=f"refused to load checkpoint '{path}'.*posix.system"):
        check_checkpoint_file(path)
    good = str(tmp_path / 'good.pth')
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': {'np': np.float64(1.0)}}, good)
    assert refused_globals(good) == []
    check_checkpoint_file(good)
    legacy = str(tmp_path / 'legacy.pth')  # no zip: only loading it tells
    torch.save({'meta': _RunCode(marker)}, legacy, _use_new_zipfile_serialization=False)
    assert refused_globals(legacy) is None
    with pytest.raises(UnsafeCheckpointError):
        check_checkpoint_file(legacy)
    assert not marker.exists()


def test_safe_loading_holds_whatever_the_environment_says(tmp_path, monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 turns torch.load's default off (torch's own switch, which
    mmpola leaves to torch); mmpola's own loader and check still refuse."""
    marker = tmp_path / 'pwned'
    path = str(tmp_path / 'evil.pth')
    torch.save({'meta': _RunCode(marker)}, path)
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    with pytest.raises(UnsafeCheckpointError):
        safe_torch_load(path)
    with pytest.raises(UnsafeCheckpointError):
        check_checkpoint_file(path)
    assert not marker.exists()


def test_unreadable_files_name_the_problem(tmp_path):
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    with pytest.raises(CheckpointFileError, match=r'is empty \(0 bytes\)'):
        safe_torch_load(str(empty))
    with pytest.raises(CheckpointFileError, match='is a directory'):
        check_checkpoint_file(str(tmp_path))
