"""bf16 mixed precision that works on the CPU and with mmcv's fp32-only kernels."""
from contextlib import contextmanager

import torch
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper

from mmpola.registry import OPTIM_WRAPPERS

__all__ = ['BF16AmpOptimWrapper', 'autocast_module']


def _to_float32(output):
    if isinstance(output, torch.Tensor):
        return output.float() if output.dtype == torch.bfloat16 else output
    if isinstance(output, (list, tuple)):
        return type(output)(_to_float32(o) for o in output)
    if isinstance(output, dict):
        return {k: _to_float32(v) for k, v in output.items()}
    return output


@contextmanager
def autocast_module(module, device_type, dtype):
    """Run ``module``'s forward under autocast and hand fp32 outputs to whatever follows."""
    contexts = []

    def enter(mod, args):
        contexts.append(torch.autocast(device_type, dtype=dtype))
        contexts[-1].__enter__()

    def leave(mod, args, output):
        contexts.pop().__exit__(None, None, None)
        return _to_float32(output)

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@OPTIM_WRAPPERS.register_module()
class BF16AmpOptimWrapper(OptimWrapper):
    """Mixed precision training in bfloat16, on the CPU or on CUDA, without loss scaling.

    mmengine's ``AmpOptimWrapper`` refuses to start without an accelerator, and autocasting a
    whole detector breaks on mmcv's kernels that only take fp32 on the CPU (and fp32/fp16 on
    CUDA): ``nms``, ``RoIAlign``. So the autocast region is the model's ``autocast_module``
    (default ``'backbone'``: where a Pola model spends its time); its outputs are cast back to
    fp32 for the neck and heads. ``autocast_module=None`` (or a model without that attribute)
    autocasts the whole forward. bf16 keeps fp32's exponent range, so there is no loss scaling
    and the state dict is the plain optimizer's; a checkpoint written under fp16 AMP (with a
    ``loss_scaler`` entry) resumes too. tools/train.py --amp selects this wrapper on the CPU.
    """

    def __init__(self, dtype='bfloat16', autocast_module='backbone', device_type=None, **kwargs):
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(f'BF16AmpOptimWrapper computes in bfloat16, got dtype={dtype!r}')
        super().__init__(**kwargs)
        self.cast_dtype = torch.bfloat16
        self.autocast_module = autocast_module
        self.device_type = device_type

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        state_dict.pop('loss_scaler', None)
        super().load_state_dict(state_dict)

    @contextmanager
    def optim_context(self, model):
        device_type = self.device_type or ('cuda' if next(model.parameters()).is_cuda else 'cpu')
        inner = model.module if is_model_wrapper(model) else model
        target = getattr(inner, self.autocast_module, None) if self.autocast_module else None
        with super().optim_context(model):
            if target is None:
                with torch.autocast(device_type, dtype=self.cast_dtype):
                    yield
            else:
                with autocast_module(target, device_type, self.cast_dtype):
                    yield
