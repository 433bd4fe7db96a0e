# Mask R-CNN + FPN with PolaFormer++-B5 on COCO 2017, 1x schedule: the B2 recipe with the B5 backbone
# (official configs/PolaPP/maskrcnn_b5_1x.py, drop path 0.55). Backbone weights: checkpoints/polapp_b5.pth.
_base_ = ['./mask-rcnn_polapp-b2_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='b5', drop_path_rate=0.55,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b5.pth', use_ema=False)),
    neck=dict(in_channels=[96, 192, 448, 640]))
