"""The Swin architecture (mmpola.models.backbones.swin) on its own: mixed stages ('M') and the settings
of the 384 pretraining. Its dense contract with PVT's is in test_dense_forward.py."""
import torch

from mmpola.models import PolaSwin


def test_swin_mixed_attn_type_and_384_settings():
    model = PolaSwin(arch=dict(embed_dims=16, depths=[1, 1, 4, 1], num_heads=[1, 2, 4, 8]),
                     attn_type='LLMS3')
    kinds = [type(b.attn).__name__ for b in model.layers[2].blocks]
    assert kinds == ['PolaAttention'] * 3 + ['WindowAttention']
    with torch.device('meta'):
        b384 = PolaSwin(arch='base', pretrain_img_size=384)
    sd = b384.state_dict()
    assert b384.window_size == 96 and b384.softmax_window_size == 12
    assert sd['layers.0.blocks.0.attn.positional_encoding'].shape == (1, 9216, 128)
    assert sd['layers.1.blocks.0.attn.positional_encoding'].shape == (1, 2304, 256)
    assert sd['layers.2.blocks.0.attn.relative_position_bias_table'].shape == (529, 16)

