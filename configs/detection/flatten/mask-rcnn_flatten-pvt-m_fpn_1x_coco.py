# Mask R-CNN + FPN on COCO 2017, 1x schedule with FLatten-PVT-M: ../mask-rcnn_pola-pvt-m_fpn_1x_coco.py with the
# focused linear attention of FLatten Transformer (ICCV 2023) in the backbone, everything else identical, so the two
# compare the attention alone. Every number and its source: docs/recipes.md. Backbone weights: the FLatten release
# publishes no FLatten-PVT-M ImageNet weights; train them with configs/classification/flatten/ and put the checkpoint
# at checkpoints/flatten_pvt_medium.pth, or train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = ['../mask-rcnn_pola-pvt-m_fpn_1x_coco.py']

model = dict(backbone=dict(
    type='FLattenPVT',
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_pvt_medium.pth')))
