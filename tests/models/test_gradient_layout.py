"""Every parameter's gradient has the parameter's own strides, the layout DDP's gradient buckets take
(otherwise DDP warns "Grad strides do not match bucket view strides" and copies the gradient on
every backward): the depthwise convolutions give their weight's gradient contiguous strides whatever their
input's layout (mmpola.models.layers.DepthwiseConv2d); on the Triton paths too (tests/models/test_triton_paths.py)."""
import socket
import warnings

import pytest
import torch
import torch.distributed as dist

from mmpola.models import PolaPP
from tests.fixtures.backbones import FAMILY_MODELS, FAMILY_POLAPP, build_family_model


def _backward(model, x):
    sum(o.square().mean() for o in model(x)).backward()


@pytest.mark.parametrize('name', list(FAMILY_MODELS))
def test_gradients_have_the_parameters_strides(name):
    torch.manual_seed(0)
    model = build_family_model(name).train()
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
        ddp = torch.nn.parallel.DistributedDataParallel(PolaPP(arch=FAMILY_POLAPP).train())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            for _ in range(2):
                _backward(ddp, torch.randn(1, 3, 64, 64))
        assert not [w for w in caught if 'strides do not match' in str(w.message)]
    finally:
        dist.destroy_process_group()
