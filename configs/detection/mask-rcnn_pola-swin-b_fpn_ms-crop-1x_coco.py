# Mask R-CNN + FPN with Pola-Swin-B on COCO 2017, 1x multi-scale-crop schedule: the Pola-Swin-T 1x
# recipe with the base backbone (128 channels, depths 2-2-18-2). Swin's detection repository has no
# Swin-B Mask R-CNN; drop path 0.3 is its Swin-B value, from its one Swin-B detection config,
# configs/swin/cascade_mask_rcnn_swin_base_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py.
# Every number and its source: docs/recipes.md. Backbone weights: checkpoints/pola_swin_base.pth
# (see the Pola-Swin-T config).
_base_ = ['./mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py']

model = dict(
    backbone=dict(
        arch='base',
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_base.pth')),
    neck=dict(in_channels=[128, 256, 512, 1024]))  # Swin-B's stage widths
