# Cascade Mask R-CNN + FPN on COCO 2017, 3x multi-scale-crop schedule with InLine-Swin-B:
# ../cascade-mask-rcnn_pola-swin-b_fpn_ms-crop-3x_coco.py with the injective linear attention of InLine (NeurIPS 2024)
# in the backbone, everything else identical, so the two compare the attention alone (Swin's detection recipe reports
# Cascade Mask R-CNN 3x for Swin-T, Swin-S and Swin-B). Every number and its source: docs/recipes.md. Backbone
# weights: the official InLine-Swin-B ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py);
# offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../cascade-mask-rcnn_pola-swin-b_fpn_ms-crop-3x_coco.py']

model = dict(backbone=dict(
    type='InLineSwin',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/bf23564bb64c420aafe1/?dl=1')))
