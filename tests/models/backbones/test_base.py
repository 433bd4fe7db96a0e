"""The shared backbone contract (mmpola.models.backbones.base): one core for every architecture, the
attention chosen by ``attn`` and ``attn_type``, presets that only set defaults."""
import pytest
import torch

from mmpola.checkpoint import identify
from mmpola.models import (
    CSWinBackbone,
    DenseBackbone,
    PolaPP,
    PolaPPBackbone,
    PolaPVT,
    PolaSwin,
    PVTBackbone,
    PVTv2Backbone,
    SwinBackbone,
    ViTBackbone,
)
from mmpola.models.attention import attention_letter, registered_attention_kinds
from mmpola.models.backbones import drop_path_rates, parse_attn_type, tokens_to_nchw
from mmpola.models.checks import PolaConfigError
from mmpola.registry import ARCHITECTURES

TINY_PVT = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])
TINY_SWIN = dict(embed_dims=16, depths=[1, 2, 2, 2], num_heads=[1, 2, 4, 8])
TINY_POLAPP = dict(embed_dims=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], mlp_ratios=[2] * 4,
                   layer_scale_init_values=[1.0] * 4)
TINY = {'pvt': TINY_PVT, 'swin': TINY_SWIN, 'polapp': TINY_POLAPP, 'pvt_v2': TINY_PVT,
        'cswin': dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[2, 2, 4, 8], split_size=[1, 2, 7, 7]),
        'vit': dict(embed_dims=32, depth=4, num_heads=2, img_size=64)}


def test_families_share_the_core():
    for cls in (PolaPVT, PolaSwin, PolaPP):
        assert issubclass(cls, DenseBackbone)
        for name in ('init_weights', 'set_attn_impl', 'train', 'forward', 'forward_stages', '_freeze_stages'):
            assert name not in vars(PolaPVT) and name not in vars(PolaSwin), name
    # one class per macro architecture; the released models are presets of them
    assert dict(ARCHITECTURES.module_dict) == {'pvt': PVTBackbone, 'swin': SwinBackbone, 'polapp': PolaPPBackbone,
                                               'pvt_v2': PVTv2Backbone, 'cswin': CSWinBackbone, 'vit': ViTBackbone}
    for preset, arch in ((PolaPVT, PVTBackbone), (PolaSwin, SwinBackbone), (PolaPP, PolaPPBackbone)):
        assert preset.__bases__ == (arch,) and '__init__' not in vars(preset)


def test_out_norm_adds_the_output_norms():
    new = PolaPVT(arch=TINY_PVT, out_norm=True)
    assert new.out_norm and not PolaPVT(arch=TINY_PVT).out_norm
    assert new.norm0.eps == 1e-6 and PolaSwin(arch=TINY_SWIN).norm0.eps == 1e-5
    swin = PolaSwin(arch=TINY_SWIN, out_norm=False)
    assert not swin.out_norm and not hasattr(swin, 'norm0')


def test_attention_kind_options_and_impl_are_checked():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'focusing_factor' .*the Pola attention options"):
        PolaPVT(arch=TINY_PVT, focusing_factor=3)
    with pytest.raises(PolaConfigError, match=r"Pola attention \(type='pola'\) has no option 'focusing_factor'; its "
                                              r"options: alpha=4.0, kernel_size=5, v_upsample='linear1d'"):
        PolaPVT(arch=TINY_PVT, attn=dict(focusing_factor=3))
    with pytest.raises(PolaConfigError, match=r"unknown attention kind 'polar'; registered: .*pola"):
        PVTBackbone(arch=TINY_PVT, attn=dict(type='polar'))
    with pytest.raises(PolaConfigError, match='option sr_ratio=2 is set by the backbone'):
        PolaPVT(arch=TINY_PVT, attn=dict(sr_ratio=2))
    model = PolaSwin(arch=TINY_SWIN)
    with pytest.raises(PolaConfigError, match='attn_impl must be one of'):
        model.set_attn_impl('fastest')
    model.set_attn_impl('reference')
    assert all(m.attn_impl == 'reference' for m in model.modules() if hasattr(m, 'attn_impl'))


def test_attention_options_go_in_attn():
    model = PolaPVT(arch=TINY_PVT, attn=dict(type='pola', alpha=3.0, kernel_size=3))
    assert model.attn_cfg == dict(type='pola', alpha=3.0, kernel_size=3)
    attn = model.block1[0].attn
    assert attn.alpha == 3.0 and attn.dwc.kernel_size == (3, 3)
    with pytest.raises(TypeError, match=r"argument 'alpha' \(unknown: alpha, kernel_size; .*pass them as attn=dict"):
        PolaPVT(arch=TINY_PVT, alpha=3.0, kernel_size=3)
    assert PolaPVT(arch=TINY_PVT, attn=dict(alpha=2.0)).attn_cfg == dict(type='pola', alpha=2.0)  # the preset's type


def test_attn_type_letters_pick_the_kinds():
    """The configured kind's letter, 'S' the architecture's softmax, 'M' mixed stages (first k blocks)."""
    model = PVTBackbone(arch=dict(TINY_PVT, depths=[1, 1, 3, 1]), attn=dict(type='flatten'), attn_type='LSMS2')
    assert model.block_kinds == [['flatten'], ['softmax'], ['flatten', 'flatten', 'softmax'], ['softmax']]
    assert [type(b.attn).__name__ for b in model.block3] == ['FocusedLinearAttention'] * 2 + \
        ['SpatialReductionAttention']
    inline = SwinBackbone(arch=TINY_SWIN, attn='inline')  # every stage the kind unless attn_type says
    assert inline.attn_type == 'IIII' and inline.block_kinds[3] == ['inline', 'inline']
    assert PolaPP(arch=TINY_POLAPP).block_kinds == [['pacs'], ['pacs'], ['rope_softmax'], ['rope_softmax']]
    with pytest.raises(PolaConfigError, match="uses the letter 'L' but no attention kind is configured"):
        PVTBackbone(arch=TINY_PVT, attn_type='LLSS')
    softmax = PVTBackbone(arch=TINY_PVT, attn_type='SSSS')
    assert softmax.attn_kind is None and {k for s in softmax.block_kinds for k in s} == {'softmax'}
    assert parse_attn_type('IIMS3', [1, 1, 4, 1], 'I')[2] == ['I', 'I', 'I', 'S']
    with pytest.raises(PolaConfigError, match='stage chars must be I, S or M'):
        parse_attn_type('LLSS', [1, 1, 1, 1], 'I')


@pytest.mark.parametrize('family', list(TINY))
def test_every_kind_runs_on_every_architecture_and_is_identified_by_its_keys(family):
    """Any registered kind in any architecture: built by config, runs, and a state dict of it is
    recognised as that architecture with that kind (what the checkpoint messages rely on)."""
    arch = ARCHITECTURES.get(family)
    x = torch.randn(1, 3, 64, 64)
    for kind in filter(arch.accepts_kind, registered_attention_kinds()):
        with torch.device('meta'):
            model = arch(arch=TINY[family], attn=dict(type=kind), attn_type=attention_letter(kind) * 4)
        found = identify(model.state_dict())
        assert (found.model.family, found.model.kind) == (family, kind), kind
        if family == 'pvt' and kind not in ('inline', 'rope_softmax', 'pacs', 'window_softmax'):
            # spatial reduction and no biases do not change what a file looks like
            with torch.device('meta'):
                reduced = arch(arch=TINY[family], attn=dict(type=kind), attn_type=attention_letter(kind) * 4,
                               la_sr_ratios='2211', sr_ratios=(2, 2, 1, 1), qkv_bias=False)
            assert identify(reduced.state_dict()).model.kind == kind
    model = arch(arch=TINY[family], attn=dict(type='pola'), attn_type='LLLL').eval()
    with torch.no_grad():
        assert [o.shape[1] for o in model(x)] == model.embed_dims


def test_kinds_of_a_backbone_state_dict():
    signature = PolaSwin(arch=TINY_SWIN).checkpoint_signature()
    assert set(signature.kinds) == {'pola', 'window_softmax'}
    assert signature.examples['pola'].startswith('layers.0.blocks.0.attn.')
    assert signature.attention_prefixes == {'layers.#.blocks.#.attn.'}
    assert not any('norm0' in p for p in signature.structure)  # dense-only output norms are not in files


def test_helpers():
    rates = drop_path_rates(0.3, [1, 2, 1])
    assert [len(r) for r in rates] == [1, 2, 1] and rates[0] == [0.0] and rates[-1][-1] == pytest.approx(0.3)
    tokens = torch.arange(24.).reshape(1, 6, 4)
    assert torch.equal(tokens_to_nchw(tokens, (2, 3))[0, :, 1, 2], tokens[0, 5])


def test_a_misspelled_pretrained_init_cfg_key_is_refused_not_ignored(tmp_path):
    source = PolaPVT(arch=TINY_PVT)
    path = tmp_path / 'tiny.pth'
    torch.save(source.state_dict(), path)
    model = PolaPVT(arch=TINY_PVT, init_cfg=dict(type='Pretrained', checkpoint=str(path), strickt=True))
    with pytest.raises(PolaConfigError, match=r"PolaPVT: init_cfg=dict\(type='Pretrained', \.\.\.\) has unknown "
                       r"key\(s\) 'strickt' \(did you mean 'strict'\?\); its keys are type, checkpoint"):
        model.init_weights()
    with pytest.raises(PolaConfigError, match=r"'checkpiont' \(did you mean 'checkpoint'\?\)"):
        PolaPVT(arch=TINY_PVT, init_cfg=dict(type='Pretrained', checkpiont=str(path))).init_weights()
    with pytest.raises(PolaConfigError, match='names no checkpoint; add checkpoint=PATH_OR_URL'):
        PolaPVT(arch=TINY_PVT, init_cfg=dict(type='Pretrained')).init_weights()
    model = PolaPVT(arch=TINY_PVT, init_cfg=dict(type='Pretrained', checkpoint=str(path), strict=True))
    model.init_weights()  # every known key is taken
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))
