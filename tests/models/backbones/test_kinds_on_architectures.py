"""Every attention kind on every macro architecture by one config word: Pola, FLatten, InLine and the
architecture's softmax on PVT, PVTv2, Swin, CSWin and the ViT, built from ``attn=dict(type=...)`` (the
softmax: ``attn_type`` of 'S'), forward and backward at an odd, non-square size with a gradient for
every parameter, and a finite bf16 autocast pass."""
import pytest
import torch

from mmpola.models.backbones import kinds_on_every_architecture
from mmpola.registry import ARCHITECTURES
from tests.fixtures.backbones import TINY_CSWIN, TINY_PVT, TINY_SWIN, TINY_VIT

TINY = {'pvt': TINY_PVT, 'pvt_v2': TINY_PVT, 'swin': TINY_SWIN, 'cswin': TINY_CSWIN, 'vit': TINY_VIT}
# every registered kind that every architecture takes (Pola, FLatten, InLine ...), and each one's softmax
KINDS = kinds_on_every_architecture() + ('softmax',)
SIZE = (67, 97)
# the maps of each architecture at 67 x 97 (strides 4-32; the ViT: its blocks at stride 16)
SIZES = {'pvt': [(16, 24), (8, 12), (4, 6), (2, 3)], 'pvt_v2': [(17, 25), (9, 13), (5, 7), (3, 4)],
         'swin': [(17, 25), (9, 13), (5, 7), (3, 4)], 'cswin': [(17, 24), (9, 12), (5, 6), (3, 3)],
         'vit': [(5, 7)] * 4}


def _build(family, kind):
    """``family`` with ``kind``: one word of the config (``attn=dict(type=kind)``; the architecture's
    softmax by its letter 'S')."""
    arch = ARCHITECTURES.get(family)
    if kind == 'softmax':
        return arch(arch=TINY[family], attn_type='S' * (1 if family == 'vit' else 4))
    return arch(arch=TINY[family], attn=dict(type=kind))


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('family', list(TINY))
def test_kind_runs_forward_and_backward_at_an_odd_size(family, kind):
    torch.manual_seed(0)
    model = _build(family, kind).train()
    expected_kind = model.softmax_attn if kind == 'softmax' else kind
    assert {k for stage in model.block_kinds for k in stage} == {expected_kind}
    outs = model(torch.randn(2, 3, *SIZE))
    assert [tuple(o.shape[-2:]) for o in outs] == SIZES[family]
    assert [o.shape[1] for o in outs] == model.out_channels
    sum(o.square().mean() for o in outs).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f'parameters without gradient (DDP would fail): {missing}'
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())

    model.zero_grad()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, *SIZE))
    assert all(torch.isfinite(o).all() for o in outs)
    sum(o.float().square().mean() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('family', list(TINY))
def test_kind_runs_on_the_meta_device(family, kind):
    """Shapes without data (torch's meta device: what shape inference and deferred initialisation use): the
    model's forward and backward run there, and the maps have the sizes they have on the CPU."""
    model = _build(family, kind).to('meta').train()
    outs = model(torch.empty(2, 3, *SIZE, device='meta'))
    assert [tuple(o.shape[-2:]) for o in outs] == SIZES[family]
    assert all(o.is_meta for o in outs)
    sum(o.float().mean() for o in outs).backward()
    assert all(p.grad is not None and p.grad.is_meta for p in model.parameters() if p.requires_grad)
