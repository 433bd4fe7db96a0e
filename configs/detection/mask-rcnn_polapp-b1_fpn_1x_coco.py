# Mask R-CNN + FPN with PolaFormer++-B1 on COCO 2017, 1x schedule: the B2 recipe (official
# configs/PolaPP/maskrcnn_b2_1x.py) with the B1 backbone. The PolaFormer++ release has no B1 detection
# config; drop path 0.1 as its B1 ImageNet and segmentation settings. Every number and its source:
# docs/recipes.md. Backbone weights: checkpoints/polapp_b1.pth.
_base_ = ['./mask-rcnn_polapp-b2_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='b1', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b1.pth', use_ema=False)),
    neck=dict(in_channels=[32, 64, 192, 384]))  # B1's stage widths
