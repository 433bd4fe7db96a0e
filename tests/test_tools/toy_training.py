"""A toy model, dataset and fault-injection hooks for tools/train.py subprocess tests (seconds per run).

Configs import this module with ``custom_imports=dict(imports=['toy_training'])`` (the tests put
this folder on PYTHONPATH). The model's loss uses a random mask and a data-dependent number of
torch random draws (ranks and batches consume different amounts, like RoI sampling); the dataset
augments with numpy, python and torch random numbers (in the data workers when there are any).
The hooks inject faults chosen by environment variables, so that a resumed run (without them)
trains exactly like an uninterrupted one:

* ``TOY_KILL_AT_SAVE=N``: SIGKILL the process while the N-th checkpoint is being serialised;
* ``TOY_PAD_AT_SAVE=N``: add ``TOY_PAD_MB`` MiB to the N-th checkpoint (with a file size limit:
  a disk that fills during that save);
* ``TOY_SIGTERM_AT_ITER=N``: send SIGTERM to the process itself during iteration N (1-based);
* ``TOY_SLEEP=S``: sleep S seconds per iteration (a run that lasts).
"""
import os
import random
import signal
import time

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS


@MODELS.register_module(force=True)
class ToyNoisyModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        x = torch.stack(list(inputs))
        torch.rand(int(x.abs().sum().item() * 10) % 3)  # a data-dependent number of random draws
        out = self.linear(x * (torch.rand_like(x) > 0.3))
        if mode == 'loss':
            return dict(loss=((out - 1) ** 2).mean())
        return out


@DATASETS.register_module(force=True)
class ToyNoisyDataset(torch.utils.data.Dataset):

    def __init__(self, num=10):
        self.x = torch.randn(num, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        scale = float(np.random.uniform(0.5, 1.5)) * random.choice([1.0, -1.0])
        return dict(inputs=self.x[i] * scale + 0.1 * torch.rand(4))


def _env_int(name):
    value = os.environ.get(name, '')
    return int(value) if value.isdigit() else None


class _KillOnPickle:
    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached


@HOOKS.register_module(force=True)
class ToyFaultHook(Hook):
    priority = 'LOWEST'

    def __init__(self):
        self.saves = 0

    def before_save_checkpoint(self, runner, checkpoint):
        self.saves += 1
        if self.saves == _env_int('TOY_KILL_AT_SAVE'):
            checkpoint['kill_while_writing'] = _KillOnPickle()
        if self.saves == _env_int('TOY_PAD_AT_SAVE'):
            checkpoint['padding'] = torch.zeros(int(os.environ.get('TOY_PAD_MB', '4')) << 18)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter + 1 == _env_int('TOY_SIGTERM_AT_ITER'):
            os.kill(os.getpid(), signal.SIGTERM)
        if os.environ.get('TOY_SLEEP'):
            time.sleep(float(os.environ['TOY_SLEEP']))
