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



def test_patch_merging_is_the_official_phase_concatenation_in_one_copy():
    """The four 2x2 phases (row0, col0), (row1, col0), (row0, col1), (row1, col1) concatenated on the channels,
    odd sides zero-padded: the official strided slices' result, bit for bit, forward and backward; its
    backward fills no zero tensor per slice (one permutation copy instead)."""
    import torch.nn.functional as F

    from mmpola.models.layers import PatchMerging
    from tests.fixtures.ops import DispatchedOps

    g = torch.Generator().manual_seed(0)
    merging = PatchMerging(8)
    for H, W in ((6, 8), (7, 9), (1, 4)):
        x = torch.randn(2, H * W, 8, generator=g)
        leaf = x.clone().requires_grad_()
        out, hw = merging(leaf, (H, W))
        grid = F.pad(x.view(2, H, W, 8), (0, 0, 0, W % 2, 0, H % 2))
        phases = torch.cat([grid[:, 0::2, 0::2], grid[:, 1::2, 0::2], grid[:, 0::2, 1::2], grid[:, 1::2, 1::2]], -1)
        assert hw == phases.shape[1:3]
        reference_leaf = x.clone().requires_grad_()
        reference_grid = F.pad(reference_leaf.view(2, H, W, 8), (0, 0, 0, W % 2, 0, H % 2))
        reference = torch.cat([reference_grid[:, i::2, j::2] for j in (0, 1) for i in (0, 1)], -1)
        reference = merging.reduction(merging.norm(reference.reshape(2, -1, 32)))
        assert torch.equal(out, reference)
        grad = torch.randn(out.shape, generator=g)
        with DispatchedOps() as backward:
            out.backward(grad)
        reference.backward(grad)
        assert torch.equal(leaf.grad, reference_leaf.grad)
        assert 'slice_backward' not in backward.names


def test_padded_windows_are_cropped_back_with_one_zero_fill_in_the_backward():
    """crop_map, which the window and stripe softmax attentions use to crop their padded maps back: the slices'
    result and gradient, bit for bit; its backward pads the gradient with one zero fill and one copy, where
    each slice's backward filled a zero tensor of its own."""
    from mmpola.models.layers import crop_map
    from tests.fixtures.ops import DispatchedOps

    x = torch.randn(2, 21, 28, 8)
    for top, left, H, W in ((0, 0, 16, 24), (2, 1, 17, 26), (0, 0, 21, 28)):
        leaf, reference_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = crop_map(leaf * 1, top, left, H, W)
        reference = (reference_leaf * 1)[:, top:top + H, left:left + W].contiguous()
        assert torch.equal(out, reference) and out.is_contiguous()
        grad = torch.randn(out.shape)
        with DispatchedOps() as backward:
            out.backward(grad)
        reference.backward(grad)
        assert torch.equal(leaf.grad, reference_leaf.grad)
        assert 'slice_backward' not in backward.names and backward.names.count('new_zeros') == 1
