# Cascade Mask R-CNN + FPN with Pola-Swin-S on COCO 2017, 3x multi-scale-crop schedule: the
# Pola-Swin-T cascade recipe with the small backbone and drop path 0.2, as Swin's
# cascade_mask_rcnn_swin_small_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py.
# Backbone weights: checkpoints/pola_swin_small.pth.
_base_ = ['./cascade-mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py']

model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_small.pth')))
