# RetinaNet + FPN with InLine-PVT-T on COCO 2017, 1x schedule: ../retinanet_pola-pvt-t_fpn_1x_coco.py with the
# injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical, so the two
# compare the attention alone. Backbone weights: the official InLine-PVT-T ImageNet file at
# checkpoints/inline_pvt_tiny.pth (or --cfg-options model.backbone.init_cfg=None).
_base_ = ['../retinanet_pola-pvt-t_fpn_1x_coco.py']

model = dict(backbone=dict(type='InLinePVT', init_cfg=dict(checkpoint='checkpoints/inline_pvt_tiny.pth')))
