"""tools/get_flops.py: mmengine's FlopAnalyzer (as mmdet's / mmseg's get_flops): exact counts on known layers,
Pola attention matmuls counted on both paths, scaled_dot_product_attention as its matmuls, the papers' GMACs,
configs counted in mode='tensor'."""
import os.path as osp

import pytest
import torch
from torch import nn

from mmpola.ops import pola_attention
from tests.fixtures.paths import REPO as ROOT  # noqa: E402
from tests.fixtures.tools import load_tool

get_flops = load_tool('get_flops')


def test_linear_and_conv_counts_are_exact():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 5 * 5, 20))
    flops, per_module = get_flops.count_flops(model, torch.randn(1, 3, 5, 5))
    conv_macs = 8 * 3 * 9 * 5 * 5  # out channels x in channels x kernel x output pixels
    linear_macs = 8 * 5 * 5 * 20
    assert flops == 2 * (conv_macs + linear_macs)
    assert per_module['0'] == 2 * conv_macs and per_module[''] == flops
    assert get_flops.count_parameters(model) == (8 * 3 * 9 + 8) + (200 * 20 + 20)


def test_depthwise_convs_are_counted_whatever_their_implementation(monkeypatch):
    """MMPOLA_DEPTHWISE_CONV=triton (kernels the tracer cannot see) does not change the count: it is made
    with the library convolution, and the variable is as it was afterwards."""
    from mmpola.models.layers import DepthwiseConv2d
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'triton')
    flops, _ = get_flops.count_flops(DepthwiseConv2d(8, 5), torch.randn(1, 8, 6, 7))
    assert flops == 2 * 8 * 25 * 6 * 7
    assert get_flops.os.environ['MMPOLA_DEPTHWISE_CONV'] == 'triton'


class PolaCore(nn.Module):

    def __init__(self, impl):
        super().__init__()
        self.impl = impl

    def forward(self, q, k, v, power, scale):
        return pola_attention(q, k, v, power, scale, impl=self.impl)


@pytest.mark.parametrize('impl', ['reference', 'fast'])
def test_pola_attention_matmuls_are_counted(impl):
    B, h, N, n, d = 2, 3, 50, 20, 8
    inputs = [torch.randn(B, h, N, d), torch.randn(B, h, n, d), torch.randn(B, h, n, d),
              torch.zeros(1, h, 1, d), torch.zeros(1, h, 1, d)]
    flops, _ = get_flops.count_flops(PolaCore(impl), *inputs)
    # both: query side N x 2d x (d + 2) (numerators + both normalisers); key-value side 2d x n x d
    query_side = B * h * N * 2 * d * (d + 2)
    kv_side = B * h * 2 * d * n * d
    assert flops == 2 * (query_side + kv_side)


class Attending(nn.Module):
    """An attention module called with its token grid."""

    def __init__(self, attn, hw):
        super().__init__()
        self.attn, self.hw = attn, hw

    def forward(self, x):
        return self.attn(x, self.hw)


def test_sdpa_is_counted_as_the_explicit_softmax_matmuls(monkeypatch):
    """The softmax kinds attend through scaled_dot_product_attention: counted as q k^T and weights x v."""
    from mmpola.models import SpatialReductionAttention, WindowAttention
    B, C, h, (H, W) = 2, 16, 2, (6, 10)
    n = (H // 2) * (W // 2)
    pvt = SpatialReductionAttention(C, h, sr_ratio=2).eval()
    flops, _ = get_flops.count_flops(Attending(pvt, (H, W)), torch.randn(B, H * W, C))
    linear = B * H * W * C * C * 2 + B * n * C * 2 * C  # q, proj; kv on the reduced map
    sr = B * n * C * C * 4 + B * n * C * 5  # 2x2 conv; LayerNorm: FlopAnalyzer's 5 per element
    assert flops == 2 * (linear + sr + B * H * W * n * 2 * C)

    def explicit(q, k, v, attn_mask=None, dropout_p=0.0, scale=None):
        weights = (q @ k.transpose(-2, -1)) * scale
        return (weights if attn_mask is None else weights + attn_mask).softmax(-1) @ v

    swin = Attending(WindowAttention(C, h, window_size=4, shift=True).eval(), (8, 12))
    x = torch.randn(B, 8 * 12, C)
    fused, _ = get_flops.count_flops(swin, x)
    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', explicit)
    assert get_flops.count_flops(swin, x)[0] == fused


PAPER_GMACS = {('PolaPVT', 'tiny'): 2.26, ('PolaSwin', 'tiny'): 4.66}  # PolaFormer paper, at 224


@pytest.mark.parametrize('type_name,arch', list(PAPER_GMACS))
def test_backbone_gmacs_match_the_paper(type_name, arch):
    model = get_flops.build_backbone(type_name, arch)
    model.eval()
    flops, _ = get_flops.count_flops(model, torch.randn(1, 3, 224, 224))
    gmacs = flops / 2e9
    expected = PAPER_GMACS[(type_name, arch)]
    assert abs(gmacs - expected) <= 0.02 * expected, f'{type_name}-{arch}: {gmacs:.3f} GMACs, paper {expected}'


def test_cli_prints_convention(capsys):
    get_flops.main(['--backbone', 'PolaPVT', '--arch', 'tiny', '--shape', '64'])
    out = capsys.readouterr().out
    assert 'params:' in out and ('GMACs' in out or 'MMACs' in out)
    assert '1 MAC = 2 FLOPs' in out


def test_cfg_options_use_mmengine_syntax(capsys):
    """--cfg-options is mmengine's DictAction, as in tools/train.py: tuples, lists and nested keys."""
    args = get_flops.parse_args(['--config', 'x.py', '--cfg-options', 'model.backbone.arch=small',
                                 'model.backbone.out_indices=(1,2,3)', 'model.neck.in_channels=[128,320,512]'])
    assert args.cfg_options == {'model.backbone.arch': 'small', 'model.backbone.out_indices': (1, 2, 3),
                                'model.neck.in_channels': [128, 320, 512]}
    config = osp.join(ROOT, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
    tiny, _ = get_flops.main(['--config', config, '--shape', '64'])
    small, _ = get_flops.main(['--config', config, '--shape', '64', '--cfg-options', 'model.backbone.arch=small'])
    assert small > tiny  # the override reached the built model


def test_table_prints_one_model_zoo_row_per_config(capsys):
    """--table: the model zoo's params / GMACs columns, one row per config, named as the zoo names it."""
    demo = osp.join(ROOT, 'configs', 'demo')
    configs = [osp.join(demo, 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py'),
               osp.join(demo, 'upernet_pola-swin-t_demo-ade-128x128.py')]
    results = get_flops.main(['--config', *configs, '--shape', '64', '--table'])
    rows = capsys.readouterr().out.strip().splitlines()
    assert [row.split(' | ')[0] for row in rows] == ['| mask-rcnn_pola-pvt-t_fpn_demo-coco',
                                                     '| upernet_pola-swin-t_demo-ade-128x128']
    for row, (params, flops) in zip(rows, results):
        assert row.endswith(f'| {params / 1e6:.2f} M | {flops / 2e9:.1f} |')


def test_backbone_arguments_from_the_command_line(capsys):
    """``--backbone`` with ``--cfg-options``: any kind on any architecture (here Pola on a CSWin) is counted."""
    params, flops = get_flops.main(['--backbone', 'CSWinBackbone', '--shape', '64', '--cfg-options',
                                    'attn.type=pola', 'arch.embed_dims=16', 'arch.depths=[1,1,1,1]',
                                    'arch.num_heads=[2,2,2,2]', 'arch.split_size=[1,2,7,7]'])
    out = capsys.readouterr().out
    assert "CSWinBackbone(attn={'type': 'pola'}" in out and params > 0 and flops > 0
