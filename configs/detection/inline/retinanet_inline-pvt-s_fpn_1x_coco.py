# RetinaNet + FPN on COCO 2017, 1x schedule with InLine-PVT-S: ../retinanet_pola-pvt-s_fpn_1x_coco.py with the
# injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical, so the two compare
# the attention alone (PVT's detection recipe reports RetinaNet for every PVT size). Every number and its source:
# docs/recipes.md. Backbone weights: the official InLine-PVT-S ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../retinanet_pola-pvt-s_fpn_1x_coco.py']

model = dict(backbone=dict(
    type='InLinePVT',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/1ab953b2479d433080a3/?dl=1')))
