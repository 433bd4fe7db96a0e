"""The linear kinds' projection layouts (mmpola.models.attention.projections): the official names of each
layout, the operands each gives, PVT's spatial reduction of keys and values, and the argument checks."""
import pytest
import torch
import torch.nn as nn

from mmpola.models.attention.projections import (
    QKV_LAYOUTS,
    QKVProjections,
    check_attention_args,
    reduced_grid,
    spatial_reduction,
)


class _Projected(QKVProjections, nn.Module):
    fused_projection = ('qkvg', 4)
    query_projection = ('qg', 2)

    def __init__(self, dim, qkv_layout, sr_ratio=1):
        super().__init__()
        self.qkv_layout = qkv_layout
        self._init_input_projections(dim, qkv_layout, qkv_bias=True)
        self._init_output_projection(dim, qkv_layout, proj_drop=0.)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio)
            self.norm = nn.LayerNorm(dim)


def test_layouts_name_their_modules_as_the_official_code():
    assert QKV_LAYOUTS == ('fused', 'separate', 'projected')
    names = {layout: {n for n, _ in _Projected(8, layout).named_children()} for layout in QKV_LAYOUTS}
    assert names == {'fused': {'qkvg', 'proj', 'proj_drop'}, 'separate': {'qg', 'kv', 'proj', 'proj_drop'},
                     'projected': set()}


@pytest.mark.parametrize('layout', QKV_LAYOUTS)
def test_every_layout_gives_the_operands_and_the_key_grid(layout):
    torch.manual_seed(0)
    module = _Projected(8, layout, sr_ratio=2 if layout == 'separate' else 1)
    x = torch.randn(2, 6 * 4, 4, 8) if layout == 'projected' else torch.randn(2, 6 * 4, 8)
    operands, kv_hw = module._project_inputs(x, (6, 4))
    assert len(operands) == 4  # q, k, v, g in the fused projection's order
    n = 3 * 2 if layout == 'separate' else 24
    assert [tuple(t.shape) for t in operands] == [(2, 24, 8), (2, n, 8), (2, n, 8), (2, 24, 8)]
    assert kv_hw == ((3, 2) if layout == 'separate' else (6, 4))
    out = torch.randn(2, 24, 8)
    if layout == 'projected':  # the caller (CSWin's block) owns proj
        assert module._project_output(out) is out
    else:
        assert torch.allclose(module._project_output(out), module.proj(out))


def test_spatial_reduction_and_the_reduced_grid():
    x = torch.randn(1, 8 * 6, 4)
    assert spatial_reduction(x, (8, 6), None, None) == (x, (8, 6))
    tokens, hw = spatial_reduction(x, (8, 6), nn.Conv2d(4, 4, 2, 2), nn.LayerNorm(4))
    assert tokens.shape == (1, 12, 4) and hw == (4, 3) == reduced_grid((8, 6), 2)


def test_argument_checks():
    assert check_attention_args(12, 3) == 4
    with pytest.raises(ValueError, match='dim 10 is not divisible by num_heads 3'):
        check_attention_args(10, 3)
    with pytest.raises(ValueError, match="qkv_layout must be 'fused'"):
        check_attention_args(12, 3, qkv_layout='shared')
    with pytest.raises(ValueError, match=r"spatial reduction \(sr_ratio > 1\) needs the separate"):
        check_attention_args(12, 3, qkv_layout='fused', sr_ratio=2)
    with pytest.raises(ValueError, match="v_upsample must be 'linear1d' or 'bilinear2d'"):
        check_attention_args(12, 3, v_upsample='nearest')
