# Mask R-CNN + FPN with FLatten-CSWin-T on COCO 2017, 3x schedule (36 epochs) with multi-scale training and
# random crops, 8 GPUs x 2 images: ./mask-rcnn_flatten-cswin-t_fpn_ms-crop-1x_coco.py on Swin's 3x schedule
# (SwinTransformer/Swin-Transformer-Object-Detection
# configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_3x_coco.py, the recipe of mmpola's
# ../mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py): steps at epochs 27 and 33, drop path 0.2 as Swin-T's.
# Every number and its source: docs/recipes.md.
_base_ = ['./mask-rcnn_flatten-cswin-t_fpn_ms-crop-1x_coco.py']

model = dict(backbone=dict(drop_path_rate=0.2))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1),
]
