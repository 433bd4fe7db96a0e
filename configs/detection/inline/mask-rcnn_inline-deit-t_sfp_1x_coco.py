# Mask R-CNN with InLine-DeiT-T (192 channels, pretrained at 224x224) on COCO 2017, 1x schedule:
# ./mask-rcnn_inline-deit-s_sfp_1x_coco.py (mmpola's recipe: PVT's Mask R-CNN 1x with ViTDet's simple feature pyramid)
# with the tiny backbone, drop path 0.1. Every number and its source: docs/recipes.md. Backbone weights: the official
# InLine-DeiT-T ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./mask-rcnn_inline-deit-s_sfp_1x_coco.py']

model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/1d6b8191ad6d4114b291/?dl=1')),
    neck=dict(backbone_channel=192, in_channels=[48, 96, 192, 192]))  # DeiT-T's width 192
