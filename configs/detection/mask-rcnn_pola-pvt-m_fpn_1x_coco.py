# Mask R-CNN + FPN with Pola-PVT-M on COCO 2017, 1x schedule: the Pola-PVT-T recipe with the medium
# backbone (depths 3-4-18-3) and no drop path (PVT's pvt_medium detection backbone sets none).
# Backbone weights: checkpoints/pola_pvt_medium.pth (see the Pola-PVT-T config).
_base_ = ['./mask-rcnn_pola-pvt-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(
        arch='medium',
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_medium.pth')))
