"""The presets (mmpola.models.backbones.presets) FLattenPVT / FLattenSwin / InLinePVT / InLineSwin as dense
backbones: any input size, gradients, bf16 autocast, freezing, checkpointing, registries, and the released
defaults each preset sets (checkpoints of another kind: tests/checkpoint/test_signatures.py)."""
import copy

import pytest
import torch

from mmpola.models import FLattenPVT, FLattenSwin, InLinePVT, InLineSwin, PVTBackbone
from tests.fixtures.backbones import MINI_PVT, MINI_SWIN, expected_stage_sizes

NEW = {'FLattenPVT': (FLattenPVT, dict(arch=MINI_PVT)), 'InLinePVT': (InLinePVT, dict(arch=MINI_PVT)),
       'FLattenSwin': (FLattenSwin, dict(arch=MINI_SWIN)), 'InLineSwin': (InLineSwin, dict(arch=MINI_SWIN))}
SIZES = [(800, 1216), (513, 677), (32, 480)]


@pytest.mark.parametrize('size', SIZES, ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('name', list(NEW))
def test_any_input_size(name, size):
    cls, kwargs = NEW[name]
    torch.manual_seed(0)
    model = cls(**kwargs).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    family = 'pvt' if issubclass(cls, PVTBackbone) else 'swin'
    assert [tuple(o.shape[-2:]) for o in outs] == expected_stage_sizes(family, *size)
    assert [o.shape[1] for o in outs] == model.embed_dims
    assert all(torch.isfinite(o).all() and o.is_contiguous() for o in outs)


@pytest.mark.parametrize('name', list(NEW))
def test_backward_reaches_every_parameter(name):
    cls, kwargs = NEW[name]
    model = cls(**kwargs, drop_path_rate=0.1).train()
    outs = model(torch.randn(2, 3, 64, 96))
    sum(o.float().pow(2).mean() for o in outs).backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f'parameters without gradient (DDP would fail): {no_grad}'
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('name', list(NEW))
def test_bf16_autocast_forward_backward_800x1216(name):
    cls, kwargs = NEW[name]
    torch.manual_seed(0)
    model = cls(**kwargs, drop_path_rate=0.).train()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, 800, 1216))
    assert all(torch.isfinite(o).all() for o in outs)
    sum(o.float().square().mean() for o in outs).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('name', list(NEW))
def test_frozen_stages_and_with_cp(name):
    cls, kwargs = NEW[name]
    torch.manual_seed(0)
    model = cls(**kwargs, frozen_stages=1, drop_path_rate=0.)
    ckpt = copy.deepcopy(model)
    ckpt.with_cp = True
    x = torch.randn(1, 3, 64, 64)
    for m in (model, ckpt):
        m.train()
        sum(o.sum() for o in m(x)).backward()
    stage0 = model.block1 if isinstance(model, PVTBackbone) else model.layers[0]
    assert not stage0.training and not any(p.requires_grad for p in stage0.parameters())
    for (n, a), (_, b) in zip(model.named_parameters(), ckpt.named_parameters()):
        if a.requires_grad:
            assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), n


@pytest.mark.downstream
@pytest.mark.parametrize('registry_module', ['mmdet.registry', 'mmseg.registry'])
def test_builds_from_downstream_registries(registry_module):
    import importlib
    registry = importlib.import_module(registry_module).MODELS
    for name, (cls, kwargs) in NEW.items():
        assert type(registry.build(dict(type=name, **kwargs))) is cls


def test_released_defaults():
    with torch.device('meta'):
        assert InLinePVT().num_heads == [2, 4, 10, 16] and InLinePVT().attn_type == 'IIII'
        assert FLattenPVT().attn_type == 'LLLL' and FLattenSwin().attn_type == 'LLSS'
        assert InLineSwin().attn_type == 'IIIS' and InLineSwin(pretrain_img_size=384).softmax_window_size == 12
        assert InLineSwin(window_size=64).softmax_window_size == 8  # max(7, 64 // 8), the InLine rule
        assert FLattenSwin(window_size=64).softmax_window_size == 12
    with pytest.raises(ValueError, match='InLine attention has no spatial reduction'):
        InLinePVT(arch=MINI_PVT, la_sr_ratios='8421')
    with pytest.raises(ValueError, match='stage chars must be I, S or M'):
        InLineSwin(arch=MINI_SWIN, attn_type='LLSS')
