# Mask R-CNN + FPN with PolaFormer++-B4 on COCO 2017, 3x multi-scale-crop schedule: the B2 recipe with the B4 backbone
# (official configs/PolaPP/maskrcnn_b4_3x.py, drop path 0.4). Backbone weights: checkpoints/polapp_b4.pth.
_base_ = ['./mask-rcnn_polapp-b2_fpn_ms-crop-3x_coco.py']

model = dict(
    backbone=dict(arch='b4', drop_path_rate=0.4,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b4.pth', use_ema=False)),
    neck=dict(in_channels=[96, 192, 384, 512]))
