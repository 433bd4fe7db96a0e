# Mask R-CNN + FPN with InLine-PVT-T on COCO 2017, 1x schedule: ../mask-rcnn_pola-pvt-t_fpn_1x_coco.py with the
# injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical, so the two
# compare the attention alone. Backbone weights: the official InLine-PVT-T ImageNet weights, downloaded
# from its release (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../mask-rcnn_pola-pvt-t_fpn_1x_coco.py']

model = dict(backbone=dict(
    type='InLinePVT',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/90ac52b1555b401eb5e6/?dl=1')))
