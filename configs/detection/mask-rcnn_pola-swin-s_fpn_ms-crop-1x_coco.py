# Mask R-CNN + FPN with Pola-Swin-S on COCO 2017, 1x multi-scale-crop schedule: the Pola-Swin-T 1x
# recipe with the small backbone (depths 2-2-18-2). Swin's detection repository has no Swin-S 1x
# Mask R-CNN; drop path 0.2 is its Swin-S value (the 3x configs). Backbone weights:
# checkpoints/pola_swin_small.pth (see the Pola-Swin-T config).
_base_ = ['./mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py']

model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_small.pth')))
