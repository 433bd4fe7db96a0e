"""mmpola.checkpoint.signatures: "is this file for this model" by key signatures, and what a file
looks like (the golden official files of every release, fragments, other libraries)."""
import pytest
import torch

from mmpola.checkpoint import CheckpointMismatchError, describe_backbone, describe_checkpoint, identify, key_pattern
from mmpola.checkpoint.reading import safe_torch_load
from mmpola.models import PolaPP, PolaPVT, SwinBackbone

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
