"""Mixed precision on CPU-only machines."""
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

__all__ = ['CPUAmpOptimWrapper']


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """``OptimWrapper`` that runs forward and loss under ``torch.autocast('cpu', bfloat16)``.

    mmengine's ``AmpOptimWrapper`` refuses to start without CUDA/NPU/MLU, so ``--amp`` on a CPU
    machine uses this instead (tools/train.py switches automatically). bf16 has fp32's exponent
    range, so there is no loss scaling and the state dict is the plain optimizer's; a checkpoint
    written under CUDA AMP (with a ``loss_scaler`` entry) still resumes here.
    """

    def __init__(self, dtype='bfloat16', **kwargs):
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(f'CPU autocast supports bfloat16 only, got dtype={dtype!r}')
        super().__init__(**kwargs)
        self.cast_dtype = torch.bfloat16

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        state_dict.pop('loss_scaler', None)
        super().load_state_dict(state_dict)

    @contextmanager
    def optim_context(self, model):
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield
