"""mmpola.checkpoint.signatures: "is this file for this model" by key signatures, and what a file
looks like (the golden official files of every release, fragments, other libraries), and the
backbones' refusal of a file of another attention kind or architecture, naming what it looks like."""
import pytest
import torch

from mmpola.checkpoint import CheckpointMismatchError, describe_backbone, describe_checkpoint, identify, key_pattern
from mmpola.checkpoint.reading import safe_torch_load
from mmpola.models import (
    FLattenCSWin,
    FLattenPVT,
    FLattenPVTv2,
    FLattenSwin,
    InLineCSWin,
    InLineDeiT,
    InLinePVT,
    InLineSwin,
    PolaPP,
    PolaPVT,
    PolaSwin,
    PVTBackbone,
    SwinBackbone,
)
from tests.fixtures.backbones import MINI_CSWIN, MINI_PVT, MINI_SWIN

# golden official file -> (what it looks like, its release)
OFFICIAL = {
    'pola_pvt': ('Pola-PVT (type="PolaPVT")', 'PolaFormer PVT'),
    'pola_swin': ('Pola-Swin (type="PolaSwin")', 'PolaFormer Swin'),
    'flatten_pvt': ('FLatten-PVT (type="FLattenPVT")', 'FLatten Transformer PVT'),
    'flatten_swin': ('FLatten-Swin (type="FLattenSwin")', 'FLatten Transformer Swin'),
    'inline_pvt': ('InLine-PVT (type="InLinePVT")', 'InLine PVT'),
    'inline_swin': ('InLine-Swin (type="InLineSwin")', 'InLine Swin'),
    'polapp': ('PolaFormer++ (type="PolaPP")', 'PolaFormer++'),
}


def test_key_pattern():
    assert key_pattern('block12.3.attn.qg.weight') == 'block#.#.attn.qg.weight'
    assert key_pattern('layers.0.blocks.1.mlp.fc2.bias') == 'layers.#.blocks.#.mlp.fc#.bias'


@pytest.mark.parametrize('name', list(OFFICIAL))
def test_every_official_release_is_identified(data_file, name):
    keys = list(safe_torch_load(data_file(f'{name}_mini_official.pth'))['model'])
    found = identify(keys)
    assert (found.name, found.model.release) == OFFICIAL[name]
    assert describe_backbone(['backbone.' + k for k in keys]) == OFFICIAL[name][1]  # any prefix


def test_other_libraries_and_unknown_files():
    assert identify(['backbone.layers.0.0.projection.weight']).name.startswith('mmdet/mmseg PVT (not Pola')
    assert identify(['stages.0.blocks.0.attn.w_msa.qkv.weight']).name.startswith('mmdet/mmseg Swin (not Pola')
    assert identify(['encoder.weight']).name is None
    assert describe_checkpoint({'encoder.weight': torch.zeros(1)}).startswith('a checkpoint of an unknown model')


def test_check_takes_the_models_own_files_and_refuses_others():
    tiny = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])
    with torch.device('meta'):
        model = PolaPVT(arch=tiny, out_norm=True)
        deeper = PolaPVT(arch=dict(tiny, depths=[2, 3, 2, 1]))
        flatten = PolaPVT(arch=tiny, attn=dict(type='flatten'))
        swin = SwinBackbone(arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8]), attn='pola')
        polapp = PolaPP(arch='b0')
    signature = model.checkpoint_signature()
    # the patterns do not tell the depth; the blocks do (a deeper file loads only on purpose)
    signature.check(deeper.state_dict(), 'a deeper file', layout=False)
    with pytest.raises(CheckpointMismatchError, match=r'the file holds Pola-PVT: 2-3-2-1 blocks, the model is '
                                                      r'Pola-PVT: 1-1-1-1 blocks.*on purpose: strict=False'):
        signature.check(deeper.state_dict(), 'a deeper file')
    signature.check([k for k in model.state_dict() if not k.startswith('norm')], 'no output norms')
    with pytest.raises(CheckpointMismatchError, match=r"none of the Pola attention weights of PolaPVT .*it looks "
                                                      r"like a FLatten-PVT checkpoint.*build type='FLattenPVT'"):
        signature.check(flatten.state_dict(), 'f.pth')
    with pytest.raises(CheckpointMismatchError, match=r'not a Pola-PVT checkpoint.*Pola-Swin \(type="PolaSwin"\)'):
        signature.check(swin.state_dict(), 's.pth')
    with pytest.raises(CheckpointMismatchError, match=r'looks like a PolaFormer\+\+ \(type="PolaPP"\) checkpoint'):
        signature.check(polapp.state_dict(), 'p.pth')


# checkpoint of another kind -> (model, message naming what the checkpoint looks like)
CROSS_KIND = [
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


@pytest.mark.parametrize('cls,ckpt,match', CROSS_KIND, ids=lambda v: getattr(v, '__name__', str(v))[:12])
def test_checkpoint_of_another_kind_is_refused(data_file, cls, ckpt, match):
    kwargs = dict(arch=MINI_PVT) if issubclass(cls, PVTBackbone) else dict(arch=MINI_SWIN)
    model = cls(**kwargs, init_cfg=dict(type='Pretrained', checkpoint=data_file(f'{ckpt}_mini_official.pth')))
    with pytest.raises(CheckpointMismatchError, match=match):
        model.init_weights()


# a file of another architecture or kind -> (model, message naming what the file looks like)
CROSS_ARCHITECTURE = [
    (FLattenPVT, dict(arch=MINI_PVT), 'flatten_pvt_v2',
     r'not a FLatten-PVT checkpoint: its keys fit FLatten-PVTv2 better.*build type=\'FLattenPVTv2\''),
    (FLattenPVTv2, dict(arch=MINI_PVT), 'flatten_pvt', r'its keys fit FLatten-PVT better than FLattenPVTv2'),
    (InLineCSWin, dict(arch=MINI_CSWIN), 'flatten_cswin',
     r"none of the InLine attention weights of InLineCSWin.*FLatten-CSWin checkpoint.*build type='FLattenCSWin'"),
    (FLattenCSWin, dict(arch=MINI_CSWIN), 'inline_cswin', r'none of the FLatten attention weights.*InLine-CSWin'),
    (InLineDeiT, dict(arch=dict(embed_dims=64, depth=3, num_heads=2, img_size=224)), 'flatten_cswin',
     r'no key matching InLineDeiT.*looks like a FLatten-CSWin'),
]


@pytest.mark.parametrize('cls,kwargs,ckpt,match', CROSS_ARCHITECTURE,
                         ids=[f'{c[0].__name__}-{c[2]}' for c in CROSS_ARCHITECTURE])
def test_checkpoint_of_another_architecture_or_kind_is_refused(data_file, cls, kwargs, ckpt, match):
    stem = f'{ckpt}_mini' if ckpt != 'inline_deit' else ckpt
    model = cls(**kwargs, init_cfg=dict(type='Pretrained', checkpoint=data_file(f'{stem}_official.pth')))
    with pytest.raises(CheckpointMismatchError, match=match):
        model.init_weights()


@pytest.mark.parametrize('name,release', [('flatten_pvt_v2_mini', 'FLatten Transformer PVTv2'),
                                          ('flatten_cswin_mini', 'FLatten Transformer CSWin'),
                                          ('inline_cswin_mini', 'InLine CSWin'),
                                          ('inline_deit_mini_224', 'InLine DeiT')])
def test_files_are_named_by_their_family(data_file, name, release):
    described = describe_checkpoint(safe_torch_load(data_file(f'{name}_official.pth')))
    assert described == f'an official classification checkpoint, 10-class head ({release})'

