# Mask R-CNN + FPN on COCO 2017, 1x schedule, 8 GPUs x 1 image with InLine-PVT-L:
# ../mask-rcnn_pola-pvt-l_fpn_8xb1-1x_coco.py with the injective linear attention of InLine (NeurIPS 2024) in the
# backbone, everything else identical, so the two compare the attention alone. Every number and its source:
# docs/recipes.md. Backbone weights: the official InLine-PVT-L ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../mask-rcnn_pola-pvt-l_fpn_8xb1-1x_coco.py']

model = dict(backbone=dict(
    type='InLinePVT',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/efd91318ba964f01b288/?dl=1')))
