# RetinaNet + FPN with Pola-PVT-M on COCO 2017, 1x schedule: the Pola-PVT-T recipe with the medium
# backbone and no drop path (PVT's pvt_medium detection backbone sets none). Backbone weights:
# checkpoints/pola_pvt_medium.pth.
_base_ = ['./retinanet_pola-pvt-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(
        arch='medium',
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_medium.pth')))
