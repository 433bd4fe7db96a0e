"""Checkpoints load with torch.load(weights_only=True) through mmpola's allowlist; code never runs."""
import os
import os.path as osp
import pickle

import numpy as np
import pytest
import torch
import torch.nn as nn

import mmpola  # noqa: F401  (installs the allowlist)
from mmpola.checkpoint.safe_load import UnsafeCheckpointError, safe_torch_load

DATA = osp.join(osp.dirname(__file__), 'data')


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
    # default is weights_only=True on torch >= 2.6: it must succeed too.
    from mmengine.runner import CheckpointLoader
    loaded = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    assert set(loaded['state_dict']) == {'linear.weight', 'linear.bias'}
    if hasattr(torch.serialization, 'add_safe_globals'):
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
            torch.load(path)  # the default (weights_only=True) with our allowlist installed
    else:
        from mmengine.runner import CheckpointLoader
        with pytest.raises(Exception):
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


_PROBE = r'''
import json, torch
import mmpola
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader
from timm.models import _helpers
from mmpola.checkpoint import safe_load
official = safe_load.safe_torch_load({path!r})  # mmpola's own loader works either way
print(json.dumps(dict(
    installed=safe_load.is_installed(),
    torch_allowlist=HistoryBuffer in torch.serialization.get_safe_globals(),
    mmengine_local=CheckpointLoader._schemes[''] is safe_load.load_from_local,
    timm_reader=getattr(_helpers._torch_load, '_mmpola_guarded', False),
    official_keys=len(official['model']))))
'''


@pytest.mark.parametrize('env, expected', [('1', True), ('0', False)])
def test_import_side_effects_follow_the_environment(env, expected):
    """``import mmpola`` installs the safe loading into torch, mmengine and timm unless MMPOLA_SAFE_LOAD=0;
    mmpola's own loader applies the allowlist in both cases."""
    import json
    import subprocess
    import sys
    probe = _PROBE.format(path=osp.join(DATA, 'pola_pvt_mini_official.pth'))
    out = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, check=True,
                         env=dict(os.environ, MMPOLA_SAFE_LOAD=env)).stdout
    state = json.loads(out.strip().splitlines()[-1])
    assert state.pop('official_keys') > 0
    assert state == dict(installed=expected, torch_allowlist=expected, mmengine_local=expected,
                         timm_reader=expected)


def test_uninstall_restores_and_install_is_idempotent():
    from mmengine.logging import HistoryBuffer
    from mmengine.runner.checkpoint import CheckpointLoader
    from timm.models import _helpers

    from mmpola.checkpoint import safe_load
    assert safe_load.is_installed()
    guarded_reader = _helpers._torch_load
    try:
        safe_load.uninstall()
        assert not safe_load.is_installed()
        assert HistoryBuffer not in torch.serialization.get_safe_globals()
        assert CheckpointLoader._schemes[''] is not safe_load.load_from_local
        assert not getattr(_helpers._torch_load, '_mmpola_guarded', False)
        # mmpola's own loader still reads official checkpoints (its allowlist is per call)
        assert 'model' in safe_torch_load(osp.join(DATA, 'pola_pvt_mini_official.pth'))
        safe_load.uninstall()  # a second uninstall is a no-op
    finally:
        assert safe_load.install() and safe_load.install()
    assert HistoryBuffer in torch.serialization.get_safe_globals()
    assert CheckpointLoader._schemes[''] is safe_load.load_from_local
    assert getattr(_helpers._torch_load, '_mmpola_guarded', False)
    assert _helpers._torch_load.__wrapped__ is guarded_reader.__wrapped__  # wrapped once, not twice
