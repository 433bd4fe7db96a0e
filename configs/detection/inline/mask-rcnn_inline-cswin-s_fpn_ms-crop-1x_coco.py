# Mask R-CNN + FPN on COCO 2017, ms-crop 1x with InLine-CSWin-S:
# ../flatten/mask-rcnn_flatten-cswin-s_fpn_ms-crop-1x_coco.py with the injective linear attention of InLine (NeurIPS
# 2024) in stages 1-2 of the backbone (the released layout 'IISS' (InLine-CSWin-S: depths 3-6-29-2, deeper than
# FLatten's)), everything else identical. Every number and its source: docs/recipes.md.
#
# Backbone weights: the official InLine-CSWin-S ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../flatten/mask-rcnn_flatten-cswin-s_fpn_ms-crop-1x_coco.py']

model = dict(backbone=dict(
    type='InLineCSWin',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/59f4e65f776f4052b93c/?dl=1')))
