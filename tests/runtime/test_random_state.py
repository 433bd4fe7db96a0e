"""RandomStateHook in process, on a toy model whose loss and data draw torch / numpy / python
random numbers; and the CPU allocator tuning of mmpola's tools."""
import os
import os.path as osp
import random
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.model import BaseModel
from mmengine.runner import Runner

from mmpola.runtime import RandomStateHook
from mmpola.runtime.resume import CHECKPOINT_KEY
from tests.fixtures.paths import REPO  # noqa: E402


class NoisyToyModel(BaseModel):
    """The loss uses a random mask (torch RNG) like dropout / drop-path / RoI sampling."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        x = torch.stack(list(inputs))
        out = self.linear(x * (torch.rand_like(x) > 0.3))
        if mode == 'loss':
            return dict(loss=((out - 1) ** 2).mean())
        return out


class AugmentedToyDataset(torch.utils.data.Dataset):
    """Random augmentations with numpy and python RNGs (like RandomFlip / RandomResize)."""

    def __init__(self):
        self.x = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        scale = float(np.random.uniform(0.5, 1.5)) * random.choice([1.0, -1.0])
        return dict(inputs=self.x[i] * scale)


def _runner(work_dir, resume=False, load_from=None, hooks=True, max_iters=6):
    torch.manual_seed(0)  # the model is built here, before the Runner seeds: same initial weights
    return Runner(
        model=NoisyToyModel(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=AugmentedToyDataset(), sampler=dict(type='DefaultSampler', shuffle=True),
                              batch_size=2, num_workers=0, collate_fn=pseudo_collate),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.05)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters), resume=resume, load_from=load_from,
        custom_hooks=[RandomStateHook()] if hooks else None,
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=1), experiment_name=f'rng_{uuid.uuid4().hex}', log_level='WARNING')


def _weights(runner):
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


@pytest.mark.parametrize('hooks', [True, False])
def test_resume_repeats_the_uninterrupted_run_only_with_the_hook(tmp_path, hooks):
    straight = _runner(tmp_path / 'a', hooks=hooks)
    straight.train()  # 6 iterations: 1 epoch of 5 batches and one more; checkpoints at 2, 4, 6
    expected = _weights(straight)

    interrupted = _runner(tmp_path / 'b', hooks=hooks, max_iters=2)
    interrupted.train()
    resumed = _runner(tmp_path / 'b', hooks=hooks, resume=True, load_from=str(tmp_path / 'b' / 'iter_2.pth'))
    resumed.train()
    assert resumed.iter == 6
    same = all(torch.equal(v, expected[k]) for k, v in _weights(resumed).items())
    assert same is hooks  # without the RNG states, the masks and augmentations after iteration 2 differ


def test_checkpoint_holds_the_states_and_load_from_leaves_them_alone(tmp_path):
    _runner(tmp_path / 'a', max_iters=2).train()
    saved = torch.load(tmp_path / 'a' / 'iter_2.pth', map_location='cpu', weights_only=True)
    state = saved[CHECKPOINT_KEY]
    assert set(state) >= {'python', 'numpy', 'torch', 'generators'} and 'train' in state['generators']

    # load_from (fine-tuning) starts its own random stream
    hook = RandomStateHook()
    runner = _runner(tmp_path / 'c', load_from=str(tmp_path / 'a' / 'iter_2.pth'), hooks=False)
    runner.register_hook(hook)
    runner.load_or_resume()
    assert hook._pending is None


def test_resuming_a_checkpoint_without_states_warns(tmp_path):
    _runner(tmp_path / 'a', hooks=False, max_iters=2).train()
    runner = _runner(tmp_path / 'a', resume=True, max_iters=3)
    warnings = []
    runner.logger.warning = warnings.append
    runner.train()
    assert runner.iter == 3
    assert any('no random generator states' in w for w in warnings), warnings


def _tune_in_subprocess(env_extra):
    """tune_malloc() result in a fresh interpreter (the setting is per process)."""
    allocator = osp.join(REPO, 'mmpola', 'runtime', 'allocator.py')
    code = ('import importlib.util, sys; '
            f"spec = importlib.util.spec_from_file_location('alloc', {allocator!r}); "
            'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); '
            'print(m.tune_malloc()); print(m.tune_malloc())')
    env = {k: v for k, v in os.environ.items() if not (k.startswith('MALLOC_') and k.endswith('_'))}
    env.update(env_extra)
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True)
    first, second = out.stdout.strip().splitlines()
    assert first == second  # idempotent
    return first


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc mallopt')
def test_malloc_tuning_on_by_default_with_opt_outs():
    assert _tune_in_subprocess({}).startswith('on')
    assert _tune_in_subprocess({'MMPOLA_MALLOC_TUNING': '0'}).startswith('off')
    assert _tune_in_subprocess({'MALLOC_TOP_PAD_': '1048576'}).startswith('left to the environment')
