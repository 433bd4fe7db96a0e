"""PVTv2, CSWin and the ViT (DeiT) as dense backbones: any input size with the official size rules,
freezing, checkpointing, the released presets, CSWin's stripes padded as the official dense code,
the softmax layouts equal to timm's PVTv2 and DeiT, the ViT's position embedding resized with its
class token, checkpoints of another architecture or kind refused, and clear configuration errors."""
import copy
import importlib

import pytest
import timm
import torch
import torch.nn.functional as F

from mmpola.checkpoint import CheckpointMismatchError, describe_checkpoint, resize_state_dict
from mmpola.checkpoint.reading import safe_torch_load
from mmpola.models import (
    CSWinBackbone,
    FLattenCSWin,
    FLattenPVT,
    FLattenPVTv2,
    ImageClassifier,
    InLineCSWin,
    InLineDeiT,
    PVTv2Backbone,
    StripeAttention,
    ViTBackbone,
)
from mmpola.models.checks import PolaConfigError

TINY = {
    'pvt_v2': (FLattenPVTv2, dict(arch=dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4],
                                            mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1]))),
    'cswin': (InLineCSWin, dict(arch=dict(embed_dims=16, depths=[1, 1, 2, 1], num_heads=[2, 2, 4, 8],
                                          split_size=[1, 2, 7, 7]))),
    'vit': (InLineDeiT, dict(arch=dict(embed_dims=32, depth=4, num_heads=2, img_size=64))),
}
MINI_PVT = dict(embed_dims=[16, 32, 80, 128], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4], depths=[1, 1, 2, 1])
MINI_CSWIN = dict(embed_dims=16, depths=[1, 2, 2, 1], num_heads=[1, 2, 4, 8], split_size=[1, 2, 7, 7])


def _ceil(a, b):
    return -(-a // b)


def _expected_sizes(family, h, w):
    """The official size rules: PVTv2 ceil(H / 4) then halved up; CSWin's 7x7 / 4 / pad-2 stem floor((H - 3)
    / 4) + 1 then halved up; the ViT ceil(H / 16) at every block."""
    if family == 'vit':
        return [(_ceil(h, 16), _ceil(w, 16))] * 4
    h, w = ((h - 3) // 4 + 1, (w - 3) // 4 + 1) if family == 'cswin' else (_ceil(h, 4), _ceil(w, 4))
    out = []
    for _ in range(4):
        out.append((h, w))
        h, w = _ceil(h, 2), _ceil(w, 2)
    return out


@pytest.mark.parametrize('size', [(32, 32), (97, 131), (256, 352)], ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('family', list(TINY))
def test_any_input_size(family, size):
    cls, kwargs = TINY[family]
    torch.manual_seed(0)
    model = cls(**kwargs, out_indices=(0, 1, 2, 3)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    assert [tuple(o.shape[-2:]) for o in outs] == _expected_sizes(family, *size)
    assert [o.shape[1] for o in outs] == [model.embed_dims[i] for i in model.out_indices]
    assert all(torch.isfinite(o).all() and o.is_contiguous() for o in outs)


@pytest.mark.parametrize('family', list(TINY))
def test_frozen_stages_and_with_cp(family):
    cls, kwargs = TINY[family]
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


@pytest.mark.parametrize('registry_module', ['mmdet.registry', 'mmseg.registry'])
def test_builds_from_downstream_registries(registry_module):
    registry = importlib.import_module(registry_module).MODELS
    for cls, kwargs in TINY.values():
        with torch.device('meta'):
            assert type(registry.build(dict(type=cls.__name__, **kwargs))) is cls
    with torch.device('meta'):
        assert type(registry.build(dict(type='CSWinBackbone', **TINY['cswin'][1], attn='pola'))) is CSWinBackbone


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
        ViTBackbone(arch=TINY['vit'][1]['arch'], attn='window_softmax')
    with pytest.raises(PolaConfigError, match=r'out_indices \(12,\) out of range; valid stages are 0..11'):
        ViTBackbone(out_indices=(12,))
    with pytest.raises(PolaConfigError, match=r'input size 8x40 is smaller than the minimum 16x16 \(one 16x16 patch'):
        InLineDeiT(**TINY['vit'][1])(torch.randn(1, 3, 8, 40))


def _stripes_one_by_one(attn, qkv, hw):
    """CSWin's stripe softmax written as a loop over the stripes of the symmetrically zero-padded map
    (the official dense code's padding); LePE convolves each stripe on its own."""
    B, N, _, C = qkv.shape
    H, W = hw
    hsp, wsp = attn.stripe(hw)
    pad_h, pad_w = (-H) % hsp, (-W) % wsp
    maps = F.pad(qkv.permute(0, 2, 3, 1).reshape(B, 3, C, H, W),
                 (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    heads, d = attn.num_heads, C // attn.num_heads
    out = torch.zeros(B, C, H + pad_h, W + pad_w)

    def tokens(t):
        return t.flatten(2).transpose(1, 2).reshape(B, -1, heads, d).transpose(1, 2)

    for r in range(0, H + pad_h, hsp):
        for c in range(0, W + pad_w, wsp):
            q, k, v = (maps[:, i, :, r:r + hsp, c:c + wsp] for i in range(3))
            weights = ((tokens(q) * attn.scale) @ tokens(k).transpose(-2, -1)).softmax(dim=-1)
            o = (weights @ tokens(v)).transpose(1, 2).reshape(B, -1, C).transpose(1, 2).reshape(B, C, hsp, wsp)
            out[..., r:r + hsp, c:c + wsp] = o + attn.get_v(v)
    out = out[..., pad_h // 2:pad_h // 2 + H, pad_w // 2:pad_w // 2 + W]
    return out.flatten(2).transpose(1, 2)


@pytest.mark.parametrize('hw', [(14, 14), (6, 9), (13, 20)], ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('orientation', StripeAttention.ORIENTATIONS)
def test_cswin_stripes_pad_symmetrically_as_the_official_dense_code(orientation, hw):
    torch.manual_seed(0)
    attn = StripeAttention(8, 2, split_size=4, orientation=orientation).eval()
    qkv = torch.randn(2, hw[0] * hw[1], 3, 8)
    with torch.no_grad():
        assert torch.allclose(attn(qkv, hw), _stripes_one_by_one(attn, qkv, hw), atol=1e-5)


def test_cswin_mixed_stage_and_pola_branches():
    """'M<k>': the first k blocks of the stage with the kind (one whole-map branch), the rest stripes; Pola's
    branch needs four projections, so its blocks' qkv is Linear(C, 4C)."""
    torch.manual_seed(0)
    model = CSWinBackbone(arch=dict(MINI_CSWIN, depths=[1, 3, 1, 1]), attn='pola', attn_type='LMSS1').train()
    assert model.block_kinds[1] == ['pola', 'stripe_softmax', 'stripe_softmax']
    assert [len(b.attns) for b in model.stage2] == [1, 2, 2]
    assert model.stage2[0].qkv.out_features == 4 * 32 and model.stage2[1].qkv.out_features == 3 * 32
    assert hasattr(model.stage2[0].attns[0], 'get_v')  # CSWin's LePE, stored under the official name
    outs = model(torch.randn(1, 3, 61, 83))
    sum(o.square().mean() for o in outs).backward()
    assert not [n for n, p in model.named_parameters() if p.grad is None]


def test_softmax_layouts_are_timm_pvt_v2_and_deit():
    """'SSSS' PVTv2 is whai362's PVTv2 and the ViT with 'S' is DeiT: their weights load and give timm's
    outputs (timm's own filter maps the official PVTv2 names)."""
    torch.manual_seed(0)
    ours = ImageClassifier(family='pvt_v2', arch='b0', attn_type='SSSS', num_classes=10, drop_path_rate=0.).eval()
    theirs = timm.create_model('pvt_v2_b0', num_classes=10).eval()
    official = {k[len('backbone.'):] if k.startswith('backbone.') else k: v for k, v in ours.state_dict().items()}
    theirs.load_state_dict(timm.models.pvt_v2.checkpoint_filter_fn(official, theirs))
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs(x), atol=1e-5)

    arch = dict(embed_dims=64, depth=2, num_heads=2, img_size=64)
    ours = ImageClassifier(family='vit', arch=arch, attn_type='S', num_classes=10, drop_path_rate=0.).eval()
    theirs = timm.models.vision_transformer.VisionTransformer(img_size=64, embed_dim=64, depth=2, num_heads=2,
                                                              num_classes=10).eval()
    ours.load_checkpoint(theirs.state_dict())  # DeiT's names: the official ones (strict)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs(x), atol=1e-5)


def test_vit_position_embedding_follows_the_grid():
    """At another input size the class token keeps its entry and the grid part is resized bicubically;
    a 224 checkpoint fine-tuned at 288 is resized the same way at load (resize_state_dict)."""
    torch.manual_seed(0)
    model = InLineDeiT(**TINY['vit'][1], out_indices=(3,)).eval()
    x = torch.randn(1, 3, 80, 112)
    with torch.no_grad():
        tokens, hw = model._stem(x)
        patches, _ = model.patch_embed(x)
    assert hw == (5, 7)
    grid = F.interpolate(model.pos_embed[:, 1:].reshape(1, 4, 4, 32).permute(0, 3, 1, 2), size=(5, 7),
                         mode='bicubic', align_corners=False).flatten(2).transpose(1, 2)
    assert torch.allclose(tokens[:, 0], (model.cls_token + model.pos_embed[:, :1])[:, 0])
    assert torch.allclose(tokens[:, 1:], patches + grid, atol=1e-6)

    bigger = InLineDeiT(**TINY['vit'][1], pretrain_img_size=96)
    resized, report = resize_state_dict(model.state_dict(), bigger.state_dict())
    assert report == ['pos_embed: (1, 17, 32) -> (1, 37, 32)']
    assert torch.equal(resized['pos_embed'][:, 0], model.pos_embed[:, 0])
    bigger.load_state_dict(resized)


# a file of another architecture or kind -> (model, message naming what the file looks like)
CROSS = [
    (FLattenPVT, dict(arch=MINI_PVT), 'flatten_pvt_v2',
     r'not a FLatten-PVT checkpoint: its keys fit FLatten-PVTv2 better.*build type=\'FLattenPVTv2\''),
    (FLattenPVTv2, dict(arch=MINI_PVT), 'flatten_pvt', r'its keys fit FLatten-PVT better than FLattenPVTv2'),
    (InLineCSWin, dict(arch=MINI_CSWIN), 'flatten_cswin',
     r"none of the InLine attention weights of InLineCSWin.*FLatten-CSWin checkpoint.*build type='FLattenCSWin'"),
    (FLattenCSWin, dict(arch=MINI_CSWIN), 'inline_cswin', r'none of the FLatten attention weights.*InLine-CSWin'),
    (InLineDeiT, dict(arch=dict(embed_dims=64, depth=3, num_heads=2, img_size=224)), 'flatten_cswin',
     r'no key matching InLineDeiT.*looks like a FLatten-CSWin'),
]


@pytest.mark.parametrize('cls,kwargs,ckpt,match', CROSS, ids=[f'{c[0].__name__}-{c[2]}' for c in CROSS])
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
