# Mask R-CNN + FPN on COCO 2017, 3x multi-scale-crop schedule with InLine-Swin-T:
# ../mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py with the injective linear attention of InLine (NeurIPS 2024) in the
# backbone, everything else identical, so the two compare the attention alone (Swin's detection recipe reports Mask
# R-CNN 3x for Swin-T and Swin-S). Every number and its source: docs/recipes.md. Backbone weights: the official
# InLine-Swin-T ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py']

model = dict(backbone=dict(
    type='InLineSwin',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/32810869fcc34410966b/?dl=1')))
