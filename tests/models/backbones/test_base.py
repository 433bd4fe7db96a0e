"""The shared backbone contract (mmpola.models.backbones.base): one core for every architecture, the
attention chosen by ``attn`` and ``attn_type``, presets that only set defaults; and the dense contract
of PVTv2, CSWin and the ViT (their presets FLatten-PVTv2, InLine-CSWin, InLine-DeiT): any input size
with the official size rules, freezing through the core's stem and stage parts, checkpointing,
registries, released defaults and configuration errors (PVT and Swin: test_dense_forward.py)."""
import copy
import importlib

import pytest
import torch

from mmpola.checkpoint import identify
from mmpola.models import (
    CSWinBackbone,
    DenseBackbone,
    FLattenCSWin,
    FLattenPVTv2,
    InLineCSWin,
    InLineDeiT,
    PolaPP,
    PolaPPBackbone,
    PolaPVT,
    PolaSwin,
    PVTBackbone,
    PVTv2Backbone,
    SwinBackbone,
    ViTBackbone,
)
from mmpola.models.attention import PolaAttention, attention_letter, registered_attention_kinds
from mmpola.models.backbones import drop_path_rates, parse_attn_type, tokens_to_nchw
from mmpola.models.checks import PolaConfigError
from mmpola.registry import ARCHITECTURES
from tests.fixtures.backbones import (
    MINI_CSWIN,
    MINI_PVT,
    TINY_CSWIN,
    TINY_PVT,
    TINY_SWIN,
    TINY_VIT,
    expected_stage_sizes,
    hooks_training_step,
)

TINY_POLAPP = dict(embed_dims=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], mlp_ratios=[2] * 4,
                   layer_scale_init_values=[1.0] * 4)
TINY = {'pvt': TINY_PVT, 'swin': TINY_SWIN, 'polapp': TINY_POLAPP, 'pvt_v2': TINY_PVT,
        'cswin': dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[2, 2, 4, 8], split_size=[1, 2, 7, 7]),
        'vit': TINY_VIT}


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


@pytest.mark.parametrize('grad_as_tokens', [False, True])
def test_tokens_to_nchw_gradient_layout(grad_as_tokens):
    """The map is a contiguous NCHW copy either way; its NCHW gradient comes back as the channel-strided view of
    the tokens, or (grad_as_tokens) as contiguous tokens, with the same values."""
    leaf = torch.randn(2, 12, 5, requires_grad=True)
    tokens = leaf * 1
    seen = []
    tokens.register_hook(seen.append)
    out = tokens_to_nchw(tokens, (3, 4), grad_as_tokens=grad_as_tokens)
    assert out.is_contiguous() and torch.equal(out, leaf.detach().reshape(2, 3, 4, 5).permute(0, 3, 1, 2))
    grad = torch.randn(2, 5, 3, 4)
    out.backward(grad)
    assert seen[0].is_contiguous() == grad_as_tokens
    assert torch.equal(leaf.grad, grad.permute(0, 2, 3, 1).reshape(2, 12, 5))


@pytest.mark.parametrize('cls, kwargs, last', [(PolaPVT, {}, 'block1.0'),
                                               (PVTv2Backbone, {'attn_type': 'SSSS'}, 'norm1')])
def test_stage_boundaries_copy_nothing(cls, kwargs, last):
    """The next stage's patch embedding convolves the previous stage's tokens in place (their channels-last
    view, with channels-last strides for one image too); its tokens reach the norm as a contiguous view of the
    conv's output."""
    model = cls(arch=TINY_PVT, **kwargs).train()
    seen = {}
    model.patch_embed2.proj.register_forward_hook(lambda m, args, out: seen.update(input=args[0], output=out))
    model.patch_embed2.norm.register_forward_pre_hook(lambda m, args: seen.update(norm_input=args[0]))
    model.get_submodule(last).register_forward_hook(lambda m, args, out: seen.update(tokens=out))
    model(torch.randn(1, 3, 64, 96))
    assert seen['input'].data_ptr() == seen['tokens'].data_ptr()
    assert seen['input'].is_contiguous(memory_format=torch.channels_last)
    assert seen['norm_input'].is_contiguous() and seen['norm_input'].data_ptr() == seen['output'].data_ptr()


@pytest.mark.parametrize('hooked_kind', ['attention', 'mlp', 'norm'])
def test_hooks_on_one_kind_of_module_leave_the_model_unchanged(hooked_kind):
    """Forward hooks on the attentions only (as a user visualising them adds), on the MLPs only or on the blocks'
    LayerNorms only: a block whose neighbours have no hooks still hands them its residual connection, and the
    hooked module is called on the normalised tokens instead. The hooks run, and the outputs and the
    parameters' gradients equal the model's without hooks."""
    torch.manual_seed(0)
    model = PolaPVT(arch=dict(TINY_PVT, depths=[2, 2, 2, 2])).train()  # blocks that hand on their residuals
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(1))

    expected_outs, expected = hooks_training_step(model, x)
    assert len(expected) == len(list(model.parameters()))  # every parameter has its gradient
    chosen = {'attention': lambda name, m: isinstance(m, PolaAttention),
              'mlp': lambda name, m: name.endswith('.mlp'),
              'norm': lambda name, m: name.rsplit('.', 1)[-1] in ('norm1', 'norm2')}[hooked_kind]
    modules = [m for name, m in model.named_modules() if chosen(name, m)]
    assert len(modules) >= 8
    seen = []
    handles = [m.register_forward_hook(lambda m, args, out: seen.append(m)) for m in modules]
    try:
        outs, grads = hooks_training_step(model, x)
    finally:
        for handle in handles:
            handle.remove()
    assert {id(m) for m in seen} == {id(m) for m in modules}
    for a, e in zip(outs, expected_outs):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(g, expected[name], rtol=1e-4, atol=1e-6, msg=name)


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


TINY_PRESETS = {'pvt_v2': (FLattenPVTv2, dict(arch=TINY_PVT)), 'cswin': (InLineCSWin, dict(arch=TINY_CSWIN)),
                'vit': (InLineDeiT, dict(arch=TINY_VIT))}


@pytest.mark.parametrize('size', [(32, 32), (97, 131), (256, 352)], ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('family', list(TINY_PRESETS))
def test_any_input_size(family, size):
    cls, kwargs = TINY_PRESETS[family]
    torch.manual_seed(0)
    model = cls(**kwargs, out_indices=(0, 1, 2, 3)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    assert [tuple(o.shape[-2:]) for o in outs] == expected_stage_sizes(family, *size)
    assert [o.shape[1] for o in outs] == [model.embed_dims[i] for i in model.out_indices]
    assert all(torch.isfinite(o).all() and o.is_contiguous() for o in outs)


@pytest.mark.parametrize('family', list(TINY_PRESETS))
def test_frozen_stages_and_with_cp(family):
    cls, kwargs = TINY_PRESETS[family]
    torch.manual_seed(0)
    model = cls(**kwargs, frozen_stages=1, drop_path_rate=0.)
    ckpt = copy.deepcopy(model)
    ckpt.with_cp = True
    x = torch.randn(1, 3, 64, 80)
    for m in (model, ckpt):
        m.train()
        sum(o.square().mean() for o in m(x)).backward()
    stem, _ = model._stem_parts()
    stage0, _ = model._stage_parts(0)
    for module in stem + stage0:
        assert not module.training and not any(p.requires_grad for p in module.parameters())
    trained = [(n, a, b) for (n, a), (_, b) in zip(model.named_parameters(), ckpt.named_parameters())
               if a.requires_grad]
    assert trained and all(a.grad is not None for _, a, _ in trained)
    for name, a, b in trained:
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), name


@pytest.mark.downstream
@pytest.mark.parametrize('registry_module', ['mmdet.registry', 'mmseg.registry'])
def test_builds_from_downstream_registries(registry_module):
    registry = importlib.import_module(registry_module).MODELS
    for cls, kwargs in TINY_PRESETS.values():
        with torch.device('meta'):
            assert type(registry.build(dict(type=cls.__name__, **kwargs))) is cls
    with torch.device('meta'):
        cswin = registry.build(dict(type='CSWinBackbone', **TINY_PRESETS['cswin'][1], attn='pola'))
        assert type(cswin) is CSWinBackbone


def test_released_defaults():
    with torch.device('meta'):
        assert FLattenPVTv2().attn_type == 'LLLL' and FLattenPVTv2().la_sr_ratios == [1, 1, 1, 1]
        assert not hasattr(FLattenPVTv2(), 'pos_embed1') and FLattenPVTv2().norm1.eps == 1e-6
        flatten, inline = FLattenCSWin(arch='small'), InLineCSWin(arch='small')
        assert (flatten.attn_type, inline.attn_type) == ('LLSS', 'IISS')
        assert (flatten.depths, inline.depths) == ([2, 4, 32, 2], [3, 6, 29, 2])  # the two releases' small
        big = FLattenCSWin(arch='base_384')
        assert big.pretrain_img_size == (384, 384) and big.resolutions == [96, 48, 24, 12]
        assert big.stage1[0].attns[0].pe_grid == (96, 96) and len(big.stage3[0].attns) == 2
        assert len(big.stage4[0].attns) == 1 and big.stage4[0].attns[0].orientation == 'whole'
        deit = InLineDeiT(arch='small')
        assert deit.attn_type == 'I' * 12 and deit.out_indices == (2, 5, 8, 11) and deit.grid == (18, 18)
        assert deit.out_channels == [320] * 4 and not hasattr(deit, 'norm')
        assert ViTBackbone(arch='tiny', attn_type='S').block_kinds[0] == ['softmax']


def test_configuration_errors():
    with pytest.raises(PolaConfigError, match='out_norm=True is not available: every PVTv2 stage output'):
        PVTv2Backbone(arch=MINI_PVT, out_norm=True)
    with pytest.raises(PolaConfigError, match=r"la_split_size '48-24-12-6'.*pass la_split_size='56-28-14-7'"):
        FLattenCSWin(arch=MINI_CSWIN, la_split_size='48-24-12-6')
    with pytest.raises(PolaConfigError, match=r"the softmax attention \(type='softmax'\) cannot run on CSWin, "
                                              r"whose blocks call their attention with qkv_layout='projected'; "
                                              r"kinds that can: .*flatten.*stripe_softmax"):
        CSWinBackbone(arch=MINI_CSWIN, attn='softmax')
    with pytest.raises(PolaConfigError, match=r"window softmax attention .* cannot run on DeiT, .*the class token"):
        ViTBackbone(arch=TINY_PRESETS['vit'][1]['arch'], attn='window_softmax')
    with pytest.raises(PolaConfigError, match=r'out_indices \(12,\) out of range; valid stages are 0..11'):
        ViTBackbone(out_indices=(12,))
    with pytest.raises(PolaConfigError, match=r'input size 8x40 is smaller than the minimum 16x16 \(one 16x16 patch'):
        InLineDeiT(**TINY_PRESETS['vit'][1])(torch.randn(1, 3, 8, 40))
