"""FLattenPVT / FLattenSwin / InLinePVT / InLineSwin as dense backbones: any input size, gradients,
bf16 autocast, freezing, checkpointing, registries, and checkpoints of another attention kind
refused at init_weights naming the kind they look like."""
import copy

import pytest
import torch

from mmpola.checkpoint import CheckpointMismatchError
from mmpola.models import FLattenPVT, FLattenSwin, InLinePVT, InLineSwin, PolaPVT, PolaSwin, PVTBackbone

# the golden mini architectures (tests/data/*_mini_official.pth)
MINI_PVT = dict(arch=dict(embed_dims=[16, 32, 80, 128], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                          depths=[1, 1, 2, 1]))
MINI_SWIN = dict(arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]))
NEW = {'FLattenPVT': (FLattenPVT, MINI_PVT), 'InLinePVT': (InLinePVT, MINI_PVT),
       'FLattenSwin': (FLattenSwin, MINI_SWIN), 'InLineSwin': (InLineSwin, MINI_SWIN)}
SIZES = [(800, 1216), (513, 677), (32, 480)]


def _expected_sizes(pvt, h, w):
    out = []
    h, w = (h // 4, w // 4) if pvt else (-(-h // 4), -(-w // 4))
    for _ in range(4):
        out.append((h, w))
        h, w = (h // 2, w // 2) if pvt else (-(-h // 2), -(-w // 2))
    return out


@pytest.mark.parametrize('size', SIZES, ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('name', list(NEW))
def test_any_input_size(name, size):
    cls, kwargs = NEW[name]
    torch.manual_seed(0)
    model = cls(**kwargs).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    assert [tuple(o.shape[-2:]) for o in outs] == _expected_sizes(issubclass(cls, PVTBackbone), *size)
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
        InLinePVT(arch=MINI_PVT['arch'], la_sr_ratios='8421')
    with pytest.raises(ValueError, match='stage chars must be I, S or M'):
        InLineSwin(arch=MINI_SWIN['arch'], attn_type='LLSS')


# checkpoint of another kind -> (model, message naming what the checkpoint looks like)
CROSS = [
    (FLattenPVT, 'pola_pvt', r"none of the FLatten attention weights of FLattenPVT.*looks like a Pola-PVT "
                             r"checkpoint.*build type='PolaPVT'"),
    (InLinePVT, 'flatten_pvt', r"none of the InLine attention weights of InLinePVT.*FLatten-PVT"),
    (PolaPVT, 'inline_pvt', r"none of the Pola attention weights of PolaPVT.*InLine-PVT"),
    (PolaPVT, 'flatten_pvt', r"none of the Pola attention weights of PolaPVT.*FLatten-PVT"),
    (FLattenSwin, 'inline_swin', r"none of the FLatten attention weights of FLattenSwin.*InLine-Swin"),
    (InLineSwin, 'pola_swin', r"none of the InLine attention weights of InLineSwin.*Pola-Swin"),
    (PolaSwin, 'flatten_swin', r"none of the Pola attention weights of PolaSwin.*FLatten-Swin"),
    (FLattenPVT, 'flatten_swin', r'no key matching FLattenPVT.*FLatten-Swin \(type="FLattenSwin"\)'),
]


@pytest.mark.parametrize('cls,ckpt,match', CROSS, ids=lambda v: getattr(v, '__name__', str(v))[:12])
def test_checkpoint_of_another_kind_is_refused(data_file, cls, ckpt, match):
    kwargs = MINI_PVT if issubclass(cls, PVTBackbone) else MINI_SWIN
    model = cls(**kwargs, init_cfg=dict(type='Pretrained', checkpoint=data_file(f'{ckpt}_mini_official.pth')))
    with pytest.raises(CheckpointMismatchError, match=match):
        model.init_weights()
