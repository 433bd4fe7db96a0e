# Mask R-CNN + FPN with InLine-CSWin-T on COCO 2017, ms-crop 3x:
# ../flatten/mask-rcnn_flatten-cswin-t_fpn_ms-crop-3x_coco.py
# with the injective linear attention of InLine (NeurIPS 2024) in stages 1-2 of the backbone (the released
# layout 'IISS'), everything else identical, so the two compare the attention alone. Every number and its
# source: docs/recipes.md.
#
# Backbone weights: the official InLine-CSWin-T ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../flatten/mask-rcnn_flatten-cswin-t_fpn_ms-crop-3x_coco.py']

model = dict(backbone=dict(
    type='InLineCSWin',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/49fa2ecc543647c4b970/?dl=1')))
