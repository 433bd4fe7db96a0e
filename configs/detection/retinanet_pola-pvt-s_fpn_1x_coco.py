# RetinaNet + FPN with Pola-PVT-S on COCO 2017, 1x schedule: the Pola-PVT-T recipe with the small
# backbone, drop path 0.1 as PVT's pvt_small detection backbone. Backbone weights:
# checkpoints/pola_pvt_small.pth.
_base_ = ['./retinanet_pola-pvt-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_small.pth')))
