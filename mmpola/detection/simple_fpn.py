"""ViTDet's simple feature pyramid (Li et al., "Exploring Plain Vision Transformer Backbones for Object
Detection", ECCV 2022) for the plain ViT backbones: :class:`SimpleFeaturePyramid`.

mmdet ships it as a project (``projects/ViTDet``, ``SimpleFPN``), which its installed package does not
include; this is the same neck, registered under a name of its own so that it never clashes with the
project's when a user imports that too.
"""
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmengine.registry import MODELS

__all__ = ['SimpleFeaturePyramid']


class _LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map (ViTDet's ``LN2d``)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()


def _conv_norm(in_channels, out_channels, kernel_size):
    """Conv (no bias) + LayerNorm2d, no activation (ViTDet's lateral and output convs)."""
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
                         _LayerNorm2d(out_channels, eps=1e-6))


@MODELS.register_module()
class SimpleFeaturePyramid(BaseModule):
    """Strides 4, 8, 16, 32 (and 64) from the stride-16 map of a plain ViT, as ViTDet: two 2x2
    transposed convs (with LayerNorm2d and GELU between them) for stride 4, one for stride 8, the map
    itself for 16, a 2x2 max pool for 32; then per level a 1x1 and a 3x3 conv, each followed by a
    LayerNorm2d; extra levels by max-pooling the last output (stride 2, as mmdet's FPN).

    Args:
        backbone_channel: channels C of the backbone map.
        in_channels: channels of the four levels before the convs, ``[C // 4, C // 2, C, C]``.
        out_channels: channels of every output level.
        num_outs: output levels (5 for mmdet's RPN / RetinaNet heads: strides 4-64).
        init_cfg: mmengine init config.

    Shapes: ``forward(inputs)``: a tuple of (B, C, h, w) maps of the backbone, of which the last is used
    -> tuple of ``num_outs`` maps (B, out_channels, ...) at strides 4, 8, 16, 32, 64 relative to the image.
    """

    def __init__(self, backbone_channel, in_channels, out_channels, num_outs=5, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        c = backbone_channel
        expected = [c // 4, c // 2, c, c]
        if list(in_channels) != expected:
            raise ValueError(f'SimpleFeaturePyramid: in_channels must be {expected} for backbone_channel={c} '
                             f'(the channels of its four levels), got {list(in_channels)}')
        if num_outs < 4:
            raise ValueError(f'SimpleFeaturePyramid: num_outs must be at least 4 (strides 4-32), got {num_outs}')
        self.backbone_channel = c
        self.in_channels = list(in_channels)
        self.out_channels = out_channels
        self.num_outs = num_outs
        self.fpn1 = nn.Sequential(nn.ConvTranspose2d(c, c // 2, 2, 2), _LayerNorm2d(c // 2, eps=1e-6), nn.GELU(),
                                  nn.ConvTranspose2d(c // 2, c // 4, 2, 2))
        self.fpn2 = nn.Sequential(nn.ConvTranspose2d(c, c // 2, 2, 2))
        self.fpn3 = nn.Sequential(nn.Identity())
        self.fpn4 = nn.Sequential(nn.MaxPool2d(kernel_size=2, stride=2))
        self.lateral_convs = nn.ModuleList(_conv_norm(ch, out_channels, 1) for ch in self.in_channels)
        self.fpn_convs = nn.ModuleList(_conv_norm(out_channels, out_channels, 3) for _ in self.in_channels)

    def forward(self, inputs):
        x = inputs[-1]
        levels = [self.fpn1(x), self.fpn2(x), self.fpn3(x), self.fpn4(x)]
        outs = [conv(lateral(level)) for level, lateral, conv in zip(levels, self.lateral_convs, self.fpn_convs)]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        return tuple(outs)
