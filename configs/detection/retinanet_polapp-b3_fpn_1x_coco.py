# RetinaNet + FPN with PolaFormer++-B3 on COCO 2017, 1x schedule: the B2 recipe with the B3 backbone
# (official configs/PolaPP/retinanet_b3_1x.py, drop path 0.15). Backbone weights: checkpoints/polapp_b3.pth.
_base_ = ['./retinanet_polapp-b2_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='b3', drop_path_rate=0.15,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b3.pth', use_ema=False)),
    neck=dict(in_channels=[128, 320, 512]))
