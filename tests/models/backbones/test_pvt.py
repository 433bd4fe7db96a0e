"""The PVT architecture (mmpola.models.backbones.pvt) on its own: spatially reduced keys and values
(``la_sr_ratios``) and softmax stages. Its dense contract with Swin's is in test_dense_forward.py."""
import torch

from mmpola.models import PolaPVT
from tests.fixtures.backbones import TINY_PVT


def test_pvt_spatial_reduction_and_softmax_blocks():
    """la_sr_ratios > 1 (official class default '8421') and softmax 'S' stages still run anywhere."""
    model = PolaPVT(arch=TINY_PVT, la_sr_ratios='8421', attn_type='LLLS').eval()
    sd = model.state_dict()
    assert sd['block1.0.attn.positional_encoding'].shape == (1, 49, 16)  # (56 / 8) ** 2
    assert 'block1.0.attn.sr.weight' in sd and 'block1.0.attn.norm.weight' in sd
    assert 'block4.0.attn.q.weight' in sd and 'block4.0.attn.sr.weight' not in sd
    with torch.no_grad():
        for size in [(64, 64), (96, 160)]:
            outs = model(torch.randn(1, 3, *size))
            assert all(torch.isfinite(o).all() for o in outs)
    model2d = PolaPVT(arch=TINY_PVT, la_sr_ratios='8421', attn=dict(v_upsample='bilinear2d')).eval()
    with torch.no_grad():
        assert model2d(torch.randn(1, 3, 96, 160))[0].shape == (1, 16, 24, 40)

