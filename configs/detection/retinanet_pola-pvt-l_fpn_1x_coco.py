# RetinaNet + FPN with Pola-PVT-L on COCO 2017, 1x schedule: the Pola-PVT-T recipe with the large
# backbone and no drop path (PVT's pvt_large detection backbone sets none). PVT trained this size with
# fp16: tools/train.py --amp. Backbone weights: checkpoints/pola_pvt_large.pth.
_base_ = ['./retinanet_pola-pvt-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(
        arch='large',
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_large.pth')))
