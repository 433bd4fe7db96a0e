"""Every parameter's gradient has the parameter's own strides, the layout DDP's gradient buckets take
(otherwise DDP warns "Grad strides do not match bucket view strides" and copies the gradient on
every backward): the depthwise convolutions give their weight's gradient contiguous strides whatever their
input's layout (mmpola.models.layers.DepthwiseConv2d), on the library convolution and on the Triton kernels
(MMPOLA_DEPTHWISE_CONV=triton, through Triton's interpreter without a GPU), which give the same outputs and
gradients; so do the linear layers that recompute their input (MMPOLA_RECOMPUTE=triton)."""
import socket
import warnings

import pytest
import torch
import torch.distributed as dist

from mmpola.models import FLattenCSWin, FLattenPVTv2, FLattenSwin, InLinePVT, PolaPP, PolaPVT, PolaSwin, PVTv2Backbone
from tests.fixtures.backbones import TINY_PVT
from tests.fixtures.ops import relative_error

TINY_SWIN = dict(embed_dims=16, depths=[1, 2, 1, 2], num_heads=[1, 2, 4, 8])
TINY_CSWIN = dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], split_size=[1, 2, 7, 7])
TINY_POLAPP = dict(embed_dims=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], mlp_ratios=[2] * 4,
                   layer_scale_init_values=[1.0] * 4)
MODELS = {'PolaPVT': (PolaPVT, TINY_PVT), 'InLinePVT': (InLinePVT, TINY_PVT), 'PolaSwin': (PolaSwin, TINY_SWIN),
          'FLattenSwin': (FLattenSwin, TINY_SWIN), 'PolaPP': (PolaPP, TINY_POLAPP),
          'FLattenPVTv2': (FLattenPVTv2, TINY_PVT), 'PVTv2-softmax': (PVTv2Backbone, dict(TINY_PVT, attn_type='SSSS')),
          # the block's LePE on the values' view in the projection (linear stages), the stripes' own (softmax)
          'FLattenCSWin': (FLattenCSWin, dict(TINY_CSWIN, attn_type='LLSS'))}


def _backward(model, x):
    sum(o.square().mean() for o in model(x)).backward()


@pytest.mark.parametrize('name', list(MODELS))
def test_gradients_have_the_parameters_strides(name):
    cls, arch = MODELS[name]
    torch.manual_seed(0)
    arch = dict(arch)
    extra = {'attn_type': arch.pop('attn_type')} if 'attn_type' in arch else {}
    model = cls(arch=arch, **extra).train()
    _backward(model, torch.randn(2, 3, 64, 96))
    mismatched = {n: (tuple(p.stride()), tuple(p.grad.stride())) for n, p in model.named_parameters()
                  if p.grad is not None and p.grad.stride() != p.stride()}
    assert mismatched == {}
    dwc = model.layers[0].blocks[0].attn.lepe.weight if name == 'PolaPP' else None
    assert dwc is None or (dwc.is_contiguous() and dwc.is_contiguous(memory_format=torch.channels_last))


def test_ddp_does_not_warn_about_gradient_strides():
    """A real DDP (gloo, one process): two backward passes without the warning."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(PolaPP(arch=TINY_POLAPP).train())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            for _ in range(2):
                _backward(ddp, torch.randn(1, 3, 64, 64))
        assert not [w for w in caught if 'strides do not match' in str(w.message)]
    finally:
        dist.destroy_process_group()


# InLine: kernels per image
FAMILIES = ['PolaPVT', 'PolaSwin', 'PolaPP', 'FLattenPVTv2', 'PVTv2-softmax', 'InLinePVT', 'FLattenCSWin']


def _run(cls, arch, extra):
    torch.manual_seed(0)
    model = cls(arch=arch, **extra).train()
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    outs = model(x)
    g = torch.Generator().manual_seed(2)  # a random projection: the outputs' normalised squares are constant
    sum((o * torch.randn(o.shape, generator=g)).mean() for o in outs).backward()
    return [o.detach() for o in outs], {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, model


@pytest.mark.parametrize('variable', ['MMPOLA_DEPTHWISE_CONV', 'MMPOLA_RECOMPUTE'])
@pytest.mark.parametrize('name', FAMILIES)
def test_triton_paths_in_the_models(name, variable, monkeypatch):
    """The Triton depthwise convolution, or the linear layers that recompute their input (the MLPs' fc2, the
    gated attentions' proj), against the library's path: outputs, gradients, and the gradients' strides."""
    cls, arch = MODELS[name]
    arch = dict(arch)
    extra = {'attn_type': arch.pop('attn_type')} if 'attn_type' in arch else {}
    monkeypatch.delenv(variable, raising=False)
    outs, grads, _ = _run(cls, arch, extra)
    monkeypatch.setenv(variable, 'triton')
    triton_outs, triton_grads, model = _run(cls, arch, extra)
    for a, e in zip(triton_outs, outs):
        assert relative_error(a, e) <= 1e-5
    assert set(triton_grads) == set(grads)
    # relative to each gradient's largest value, or to a hundredth of the model's largest gradient for the
    # gradients that are zero up to rounding (the biases of convolutions followed by a normalisation)
    floor = 1e-2 * max(g.abs().max().item() for g in grads.values())
    errors = {n: (triton_grads[n] - g).abs().max().item() / max(g.abs().max().item(), floor) for n, g in grads.items()}
    assert max(errors.values()) <= 1e-4, max(errors.items(), key=lambda item: item[1])
    params = dict(model.named_parameters())
    assert {n for n, g in triton_grads.items() if g.stride() != params[n].stride()} == set()
