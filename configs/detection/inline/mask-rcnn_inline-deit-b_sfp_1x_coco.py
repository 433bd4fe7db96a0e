# Mask R-CNN with InLine-DeiT-B (384 channels, pretrained at 448x448) on COCO 2017, 1x schedule:
# ./mask-rcnn_inline-deit-s_sfp_1x_coco.py (mmpola's recipe: PVT's Mask R-CNN 1x with ViTDet's simple feature pyramid)
# with the base backbone, drop path 0.1. Every number and its source: docs/recipes.md. Backbone weights: the official
# InLine-DeiT-B ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./mask-rcnn_inline-deit-s_sfp_1x_coco.py']

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/10bdd726d4b0435eb34e/?dl=1')),
    neck=dict(backbone_channel=384, in_channels=[96, 192, 384, 384]))  # DeiT-B's width 384
