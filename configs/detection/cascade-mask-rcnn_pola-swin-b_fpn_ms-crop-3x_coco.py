# Cascade Mask R-CNN + FPN with Pola-Swin-B on COCO 2017, 3x multi-scale-crop schedule: the
# Pola-Swin-T cascade recipe with the base backbone (128 channels, depths 2-2-18-2) and drop path 0.3, as
# Swin's cascade_mask_rcnn_swin_base_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py.
# Backbone weights: checkpoints/pola_swin_base.pth.
_base_ = ['./cascade-mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py']

model = dict(
    backbone=dict(
        arch='base',
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_base.pth')),
    neck=dict(in_channels=[128, 256, 512, 1024]))  # Swin-B's stage widths
