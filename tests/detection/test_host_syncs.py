"""A Pola detector's training iteration waits for the device only where it must, and the backbones of
every kind never do.

On a GPU every read of a tensor's value on the host (``.item()``, ``bool(tensor)``, ``.tolist()``,
``.cpu()``, ``nonzero`` ...) waits until the device has run everything queued before it, so the host
stops queueing work. mmdet's own heads and assigners have such reads; mmpola's code (the backbone, its
attention, the hooks of configs/_base_/runtime.py) has one per iteration: NonFiniteLossHook reads its
finiteness flag just before the optimizer step. Found on the CPU with torch.profiler (with the Python
stack of every op) and a torch function mode (host reads that dispatch no op on the CPU).
"""
import copy
import logging
import os.path as osp
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

import mmpola
from tests.fixtures.detection import build_detector, load_config, num_classes
from tests.fixtures.paths import REPO
from tests.fixtures.tools import load_tool

MMPOLA = osp.dirname(mmpola.__file__) + osp.sep  # mmpola's code, for the function mode
TORCH = osp.dirname(torch.__file__) + osp.sep
# ops that read a value on the host (on CUDA: a device sync), by the profiler's names
SYNC_OPS = {f'aten::{name}' for name in load_tool('benchmark_host').SYNC_OPS}
HOST_READS = {'item', 'tolist', 'cpu', 'numpy', '__bool__', '__int__', '__float__', '__index__', 'nonzero'}


def _mmpola_frame(event):
    """The innermost Python frame of mmpola's code above a profiler event (the profiler records
    frames as events named ``mmpola/.../file.py(line): function``), or None."""
    parent = event.cpu_parent
    while parent is not None:
        name = parent.name
        if '.py(' in name and (name.startswith('mmpola/') or f'{osp.sep}mmpola{osp.sep}' in name):
            return name
        parent = parent.cpu_parent
    return None


def _skip_without_python_frames(prof):
    """Skip the rest of a test whose profile ``prof`` holds no Python frame: torch 2.11's profiler recorded none
    on the CPU with ``with_stack=True`` (torch 2.13's does), so the search by frames would find nothing, whatever
    the code reads. What the function mode saw is checked before."""
    if not any('.py(' in event.name for event in prof.events()):
        pytest.skip(f"torch {torch.__version__}'s profiler recorded no Python frames (with_stack=True): the host "
                    'reads by the profile are not checked')


class HostReads(TorchFunctionMode):
    """Tensor-to-host reads called from mmpola's code: [(method, 'file:function')]."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, '__name__', '')
        if name in HOST_READS:
            import sys
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(TORCH):
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(MMPOLA):
                self.calls.append((name, f'{osp.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}'))
        return func(*args, **(kwargs or {}))


def _iteration(model, optim_wrapper, hooks, runner, data):
    """One training iteration as mmengine's loop runs it: the hooks, then train_step (preprocessor,
    forward, losses, backward, optimizer step)."""
    for hook in hooks:
        hook.before_train_iter(runner, 0, data)
    outputs = model.train_step(data, optim_wrapper)
    for hook in hooks:
        hook.after_train_iter(runner, 0, data, outputs)
    return outputs


def test_pola_detector_iteration_reads_the_device_once():
    from mmdet.testing import demo_mm_inputs
    from mmengine.optim import build_optim_wrapper

    from mmpola.runtime import NonFiniteLossHook, NonFinitePixelsHook
    cfg = load_config(osp.join(REPO, 'configs', 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py'))
    torch.manual_seed(0)
    model = build_detector(cfg).train()
    optim_wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    runner = SimpleNamespace(model=model, optim_wrapper=optim_wrapper, cfg=None, iter=0, max_iters=2, epoch=0,
                             logger=logging.getLogger(__name__))
    hooks = [NonFinitePixelsHook(), NonFiniteLossHook()]
    hooks[1].before_train(runner)

    def batch(shapes):
        return demo_mm_inputs(len(shapes), [[3, *s] for s in shapes], num_items=[3] * len(shapes),
                              num_classes=num_classes(cfg))

    _iteration(model, optim_wrapper, hooks, runner, batch([(64, 96), (64, 96)]))  # first-call work
    data = batch([(96, 64), (80, 64)])  # another size: nothing shape-dependent is reused
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof, HostReads() as reads:
        outputs = _iteration(model, optim_wrapper, hooks, runner, data)
    assert torch.isfinite(outputs['loss'])
    assert reads.calls == [('__bool__', 'nonfinite_loss.py:_decide')], reads.calls
    _skip_without_python_frames(prof)
    syncs = {}
    for event in prof.events():
        frame = _mmpola_frame(event) if event.name in SYNC_OPS else None
        if frame is not None:
            syncs.setdefault(frame.rsplit(osp.sep, 1)[-1], set()).add(event.name)
    # the one read: NonFiniteLossHook's flag, before the optimizer step (bool() -> is_nonzero -> item)
    assert len(syncs) == 1 and list(syncs)[0].endswith(': _decide'), syncs
    # mmdet's own reads are there too (its assigners, losses): the search sees them
    assert any(event.name in SYNC_OPS and not _mmpola_frame(event) for event in prof.events())


TINY_PVT = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])
TINY_SWIN = dict(embed_dims=16, depths=[1, 2, 1, 2], num_heads=[1, 2, 4, 8])
TINY_POLAPP = dict(embed_dims=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], mlp_ratios=[2] * 4,
                   layer_scale_init_values=[1.0] * 4)


@pytest.mark.parametrize('name,arch', [('PolaPVT', TINY_PVT), ('FLattenPVT', TINY_PVT), ('InLinePVT', TINY_PVT),
                                       ('PolaSwin', TINY_SWIN), ('PolaPP', TINY_POLAPP)])
def test_backbone_training_step_never_reads_the_device(name, arch):
    """Forward and backward of every kind's backbone in training mode, at a size whose positional
    encodings, RoPE tables and masks are made anew: no host read from mmpola's code."""
    from mmpola import models
    torch.manual_seed(0)
    model = getattr(models, name)(arch=arch).train()
    model(torch.randn(2, 3, 64, 96))  # first-call work at another size
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof, HostReads() as reads:
        sum(out.mean() for out in model(torch.randn(2, 3, 96, 64))).backward()
    assert reads.calls == []
    _skip_without_python_frames(prof)
    assert [(e.name, _mmpola_frame(e)) for e in prof.events() if e.name in SYNC_OPS and _mmpola_frame(e)] == []
