# Mask R-CNN + FPN with FLatten-CSWin-T on COCO 2017, 1x schedule (12 epochs) with multi-scale training and
# random crops, 8 GPUs x 2 images. microsoft/CSWin-Transformer publishes no detection configs (its README
# reports Mask R-CNN 3x results, compared with Swin's), so this is Swin's Mask R-CNN recipe
# (SwinTransformer/Swin-Transformer-Object-Detection
# configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_1x_coco.py, the recipe of mmpola's
# ../mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py) with the CSWin-T backbone with the focused linear attention
# of FLatten Transformer (ICCV 2023) in stages 1-2, drop path 0.1 as Swin-T's; the backbone's output norms
# norm1..norm4 are the official dense CSWin's. Every number and its source: docs/recipes.md.
#
# Backbone weights: the official FLatten-CSWin-T ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../_base_/mask-rcnn_fpn_ms-crop-3x.py', '../../_base_/models/flatten_cswin_tiny.py']

# the shared FLatten-CSWin-T backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))

# Swin's 1x schedule instead of the base's 3x
max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
