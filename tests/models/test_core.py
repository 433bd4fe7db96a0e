"""The shared backbone core (mmpola.models.base) and the attention-kind table."""
import pytest
import torch

from mmpola.models import ATTENTION_KINDS, DenseBackbone, PolaPVT, PolaSwin
from mmpola.models.attention_kinds import build_attention, identify_attention_kind, kinds_in_state_dict
from mmpola.models.base import drop_path_rates, tokens_to_nchw
from mmpola.models.utils import PolaConfigError

TINY_PVT = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])
TINY_SWIN = dict(embed_dims=16, depths=[1, 2, 2, 2], num_heads=[1, 2, 4, 8])


def test_families_share_the_core():
    assert issubclass(PolaPVT, DenseBackbone) and issubclass(PolaSwin, DenseBackbone)
    for name in ('init_weights', 'set_attn_impl', 'train', 'forward', 'forward_stages', '_freeze_stages'):
        assert name not in vars(PolaPVT) and name not in vars(PolaSwin), name


def test_out_norm_is_one_option_with_a_deprecated_alias():
    with pytest.warns(DeprecationWarning, match='norm_after_stage is deprecated; use out_norm'):
        old = PolaPVT(arch=TINY_PVT, norm_after_stage=True)
    new = PolaPVT(arch=TINY_PVT, out_norm=True)
    assert old.out_norm and new.out_norm and old.norm_after_stage
    assert sorted(old.state_dict()) == sorted(new.state_dict())
    assert new.norm0.eps == 1e-6 and PolaSwin(arch=TINY_SWIN).norm0.eps == 1e-5
    with pytest.warns(DeprecationWarning):
        swin = PolaSwin(arch=TINY_SWIN, norm_after_stage=False)
    assert not swin.out_norm and not hasattr(swin, 'norm0')
    with pytest.raises(PolaConfigError, match='disagree'):
        PolaPVT(arch=TINY_PVT, out_norm=False, norm_after_stage=True)


def test_attention_kind_options_and_impl_are_checked():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'focusing_factor' .*the Pola attention options"):
        PolaPVT(arch=TINY_PVT, focusing_factor=3)
    model = PolaSwin(arch=TINY_SWIN)
    with pytest.raises(PolaConfigError, match='attn_impl must be one of'):
        model.set_attn_impl('fastest')
    model.set_attn_impl('reference')
    assert all(m.attn_impl == 'reference' for m in model.modules() if hasattr(m, 'attn_impl'))


@pytest.mark.parametrize('layout', ['pvt', 'swin'])
def test_every_kind_is_identified_by_its_parameter_names(layout):
    for name, kind in ATTENTION_KINDS.items():
        if layout not in kind.layouts:
            continue
        module = build_attention(name, layout, 16, 2, pe_grid=(4, 4), window_size=4)
        assert identify_attention_kind(module.state_dict()) == (name, layout)
        if layout == 'pvt' and name != 'inline':  # spatial reduction and no biases do not change the kind
            reduced = build_attention(name, layout, 16, 2, pe_grid=(2, 2), sr_ratio=2, qkv_bias=False)
            assert identify_attention_kind(reduced.state_dict()) == (name, layout)


def test_kinds_of_a_backbone_state_dict():
    kinds = kinds_in_state_dict(PolaSwin(arch=TINY_SWIN).state_dict())
    assert kinds['layers.0.blocks.0.attn.'] == ('pola', 'swin')
    assert kinds['layers.3.blocks.1.attn.'] == ('softmax', 'swin')


def test_helpers():
    rates = drop_path_rates(0.3, [1, 2, 1])
    assert [len(r) for r in rates] == [1, 2, 1] and rates[0] == [0.0] and rates[-1][-1] == pytest.approx(0.3)
    tokens = torch.arange(24.).reshape(1, 6, 4)
    assert torch.equal(tokens_to_nchw(tokens, (2, 3))[0, :, 1, 2], tokens[0, 5])
