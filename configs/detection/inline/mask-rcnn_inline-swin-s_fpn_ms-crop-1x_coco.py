# Mask R-CNN + FPN on COCO 2017, 1x multi-scale-crop schedule with InLine-Swin-S:
# ../mask-rcnn_pola-swin-s_fpn_ms-crop-1x_coco.py with the injective linear attention of InLine (NeurIPS 2024) in the
# backbone, everything else identical, so the two compare the attention alone. Every number and its source:
# docs/recipes.md. Backbone weights: the official InLine-Swin-S ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../mask-rcnn_pola-swin-s_fpn_ms-crop-1x_coco.py']

model = dict(backbone=dict(
    type='InLineSwin',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/e9657fd247c04c7cb1a1/?dl=1')))
