"""The ViT architecture (mmpola.models.backbones.vit) on its own: the position embedding follows the token
grid with its class token. The ViT's dense contract is in test_base.py."""
import torch
import torch.nn.functional as F

from mmpola.checkpoint import resize_state_dict
from mmpola.models import InLineDeiT
from tests.fixtures.backbones import TINY_VIT


def test_vit_position_embedding_follows_the_grid():
    """At another input size the class token keeps its entry and the grid part is resized bicubically;
    a 224 checkpoint fine-tuned at 288 is resized the same way at load (resize_state_dict)."""
    torch.manual_seed(0)
    model = InLineDeiT(arch=TINY_VIT, out_indices=(3,)).eval()
    x = torch.randn(1, 3, 80, 112)
    with torch.no_grad():
        tokens, hw = model._stem(x)
        patches, _ = model.patch_embed(x)
    assert hw == (5, 7)
    grid = F.interpolate(model.pos_embed[:, 1:].reshape(1, 4, 4, 32).permute(0, 3, 1, 2), size=(5, 7),
                         mode='bicubic', align_corners=False).flatten(2).transpose(1, 2)
    assert torch.allclose(tokens[:, 0], (model.cls_token + model.pos_embed[:, :1])[:, 0])
    assert torch.allclose(tokens[:, 1:], patches + grid, atol=1e-6)

    bigger = InLineDeiT(arch=TINY_VIT, pretrain_img_size=96)
    resized, report = resize_state_dict(model.state_dict(), bigger.state_dict())
    assert report == ['pos_embed: (1, 17, 32) -> (1, 37, 32)']
    assert torch.equal(resized['pos_embed'][:, 0], model.pos_embed[:, 0])
    bigger.load_state_dict(resized)

