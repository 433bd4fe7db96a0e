# Mask R-CNN + FPN with Pola-Swin-S on COCO 2017, 1x schedule: the Pola-Swin-T recipe with the
# small backbone (depths 2-2-18-2) and drop path 0.3.
# Backbone weights: checkpoints/pola_swin_small.pth (see the Pola-Swin-T config).
_base_ = ['./mask-rcnn_pola-swin-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_small.pth')))
