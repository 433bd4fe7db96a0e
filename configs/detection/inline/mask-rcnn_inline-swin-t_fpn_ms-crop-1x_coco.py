# Mask R-CNN + FPN with InLine-Swin-T on COCO 2017, 1x multi-scale-crop schedule:
# ../mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py with the
# injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical, so the two
# compare the attention alone. Backbone weights: the official InLine-Swin-T ImageNet weights, downloaded
# from its release (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py']

model = dict(backbone=dict(
    type='InLineSwin',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/32810869fcc34410966b/?dl=1')))
