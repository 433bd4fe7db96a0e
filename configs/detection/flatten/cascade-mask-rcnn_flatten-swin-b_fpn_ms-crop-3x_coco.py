# Cascade Mask R-CNN + FPN on COCO 2017, 3x multi-scale-crop schedule with FLatten-Swin-B:
# ../cascade-mask-rcnn_pola-swin-b_fpn_ms-crop-3x_coco.py with the focused linear attention of FLatten Transformer
# (ICCV 2023) in the backbone, everything else identical, so the two compare the attention alone (Swin's detection
# recipe reports Cascade Mask R-CNN 3x for Swin-T, Swin-S and Swin-B). Every number and its source: docs/recipes.md.
# Backbone weights: the official FLatten-Swin-B ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../cascade-mask-rcnn_pola-swin-b_fpn_ms-crop-3x_coco.py']

model = dict(backbone=dict(
    type='FLattenSwin',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/7a9e5186bad04e7fb3a9/?dl=1')))
