# Mask R-CNN + FPN with Pola-PVT-S on COCO 2017, 3x multi-scale-crop schedule (36 epochs, steps
# at 27 and 33), 8 GPUs x 2 images.
#
# Data pipeline and schedule are mmdet's Swin 3x recipe (mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco);
# the optimizer follows mmdet's PVT recipe: AdamW lr 1e-4, weight decay 1e-4.
# Backbone weights: checkpoints/pola_pvt_small.pth (see mask-rcnn_pola-pvt-t_fpn_1x_coco.py).
_base_ = ['./mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='small',
        pretrain_img_size=224,
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_small.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(optimizer=dict(weight_decay=1e-4))
