# Mask R-CNN + FPN with FLatten-PVTv2-B1 on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images:
# ./mask-rcnn_flatten-pvt-v2-b2_fpn_1x_coco.py with the B1 backbone, as PVTv2's own recipe (whai362/PVT
# detection/configs/mask_rcnn_pvt_v2_b1_fpn_1x_coco.py), drop path 0.1 as PVTv2's detection backbones
# (detection/pvt_v2.py). Every number and its source: docs/recipes.md. Backbone weights: the FLatten release publishes
# no B1 ImageNet weights; train them with configs/classification/flatten/ and put the checkpoint at
# checkpoints/flatten_pvt_v2_b1.pth, or train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = ['./mask-rcnn_flatten-pvt-v2-b2_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='b1', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_pvt_v2_b1.pth')))
