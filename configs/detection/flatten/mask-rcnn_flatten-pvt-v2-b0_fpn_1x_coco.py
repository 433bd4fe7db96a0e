# Mask R-CNN + FPN with FLatten-PVTv2-B0 on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images:
# ./mask-rcnn_flatten-pvt-v2-b2_fpn_1x_coco.py with the B0 backbone, as PVTv2's own recipe (whai362/PVT
# detection/configs/mask_rcnn_pvt_v2_b0_fpn_1x_coco.py), drop path 0.1 as PVTv2's detection backbones
# (detection/pvt_v2.py). Every number and its source: docs/recipes.md. Backbone weights: the official FLatten-PVTv2-B0
# ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./mask-rcnn_flatten-pvt-v2-b2_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='b0', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/5d1f01532b104da28e7b/?dl=1')),
    neck=dict(in_channels=[32, 64, 160, 256]))  # B0's stage widths
