"""The PVTv2 architecture (mmpola.models.backbones.pvt_v2) on its own: its softmax layout is whai362's
PVTv2 as timm has it (with the ViT's, DeiT as timm has it, in the same comparison). PVTv2's dense
contract is in test_base.py."""
import timm
import torch

from mmpola.models import ImageClassifier


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



def test_the_mlp_depthwise_conv_runs_on_the_tokens_channels_last_view():
    """No copy on either side of the MLP's conv: contiguous tokens in, contiguous tokens out (GELU, fc2 and
    their backward then see contiguous tensors), the same values as the conv of the contiguous map."""
    import torch.nn.functional as F

    from mmpola.models.backbones.pvt_v2 import ConvMlp
    torch.manual_seed(0)
    mlp = ConvMlp(8, 32)
    x = torch.randn(2, 5 * 7, 32)
    out = mlp.dwconv(x, (5, 7))
    assert out.shape == x.shape and out.is_contiguous()
    conv = mlp.dwconv.dwconv
    dense = x.reshape(2, 5, 7, 32).permute(0, 3, 1, 2).contiguous()
    expected = F.conv2d(dense, conv.weight.contiguous(), conv.bias, padding=1, groups=32).flatten(2).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
